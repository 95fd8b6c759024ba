"""The TopOSM wire (docs/tiles.md, "The TopOSM protocol"): its exchange and reply queues, for every program
that speaks it (the names are the TopOSM contract's, ``contract``).

All communication is on the topic exchange ``osm``; expirations go to ``expire_toposm``; every program
listens on ``toposm`` (``AllProgramsTopic``); render threads listen on every level of
``toposm.render.<host>.<pid>.<id>``. Commands carry a ``reply_to`` that is a *queue* the sender consumes
from: answers go there through the default exchange. The protocol lets a program name that queue as it likes,
so any name is answered but the bus's own queues (``ReplyQueues``), which the default exchange would reach
by name too. A program written from the text alone is read tolerantly: fields we do not know are ignored
(``known_params``), never a reason to refuse it (docs/tiles.md, "The TopOSM wire").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import orjson
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractIncomingMessage
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from pydantic import BaseModel

from qbroker import Config, Unit
from qbroker.topology import topic_exchange
from qbroker.topology_check import ensure_shared
from qbroker.transport import Connection

from .contract import ALL_PROGRAMS, CLIENT_REPLY_PREFIX, OSM_EXCHANGE, Command

log = structlog.get_logger("toposm.seed_wire")

TOPOSM_NAMESPACE = ALL_PROGRAMS + "."  # the queuemaster's osm queue, render threads' names: ours, not a client's


class ReplyQueues:
    """Which ``reply_to`` an answer on the ``osm`` wire may go to: any queue the requester could have declared
    itself (``myprogram``, a broker-named ``amq.gen-...``, ``toposm.reply.<word>``), never the bus's own:
    qbroker's request, reply and alert queues (``rpc_*``, ``reply_*``, ``alert_*``), its dead-letter queues
    (``dead``, ``dead.kept``) and everything in its ``qbroker.`` namespace (retry queues, schedules), with the
    deployment's exchange prefix and without it (the default bus may share the vhost); and the TopOSM
    namespace ``toposm`` / ``toposm.*`` (the queuemaster's osm queue, render threads) but for
    ``toposm.reply.*``. An answer published there would land in a queue that some service consumes or that
    keeps what lands: the relay the refusal stops."""

    def __init__(self, config: Config | None = None) -> None:
        config = config or Config()
        self._starts: list[tuple[str, str]] = []
        self._exact: dict[str, str] = {ALL_PROGRAMS: "toposm"}
        for prefix in dict.fromkeys((config.exchange_prefix, "")):
            self._starts += [(f"{prefix}{kind}_", kind) for kind in ("rpc", "reply", "alert")]
            self._starts.append((f"{prefix}qbroker.", "qbroker"))
            self._exact[prefix + config.dead_queue] = "dead"
            self._exact[prefix + config.dead_kept_queue] = "dead.kept"

    def bus_queue(self, name: str) -> str | None:
        """The kind of bus queue ``name`` is (``rpc``, ``reply``, ``alert``, ``dead``, ``dead.kept``,
        ``qbroker``, ``toposm``), or None for a queue a client may have declared."""
        if name in self._exact:
            return self._exact[name]
        if name.startswith(TOPOSM_NAMESPACE) and not name.startswith(CLIENT_REPLY_PREFIX):
            return "toposm"
        return next((kind for start, kind in self._starts if name.startswith(start)), None)


def known_params(model: type[BaseModel], params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The fields of ``params`` that ``model`` knows (validated by it as usual), and the names of the rest,
    which the ``osm`` wire ignores: ``{"command": ..., <parameters>}`` leaves a program free to send more."""
    known = model.model_fields.keys()
    return {k: v for k, v in params.items() if k in known}, [k for k in params if k not in known]


# The one declaration of `osm` (docs/tiles.md): `qbroker provision` declares it so, a unit finds it
# (declaring it only where its account may, on a bus without accounts), and what differs is named with its cost.
OSM = topic_exchange(
    OSM_EXCHANGE,
    costs={
        "durable": "it is gone after a broker restart with its bindings (the queuemaster's durable queue then misses "
        "what is published on osm) until a program declares it again; a TopOSM program declares it durable "
        "or passively (docs/tiles.md)"
    },
)


async def declare_osm_exchange(connection: AbstractConnection) -> tuple[AbstractChannel, AbstractExchange]:
    """A channel and the ``osm`` topic exchange: found (or declared where the account may) as ``OSM`` says,
    or used as it is when another program declared it otherwise (each difference logged with its cost).
    Missing on a bus whose accounts may not declare it: TopologyMissing, naming it and ``qbroker provision``."""
    await ensure_shared(cast(Connection, connection), [OSM], log)
    channel = await connection.channel()
    return channel, await channel.get_exchange(OSM_EXCHANGE, ensure=False)


def seed_command(body: bytes) -> dict[str, Any] | None:
    """A TopOSM command (a JSON object with a string ``command``), or None for anything else."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) and isinstance(parsed.get("command"), str) else None


class OsmListener:
    """A program's own queue on ``osm``, as any program of the TopOSM protocol has one: broker-named and
    exclusive (gone with the connection, which is how the queuemaster tells a render thread died), bound to
    ``keys`` (``toposm`` for every program). ``unit.on_connected(listener.declare)``; every message is acked
    after ``handle``, whatever it does (a failure is logged: one bad message must not stop the consumer).
    ``queue_name`` is the queue, the ``reply_to`` of what the program sends on this wire; ``exchange``
    publishes there."""

    def __init__(
        self, keys: Sequence[str], handle: Callable[[AbstractIncomingMessage], Awaitable[None]], *, prefetch: int = 64
    ) -> None:
        self.keys = list(keys)
        self._handle = handle
        self._prefetch = prefetch
        self.queue_name: str | None = None
        self.exchange: AbstractExchange | None = None

    async def declare(self, transport_connection: Connection) -> None:
        channel, exchange = await declare_osm_exchange(cast(AbstractConnection, transport_connection))
        await channel.set_qos(prefetch_count=self._prefetch)
        queue = await channel.declare_queue("", exclusive=True)
        for key in self.keys:
            await queue.bind(exchange, routing_key=key)
        self.queue_name, self.exchange = queue.name, exchange
        await queue.consume(self._on_message)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            await self._handle(message)
        except Exception:
            log.exception("osm message failed", routing_key=message.routing_key)
        finally:
            await message.ack()


# The label a command heard on `toposm` is counted under: the protocol's own, else "other" (labels stay bounded).
OTHER_COMMAND = "other"


class AllProgramsTopic:
    """Listen on ``toposm``, where the protocol says every running program listens, on both wires: qbroker's
    ``alert`` exchange and a queue of the unit's own on ``osm``. Each command heard there (a JSON object
    with a string ``command``) is logged and counted (``heard``, by command: ``queuemaster online``, the one
    the protocol defines there, or ``other``; with a ``registry`` also as ``toposm_program_commands``) and handed
    to ``on_command``; anything else is counted as ``other`` and dropped, never an error. Built before
    ``unit.start()``."""

    def __init__(
        self,
        unit: Unit,
        on_command: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._on_command = on_command
        self.heard: Counter[str] = Counter()
        self._metric = (
            PromCounter(
                "toposm_program_commands",
                "Commands heard on `toposm` (where every program "
                "listens), by command: the protocol's `queuemaster online`, or other",
                ["command"],
                registry=registry,
            )
            if registry is not None
            else None
        )
        if self._metric is not None:
            for label in (Command.QUEUEMASTER_ONLINE.value, OTHER_COMMAND):
                self._metric.labels(label)
        unit.on_alert(ALL_PROGRAMS)(self._on_alert)
        self.listener = OsmListener([ALL_PROGRAMS], self._on_osm)
        unit.on_connected(self.listener.declare)

    async def _on_alert(self, body: Any) -> None:
        await self._heard(body if isinstance(body, dict) and isinstance(body.get("command"), str) else None, "alert")

    async def _on_osm(self, message: AbstractIncomingMessage) -> None:
        await self._heard(seed_command(message.body), "osm")

    async def _heard(self, command: dict[str, Any] | None, wire: str) -> None:
        name = command["command"] if command is not None else None
        label = Command.QUEUEMASTER_ONLINE.value if name == Command.QUEUEMASTER_ONLINE else OTHER_COMMAND
        self.heard[label] += 1
        if self._metric is not None:
            self._metric.labels(label).inc()
        log.info("heard on toposm", command=str(name)[:64] if name is not None else None, wire=wire)
        if command is not None and self._on_command is not None:
            await self._on_command(command)


def hear_all_programs(unit: Unit, on_command: Callable[[dict[str, Any]], Awaitable[None]]) -> OsmListener:
    """``AllProgramsTopic(unit, on_command)``; its osm listener."""
    return AllProgramsTopic(unit, on_command).listener
