"""The unit's side of the exchanges and queues: the shared ones found at connect, its own declared.

The shared exchanges and queues (``rpc``, ``reply``, ``alert``, ``dead``, ``dead.kept``: ``qbroker.topology``)
are found, or declared where the account may, by ``ensure_topology`` (``qbroker.topology_check``); the
publishing channel then only names them. A unit's own queues (``reply_<uuid>``, ``alert_<uuid>``) and a
server's ``rpc_<name>`` are declared here; ``rpc_<name>`` may be shared with servers of another program (the
original QBroker declares it non-durable, auto-deleted, with a message TTL), so it is used as it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from structlog.typing import FilteringBoundLogger

from qbroker.config import Config
from qbroker.errors import TopologyMissing
from qbroker.topology import Shared, shared_topology
from qbroker.topology_check import TopologyProbe, ensure_shared, warn_differences
from qbroker.transport import Channel, Connection, Exchange, Queue


@dataclass(frozen=True)
class Exchanges:
    rpc: Exchange
    reply: Exchange
    alert: Exchange
    dead: Exchange


async def ensure_topology(
    connection: Connection, config: Config, log: FilteringBoundLogger, channel: Channel | None = None
) -> None:
    """The shared exchanges and queues are there (TopologyMissing names what is not; see topology_check),
    found on ``channel`` unless the broker refuses something there (it is closed then)."""
    await ensure_shared(connection, shared_topology(config), log, channel)


async def open_exchanges(channel: Channel, config: Config) -> Exchanges:
    """The four exchanges on ``channel``, by name: ``ensure_topology`` found them (no round trip here)."""
    rpc, reply, alert, dead = [
        await channel.get_exchange(config.exchange_name(role), ensure=False)
        for role in ("rpc", "reply", "alert", "dead")
    ]
    return Exchanges(rpc=rpc, reply=reply, alert=alert, dead=dead)


def rpc_queue_arguments(
    config: Config, *, max_priority: int | None, single_active: bool, expires: bool = True, exclusive: bool = False
) -> dict[str, Any]:
    """Arguments of ``rpc_<name>``: expired or rejected requests are dead-lettered to ``dead``; the
    queue itself goes ``rpc_queue_expiry`` seconds after its last consumer (see Config). A shared one is a
    quorum queue when the config says so, unless it has priorities (``Config.queue_type``)."""
    args: dict[str, Any] = {"x-dead-letter-exchange": config.exchange_name("dead")}
    if not exclusive and not max_priority:
        args.update(config.durable_queue_type())
    if expires and config.rpc_queue_expiry is not None:
        args["x-expires"] = max(1, round(config.rpc_queue_expiry * 1000))
    if max_priority:
        args["x-max-priority"] = max_priority
    if single_active:
        args["x-single-active-consumer"] = True
    return args


def rpc_queue(config: Config, name: str, *, max_priority: int | None, single_active: bool) -> Shared:
    """``rpc_<name>`` as a shared queue of every server of ``name``, bound to ``rpc`` by the name. What an
    endpoint asked for (priorities, one active consumer) it cannot do without; the rest it can."""
    required: dict[str, tuple[Any, ...]] = {}
    if max_priority:
        required["x-max-priority"] = (max_priority,)
    if single_active:
        required["x-single-active-consumer"] = (True,)
    return Shared(
        config.queue_name("rpc", name),
        arguments=rpc_queue_arguments(config, max_priority=max_priority, single_active=single_active),
        bindings=((config.exchange_name("rpc"), name),),
        required=required,
    )


async def declare_rpc_queue(
    connection: Connection,
    channel: Channel,
    config: Config,
    name: str,
    *,
    log: FilteringBoundLogger,
    exclusive: bool = False,
    max_priority: int | None = None,
    single_active: bool = False,
) -> Queue:
    """``rpc_<name>`` on ``channel``, bound. Shared by every server of ``name``: as it exists, if it exists
    with other settings (found on a throwaway channel, each difference logged with its cost); per-instance
    endpoints are exclusive."""
    rpc = config.exchange_name("rpc")
    if exclusive:
        queue = await channel.declare_queue(
            config.queue_name("rpc", name),
            durable=False,
            exclusive=True,
            auto_delete=True,
            arguments=rpc_queue_arguments(
                config, max_priority=max_priority, single_active=single_active, expires=False, exclusive=True
            ),
        )
        await queue.bind(rpc, routing_key=name)
        return queue
    probe = TopologyProbe(connection, log)
    try:
        declared = await probe.declare(rpc_queue(config, name, max_priority=max_priority, single_active=single_active))
    finally:
        await probe.close()
    if declared is None:
        raise TopologyMissing(
            f"queue {config.queue_name('rpc', name)!r} is missing and this account may not "
            "declare it: its role does not serve the name"
        )
    warn_differences(log, declared.differences)
    shared = declared.shared
    queue = await channel.declare_queue(
        shared.name,
        durable=shared.durable,
        auto_delete=shared.auto_delete,
        passive=not declared.repeatable,
        arguments=dict(shared.arguments),
    )
    await queue.bind(rpc, routing_key=name)
    return queue


async def declare_unit_queue(channel: Channel, config: Config, kind: Literal["reply", "alert"], uuid: str) -> Queue:
    """``reply_<uuid>`` / ``alert_<uuid>``: the unit's own non-persistent queues (a durable reply queue when
    ``config.durable_reply_queue``: see Config)."""
    if kind == "reply" and config.durable_reply_queue:
        return await channel.declare_queue(
            config.queue_name(kind, uuid),
            durable=True,
            exclusive=False,
            auto_delete=False,
            arguments={"x-expires": int(config.reply_queue_expiry * 1000), **config.durable_queue_type()},
        )
    return await channel.declare_queue(config.queue_name(kind, uuid), durable=False, exclusive=True, auto_delete=True)
