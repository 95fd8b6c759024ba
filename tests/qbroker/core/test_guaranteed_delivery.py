"""A guaranteed request whose publish was not confirmed when its connection died is published again once
connected (the same message id), its server runs it once however many copies arrive, and the caller gets
exactly one reply (docs/semantics.md "Guaranteed requests").

The broker takes the request, its server gets it, and only then does the caller's connection die, before the
confirm reaches the caller: what happens when a RabbitMQ node dies right after delivering a message. On
RabbitMQ a TCP relay holds back what the broker sends the caller, then resets the caller's connection
(harness/tcp_relay.py); on the in-memory broker ``lose_connection_after_routing`` drops the connection right
after the request is queued. The caller's reply queue is the default exclusive one, which dies with its
connection: the first answer is lost with it, so the call is answered only through its second copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aio_pika.abc import AbstractIncomingMessage

from harness import HANG, eventually
from harness.broker import close_connections, rabbitmqctl
from harness.tcp_relay import TcpRelay
from qbroker import Config, RequestContext, Unit
from qbroker.envelope import OutgoingMessage, new_message_id
from qbroker.guaranteed import GuaranteedRequests, request_key
from qbroker.replies import Reply
from qbroker.testing import MemoryBroker

NAME = "t.guaranteed.work"
QUEUE = f"rpc_{NAME}"


@dataclass
class LostConfirm:
    server_url: str
    client_url: str  # the caller connects here
    arm: Callable[[], None]  # before the call: its confirm will not arrive
    cut: Callable[[], object]  # once its server has the request: the caller's connection dies
    messages: Callable[[], Awaitable[int]]  # the request queue's messages, ready and unacked
    drop: Callable[[], Awaitable[int]]  # every connection closed from the broker's side


@pytest.fixture
async def lost(transport: str, request: pytest.FixtureRequest) -> AsyncIterator[LostConfirm]:
    if transport == "memory":
        url = f"memory://guaranteed-{uuid.uuid4().hex[:12]}"
        broker = MemoryBroker.for_url(url)

        async def memory_count() -> int:
            info = broker.queue_info(QUEUE)
            return info.messages + info.unacked

        async def memory_drop() -> int:
            return broker.drop_connections()

        yield LostConfirm(
            url, url, lambda: broker.lose_connection_after_routing(NAME), lambda: None, memory_count, memory_drop
        )
        MemoryBroker.discard(broker.name)
        return
    amqp_url = request.getfixturevalue("amqp_url")
    vhost = request.getfixturevalue("vhost")
    relay = await TcpRelay(amqp_url).start()

    def rabbitmq_count() -> int:
        out = rabbitmqctl("list_queues", "-p", vhost, "-q", "--no-table-headers", "name", "messages").stdout
        return next((int(line.split()[1]) for line in out.splitlines() if line.split()[:1] == [QUEUE]), 0)

    try:
        yield LostConfirm(
            amqp_url,
            relay.url,
            relay.hold_replies,
            relay.reset,
            lambda: asyncio.to_thread(rabbitmq_count),
            lambda: asyncio.to_thread(close_connections, vhost),
        )
    finally:
        await relay.close()


def _config(url: str, **extra: bool) -> Config:
    return Config(url=url, reconnect_backoff_max=0.2, connect_timeout=5, **extra)


@pytest.fixture
async def units(lost: LostConfirm) -> AsyncIterator[tuple[Unit, Unit]]:
    server, client = (
        Unit("test.server", config=_config(lost.server_url)),
        Unit("test.client", config=_config(lost.client_url)),
    )
    yield server, client
    for unit in (client, server):
        await unit.stop(drain_timeout=1)


def _doubling(server: Unit, release: asyncio.Event | None = None) -> tuple[list[str | None], asyncio.Event]:
    """``server`` serves NAME: twice its ``n``, once ``release`` is set if given. Returns the message ids run,
    and the event set as a run starts."""
    runs: list[str | None] = []
    started = asyncio.Event()

    @server.rpc(NAME)
    async def work(n: int, ctx: RequestContext) -> int:
        runs.append(ctx.message_id)
        started.set()
        if release is not None:
            await release.wait()
        return n * 2

    return runs, started


async def test_a_call_whose_confirm_was_lost_is_published_again_and_answered_from_the_first_run(
    lost: LostConfirm, units: tuple[Unit, Unit]
) -> None:
    server, client = units
    runs, got = _doubling(server)
    await server.start()
    await client.start()
    lost.arm()
    call = asyncio.ensure_future(client.call(NAME, {"n": 21}, timeout=HANG, guarantee=True))
    await asyncio.wait_for(got.wait(), HANG)
    await eventually(lambda: _empty(lost))  # answered and acked
    lost.cut()
    assert await asyncio.wait_for(call, HANG) == 42
    await eventually(lambda: _empty(lost))  # both copies acked
    assert len(runs) == 1, runs  # the second copy was answered without running again
    assert await client.call(NAME, {"n": 1}, timeout=HANG, guarantee=True) == 2  # and the bus works on


async def test_a_copy_that_arrives_while_the_first_runs_waits_for_its_outcome(
    lost: LostConfirm, units: tuple[Unit, Unit]
) -> None:
    server, client = units
    release = asyncio.Event()
    runs, started = _doubling(server, release)
    await server.start()
    await client.start()
    lost.arm()
    call = asyncio.ensure_future(client.call(NAME, {"n": 4}, timeout=HANG, guarantee=True))
    await asyncio.wait_for(started.wait(), HANG)
    lost.cut()

    async def copy_there() -> bool:  # the copy published again is with the server too (or the call ended)
        return call.done() or await lost.messages() == 2

    await eventually(copy_there)
    assert not call.done(), await call
    release.set()
    assert await asyncio.wait_for(call, HANG) == 8
    await eventually(lambda: _empty(lost))
    assert len(runs) == 1, runs


async def test_a_guaranteed_cast_whose_confirm_was_lost_runs_once(lost: LostConfirm, units: tuple[Unit, Unit]) -> None:
    server, client = units
    runs: list[int] = []
    got = asyncio.Event()

    @server.rpc(NAME)
    async def work(n: int) -> None:
        runs.append(n)
        got.set()

    await server.start()
    await client.start()
    lost.arm()
    cast = asyncio.ensure_future(client.cast(NAME, {"n": 5}, guarantee=True))
    await asyncio.wait_for(got.wait(), HANG)
    lost.cut()
    await asyncio.wait_for(cast, HANG)  # returns once the copy is confirmed, instead of raising connection_lost
    await eventually(lambda: _empty(lost))
    assert runs == [5]


async def test_a_copy_does_not_wait_for_a_run_that_went_with_its_connection(
    lost: LostConfirm, units: tuple[Unit, Unit]
) -> None:
    """The first run goes on after its connection closed (a handler that does not stop when cancelled); the
    request delivered again on the server's new connection is served, not held behind that run. When that run
    ends, its request cannot be settled on the closed channel: nothing more happens (it used to reach the
    consumer's guard, which answered the caller a second time, with ``internal_error``)."""
    server, _ = units
    runs: list[str | None] = []
    stuck, release = asyncio.Event(), asyncio.Event()

    @server.rpc(NAME)
    async def work(n: int, ctx: RequestContext) -> dict[str, int]:
        runs.append(ctx.message_id)
        if len(runs) == 1:
            stuck.set()
            while not release.is_set():  # not before the test ends: a handler that swallows its cancel
                with contextlib.suppress(asyncio.CancelledError):
                    await release.wait()
        return {"n": n, "runs": len(runs)}

    # A durable reply queue: the answer may come before the caller has reconnected.
    client = Unit("test.client", config=_config(lost.server_url, durable_reply_queue=True))
    await server.start()
    await client.start()
    try:
        call = asyncio.ensure_future(client.call(NAME, {"n": 3}, timeout=HANG, guarantee=True))
        await asyncio.wait_for(stuck.wait(), HANG)
        assert await lost.drop() >= 2
        answer = await asyncio.wait_for(call, HANG)
        assert answer["n"] == 3 and answer["runs"] >= 2, answer
        assert len(set(runs)) == 1, runs
        failed: list[BaseException] = []
        settle_failed = server.bus.settle_failed

        async def observed(message: AbstractIncomingMessage, exc: BaseException, **how: Any) -> None:
            failed.append(exc)
            await settle_failed(message, exc, **how)

        server.bus.settle_failed = observed  # type: ignore[method-assign]
        release.set()
        await server.stop(drain_timeout=HANG)  # returns once the first run's delivery is done with
        assert failed == []
    finally:
        release.set()
        await client.stop(drain_timeout=1)


async def test_copies_run_once_but_a_forged_copy_is_a_request_of_its_own(
    lost: LostConfirm, units: tuple[Unit, Unit]
) -> None:
    """Two copies of one guaranteed request (what a caller's second publish makes) run once and are each
    answered; a third message reusing the message id with another body (or sent by anyone but the caller,
    to another reply-to) neither reads the first one's answer nor keeps it from running."""
    server, client = units
    runs: list[int] = []

    @server.rpc(NAME)
    async def work(n: int) -> int:
        runs.append(n)
        return n * 2

    await server.start()
    await client.start()
    bus = client.bus
    message_id = new_message_id()
    replies = bus.pending.open_gather(message_id)

    def request(n: int) -> OutgoingMessage:
        return bus.make_message(
            {"n": n},
            kind="rpc",
            name=NAME,
            message_id=message_id,
            reply_to=bus.uuid,
            deadline=time.time() + HANG,
            persistent=True,
        )

    for message in (request(1), request(1), request(2)):
        await bus.publish("rpc", NAME, message)
    answers: list[Reply | BaseException] = [await asyncio.wait_for(replies.get(), HANG) for _ in range(3)]
    bus.pending.close_gather(message_id)
    assert sorted(a.body for a in answers if isinstance(a, Reply)) == [2, 2, 4], answers
    assert sorted(runs) == [1, 2], runs


async def _empty(lost: LostConfirm) -> bool:
    return await lost.messages() == 0


async def test_a_server_keeps_a_bounded_number_of_answers_each_until_its_deadline() -> None:
    """A flood of guaranteed requests cannot grow a server's memory of answers: the oldest go first, and
    an answer is forgotten once its request's deadline (and the slack) has passed."""
    kept = GuaranteedRequests(max_kept=2, slack=0.0)
    keys = [request_key(NAME, new_message_id(), "guest", "caller", "application/json", b"{}") for _ in range(3)]
    for n, key in enumerate(keys):
        kept.finish(key, kept.start(key), (n, None), time.time() + HANG)
    assert len(kept) == 2 and kept.kept(keys[0]) is None and kept.kept(keys[2]) == (2, None)
    late = request_key(NAME, new_message_id(), "guest", "caller", "application/json", b"{}")
    kept.finish(late, kept.start(late), ("late", None), time.time() - 1)
    assert kept.kept(late) is None
    assert kept.running(late) is None
