"""Our own exclusive, auto-delete queues and their bindings (never a service's queue).

One *traffic* queue carries ``rpc``, ``reply`` and ``alert`` bindings: a single queue keeps the broker's
routing order, so a request is always seen before its reply. A separate *dead* queue is bound to the
``dead`` fanout, so a message there is known to be dead whatever exchange it was first published to.
In firehose mode one queue is bound to ``amq.rabbitmq.trace`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from qbroker.cli.snoop.directory import Desired
from qbroker.transport import Channel, Connection, Queue

TRACE_EXCHANGE = "amq.rabbitmq.trace"
# A debugger that falls behind must not grow the broker's memory without bound; the oldest
# captured messages are dropped first (they are our copies, never the service's).
QUEUE_ARGUMENTS: dict[str, Any] = {"x-max-length": 100_000, "x-overflow": "drop-head"}

Deliver = Callable[[AbstractIncomingMessage, str], Awaitable[None]]


class SnoopQueues:
    def __init__(
        self, exchange_names: dict[str, str], queue_prefix: str, deliver: Deliver, debuggers_queue: str | None = None
    ) -> None:
        self._exchange = exchange_names  # role -> real (prefixed) exchange name
        self._prefix = queue_prefix
        self._debuggers_queue = debuggers_queue
        self._deliver = deliver
        self._lock = asyncio.Lock()
        self._bound: dict[str, set[str]] = {"rpc": set(), "alert": set(), "reply": set()}
        self.channel: Channel | None = None
        self.queues: list[Queue] = []
        self.traffic: Queue | None = None

    @property
    def names(self) -> list[str]:
        return [q.name for q in self.queues]

    async def open(self, connection: Connection, *, firehose: bool, desired: Desired) -> None:
        """Declare our queues on a (new) connection and bind what ``desired`` asks for."""
        async with self._lock:
            self.channel = await connection.channel()
            await self.channel.set_qos(prefetch_count=500)
            self.queues = []
            self._bound = {"rpc": set(), "alert": set(), "reply": set()}
            if firehose:
                trace = await self._declare("firehose")
                await trace.bind(TRACE_EXCHANGE, routing_key="publish.#")
                await trace.consume(self._consumer("firehose"), no_ack=True)
                return
            self.traffic = await self._declare("traffic")
            dead = await self._declare("dead")
            await dead.bind(self._exchange["dead"])
            await self._sync(desired)
            await self.traffic.consume(self._consumer("traffic"), no_ack=True)
            await dead.consume(self._consumer("dead"), no_ack=True)
            if self._debuggers_queue:
                # Shared by every debugger, never deleted by us (auto-delete when the last one goes):
                # its consumer count tells a starting unit how many debuggers to wait for.
                roll_call = await self.channel.declare_queue(self._debuggers_queue, durable=False, auto_delete=True)
                await roll_call.consume(_ignore, no_ack=True)

    async def _declare(self, suffix: str) -> Queue:
        assert self.channel is not None
        queue = await self.channel.declare_queue(
            f"{self._prefix}{suffix}", exclusive=True, auto_delete=True, durable=False, arguments=dict(QUEUE_ARGUMENTS)
        )
        self.queues.append(queue)
        return queue

    def _consumer(self, source: str) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
        async def on_message(message: AbstractIncomingMessage) -> None:
            await self._deliver(message, source)

        return on_message

    async def sync(self, desired: Desired) -> None:
        """Bind new routing keys, unbind the ones nobody needs any more."""
        async with self._lock:
            await self._sync(desired)

    async def _sync(self, desired: Desired) -> None:
        if self.traffic is None or self.channel is None or self.channel.is_closed:
            return
        for role in ("rpc", "alert", "reply"):
            want, have = desired.keys(role), self._bound[role]
            for key in sorted(want - have):
                await self.traffic.bind(self._exchange[role], routing_key=key)
                have.add(key)
            for key in sorted(have - want):
                await self.traffic.unbind(self._exchange[role], routing_key=key)
                have.discard(key)

    def bound(self, role: str) -> set[str]:
        return set(self._bound[role])

    async def close(self) -> None:
        """Delete our queues explicitly (exclusive queues would also go with the connection)."""
        async with self._lock:
            for queue in self.queues:
                try:
                    await queue.delete(if_unused=False, if_empty=False)
                except Exception:  # connection already gone: the broker deletes exclusive queues itself
                    break
            self.queues = []
            self.traffic = None
            if self.channel is not None and not self.channel.is_closed:
                # Best effort: the unit's connection close right after removes the channel anyway.
                with contextlib.suppress(Exception):
                    await self.channel.close()
            self.channel = None


async def _ignore(message: AbstractIncomingMessage) -> None:
    """Nothing is ever sent to the roll-call queue; consuming it is the point."""


def describe_bindings(queues: SnoopQueues) -> dict[str, Any]:
    return {role: sorted(queues.bound(role)) for role in ("rpc", "alert", "reply")}
