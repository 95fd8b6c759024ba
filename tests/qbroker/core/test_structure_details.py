"""The structure's last details: a request's ``name`` matches its routing key; a ``debug`` request's reply
includes debugging information; every error names its ``part``; a JSON body is JSON, always; and what the
original QBroker writes differently (``routing-key`` for ``name``) is read."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from qbroker import RequestFailed, Unit
from qbroker.envelope import build_message, new_message_id
from qbroker.original_dialect import ROUTING_KEY_HEADER
from qbroker.replies import Reply
from qbroker.rpc import call
from tests.conftest import MakeUnit


async def _send(
    client: Unit,
    routing_key: str,
    name: str | None,
    body: Any = None,
    *,
    headers: dict[str, Any] | None = None,
    debug: bool = False,
) -> Reply:
    """A request published with ``routing_key`` whose header says ``name`` (None: no ``name`` header)."""
    message_id = new_message_id()
    message = client.bus.make_message(
        body, kind="rpc", name=name or routing_key, message_id=message_id, reply_to=client.uuid, debug=debug
    )
    if name is None:
        del message.headers["name"]
    message.headers.update(headers or {})
    reply = client.bus.pending.expect(message_id)
    try:
        await client.bus.publish("rpc", routing_key, message)
        return await asyncio.wait_for(reply, 30)
    finally:
        client.bus.pending.forget(message_id)


async def _pair(make_unit: MakeUnit) -> tuple[Unit, Unit]:
    server = await make_unit("test.server")

    @server.rpc("t.echo")
    async def echo(body: Any = None) -> Any:
        return body

    @server.rpc("t.refuse")
    async def refuse() -> None:
        raise RequestFailed("not_today", "refused on purpose")

    @server.rpc("t.unencodable")
    async def unencodable() -> Any:
        return object()

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    return server, client


async def test_a_request_named_otherwise_than_its_routing_key_is_refused(make_unit: MakeUnit) -> None:
    _, client = await _pair(make_unit)
    reply = await _send(client, "t.echo", "something.else", {"a": 1})
    assert reply.error is not None and (reply.error.status, reply.error.id) == ("fail", "bad_header")
    assert reply.error.part == "t.echo"
    assert "'something.else'" in (reply.error.detail or "") and "'t.echo'" in (reply.error.detail or "")
    # The original QBroker's header: ``routing-key`` stands for a missing ``name`` (and must match too).
    assert (await _send(client, "t.echo", None, {"a": 2}, headers={ROUTING_KEY_HEADER: "t.echo"})).body == {"a": 2}
    wrong = await _send(client, "t.echo", None, {"a": 3}, headers={ROUTING_KEY_HEADER: "t.other"})
    assert wrong.error is not None and wrong.error.id == "bad_header"
    assert await client.call("t.echo", {"a": 4}) == {"a": 4}


async def test_a_retried_request_keeps_its_name_and_is_served(make_unit: MakeUnit) -> None:
    """A retry comes back from qbroker.retry.<ms>.<name>: the name still matches the endpoint."""
    server = await make_unit("test.retrier")
    tries = 0

    @server.rpc("t.flaky", retries=2, retry_delay=0.05)
    async def flaky() -> int:
        nonlocal tries
        tries += 1
        if tries < 2:
            raise TimeoutError("not yet")
        return tries

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.flaky", timeout=30) == 2


async def test_debug_replies_include_debugging_information(make_unit: MakeUnit) -> None:
    server, client = await _pair(make_unit)
    ok = await call(client.bus, "t.echo", {"x": 1}, timeout=30, debug=True)
    assert ok.error is None and ok.body == {"x": 1}
    info = ok.debug_info
    assert info is not None and (info["app"], info["uuid"], info["part"]) == ("test.server", server.uuid, "t.echo")
    assert info["pid"] > 0 and info["host"] and info["handler_us"] >= 0 and info["redelivered"] is False
    # A ``fail`` reply: who refused it, and where in the handler.
    refused = await call(client.bus, "t.refuse", None, timeout=30, debug=True)
    assert refused.error is not None and refused.error.status == "fail" and refused.debug_info is not None
    assert refused.error.trace is not None and "refused on purpose" in refused.error.trace
    # Refused before any handler ran (the header is wrong): still who refused it.
    early = await _send(client, "t.echo", "t.not.this", debug=True)
    assert early.error is not None and early.error.id == "bad_header"
    assert early.debug_info is not None and early.debug_info["uuid"] == server.uuid
    assert "handler_us" not in early.debug_info
    # Without debug, none of it.
    plain = await call(client.bus, "t.echo", {"x": 2}, timeout=30)
    assert plain.debug_info is None
    refused_plain = await call(client.bus, "t.refuse", None, timeout=30)
    assert refused_plain.error is not None and refused_plain.error.trace is None


async def test_every_error_names_its_part(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server", max_body_bytes=4096)

    @server.rpc("t.unencodable")
    async def unencodable() -> Any:
        return object()

    @server.rpc("t.huge")
    async def huge() -> str:
        return "x" * 10_000

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    bad = await call(client.bus, "t.unencodable", None, timeout=30)
    assert bad.error is not None and (bad.error.id, bad.error.part) == ("bad_result", "t.unencodable")
    big = await call(client.bus, "t.huge", None, timeout=30)
    assert big.error is not None and (big.error.id, big.error.part) == ("reply_too_large", "t.huge")


def test_a_json_body_is_json_always() -> None:
    """No empty body under application/json: a peer that decodes it (the original QBroker) dies of one."""
    for kind in ("rpc", "reply", "alert"):
        message = build_message(None, kind=kind, app_id="u", app="a", message_id="m", name="n")  # type: ignore[arg-type]
        assert (message.content_type, message.body) == ("application/json", b"null")
    request = build_message({"a": 1}, kind="rpc", app_id="u", app="a", message_id="m", name="t.x")
    assert request.headers["name"] == request.headers[ROUTING_KEY_HEADER] == "t.x"  # both peers' names for it


async def test_error_and_dead_letter_replies_carry_a_json_body(make_unit: MakeUnit) -> None:
    """Captured as sent: the error reply of a handler and the dead-letter collector's answer are ``null``."""
    server, client = await _pair(make_unit)
    bodies: list[tuple[str | None, bytes]] = []
    deliver = client.bus._deliver

    def capture(reply: Reply, message: Any) -> None:
        bodies.append((message.content_type, bytes(message.body)))
        deliver(reply, message)

    client.bus._deliver = capture  # type: ignore[method-assign]
    with pytest.raises(RequestFailed):
        await client.call("t.refuse")
    with pytest.raises(RequestFailed):
        await client.call("t.nobody.serves.this")
    assert bodies == [("application/json", b"null")] * 2
