"""An error element too large for an AMQP header frame: RabbitMQ closes the whole connection that publishes it
(FRAME_ERROR frame_too_large; frame_max is 128 KiB and the error element travels in the headers), so a client
that made a server quote 200 KB of its request in an error (an unknown command's name, a field name a model
forbids) cut the server's connection with one call: its consumers, reply queue and requests in hand."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from harness import HANG
from qbroker import InvalidParams, RequestFailed, UnknownCommand
from qbroker.errors import MAX_ERROR_TEXT


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 0


async def test_a_quoted_request_never_cuts_the_servers_connection(make_unit: Any) -> None:
    server = await make_unit("test.quoting")
    endpoint = server.commands("test.quoting")

    @endpoint.command("known")
    async def known(request: Strict) -> int:
        return request.n

    @server.rpc("test.echo_error")
    async def echo_error(text: str) -> None:
        raise RequestFailed("told", text, detail=text)

    await server.start()
    connection = server.bus.connection
    client = await make_unit("test.quoting.client")
    await client.start()
    huge = "x" * 200_000
    with pytest.raises(UnknownCommand) as unknown:
        await client.call("test.quoting", {"command": huge}, timeout=HANG)
    with pytest.raises(InvalidParams) as invalid:
        await client.call("test.quoting", {"command": "known", huge: 1}, timeout=HANG)
    with pytest.raises(RequestFailed) as told:
        await client.call("test.echo_error", {"text": "é" * 200_000}, timeout=HANG)  # 2 bytes a character
    for error in (unknown.value, invalid.value, told.value):
        assert len(error.message) <= MAX_ERROR_TEXT and len(error.detail or "") <= MAX_ERROR_TEXT, error.id
    assert told.value.message.startswith("éé") and told.value.message.endswith("…")
    assert await client.call("test.quoting", {"command": "known", "n": 7}, timeout=HANG) == 7
    assert server.bus.connection is connection  # never lost


@pytest.mark.rabbitmq_only
async def test_a_request_whose_headers_nearly_fill_a_frame_cuts_no_connection(make_unit: Any, amqp_url: str) -> None:
    """A hostile client publishes requests whose headers take 130.9 KB of the 128 KiB frame (legal: the
    broker takes them), to a name nobody serves and to one whose server retries. The dead-letter collector's
    kept copy and the server's retry copy each add a few headers: past the frame, RabbitMQ closed the
    copier's connection, the request went back to its queue unacked and was taken again, so every unit on
    the bus (each collects dead letters) lost its connection over and over. The copies leave out what does
    not fit; each caller is answered once and no connection is lost."""
    import uuid

    import aio_pika

    from harness import eventually
    from qbroker import RequestError

    server = await make_unit("test.padded")
    tries: list[int] = []

    @server.rpc("test.padded.flaky", retries=1, retry_delay=0.05)
    async def flaky() -> None:
        tries.append(1)
        raise RequestError("flaky", "try again")

    await server.start()
    connection = server.bus.connection
    collector = server.dead_letters
    assert collector is not None
    raw = await aio_pika.connect(amqp_url)
    try:
        channel = await raw.channel()
        me = uuid.uuid4().hex  # a reply queue as the seed has one: bound to `reply` under the caller's name
        replies = await channel.declare_queue(f"reply_{me}", exclusive=True)
        await replies.bind(server.bus.config.exchange_name("reply"), routing_key=me)
        rpc = await channel.get_exchange(server.bus.config.exchange_name("rpc"))
        for name in ("test.padded.nobody", "test.padded.flaky"):
            await rpc.publish(
                aio_pika.Message(
                    b"{}",
                    content_type="application/json",
                    message_id=uuid.uuid4().hex,
                    reply_to=me,
                    headers={"version": 1, "name": name, "pad": "x" * 130_900},
                ),
                routing_key=name,
            )
        answers: list[Any] = []
        async with replies.iterator(timeout=HANG) as it:
            async for message in it:
                await message.ack()
                answers.append((message.headers or {}).get("error", {}).get("id"))
                if len(answers) == 2:
                    break
        assert sorted(answers) == ["flaky", "no_server"], answers
        await eventually(lambda: collector.counts["kept"] >= 1 and len(tries) == 2)
    finally:
        await raw.close()
    assert server.bus.connection is connection  # never lost
    assert collector.counts["kept_failed"] == 0 and collector.counts["rpc.unroutable"] == 1
