"""The exchanges and queues a demo run declares on the broker, and their removal when it ends.

What the demo owns:

- everything under its prefix ``demo.`` (``QBROKER_EXCHANGE_PREFIX`` left as the demo sets it): the bus's
  shared objects (``qbroker.topology``: the exchanges ``demo.rpc``, ``demo.reply``, ``demo.alert``,
  ``demo.dead``, ``demo.dead.kept.in``, the queues ``demo.dead`` and ``demo.dead.kept``) and its services'
  request queues ``demo.rpc_<name>``;
- what carries no prefix, TopOSM's ``osm`` exchange and the queuemaster's ``toposm.queuemaster.osm``
  queue on it (and everything under a prefix the operator chose), only when it was absent before the run
  started: other programs on the vhost may share it. Those are recorded in ``WORKDIR/broker-objects.json``
  before anything is declared, so the run after a killed one (or ``bin/demo --clean``) knows them too.

Removal runs once the demo's services have stopped, over AMQP with the demo's own account (the one
``QBROKER_URL`` and ``QBROKER_USERNAME`` name, not the per-program accounts, which may not delete shared
names): queues first, then exchanges. Nothing is removed while another program uses it: a consumer on
``demo.dead`` (every unit collects dead letters) means another program runs in the demo's corner; a queue
with a consumer, or an unprefixed exchange something else is still bound to, is kept. What the broker refuses
this account is named, with the command that removes it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import aio_pika
from aiormq.exceptions import (
    AMQPConnectionError,
    ChannelAccessRefused,
    ChannelLockedResource,
    ChannelNotFoundEntity,
    ChannelPreconditionFailed,
)

from qbroker.amqp_transport import connect_amqp
from qbroker.config import Config, redact_url
from qbroker.connection import broker_url, url_user
from qbroker.topology import shared_topology
from services.tiles.renderer.settings import short_hostname
from services.toposm.contract import (
    OSM_EXCHANGE,
    QUEUEMASTER,
    QUEUEMASTER_OSM_QUEUE,
    SPARK_EXPIRE,
    SPARK_JOB,
    SPARK_STATS,
    render_levels,
)

DEMO_PREFIX = "demo."  # the demo's corner of a broker (QBROKER_EXCHANGE_PREFIX unless the operator sets it)
RECORD_FILE = "broker-objects.json"
CLEAN_COMMAND = "bin/demo --clean"
BROKER_TIMEOUT = 60.0  # the whole removal: a broker that stops answering must not hold the demo's exit


@dataclass(frozen=True)
class BrokerObject:
    kind: Literal["queue", "exchange"]
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def in_order(objects: Iterable[BrokerObject]) -> list[BrokerObject]:
    """Queues first: they go before the exchanges they are bound to."""
    return sorted(set(objects), key=lambda item: (item.kind != "queue", item.name))


@dataclass
class Removal:
    """What a removal did: each object removed (with the messages it held), kept (and why), or refused to this
    account; or the broker was not reached."""

    user: str
    removed: dict[BrokerObject, int | None] = field(default_factory=dict)
    kept: dict[BrokerObject, str] = field(default_factory=dict)  # in use by another program: why
    refused: list[BrokerObject] = field(default_factory=list)
    unreachable: str | None = None
    unreached: list[BrokerObject] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.kept or self.refused or self.unreachable)

    def summary(self) -> str:
        """One phrase for the demo's last line."""
        if not self.complete:
            return "Exchanges and queues kept on the broker (named above)."
        return f"{len(self.removed)} exchanges and queues removed from the broker." if self.removed else ""

    def lines(self, workdir: Path) -> list[str]:
        """What an operator reads: every object by name, and how to remove what is still there."""
        out = []
        if self.removed:
            out.append(
                "  removed from the broker: "
                + ", ".join(
                    f"{item} ({messages} message{'' if messages == 1 else 's'})" if messages is not None else str(item)
                    for item, messages in self.removed.items()
                )
            )
        for why in dict.fromkeys(self.kept.values()):
            out.append(
                f"  kept on the broker, in use ({why}): "
                + ", ".join(str(item) for item, reason in self.kept.items() if reason == why)
            )
        if self.unreachable:
            out.append(f"  could not reach the broker to remove the demo's exchanges and queues: {self.unreachable}")
        elif self.refused:
            out.append(f"  kept on the broker: the account {self.user!r} may not delete them (configure permission):")
        out += [f"    {item}" for item in self.refused or self.unreached]
        command = f"{CLEAN_COMMAND} --workdir {workdir}"
        if self.refused or self.unreached:
            out.append(
                f"  remove them with: QBROKER_USERNAME=<an account that may> QBROKER_PASSWORD_FILE=<its "
                f"password file> {command}"
            )
        elif self.kept:
            out.append(f"  remove them once that program has stopped: {command}")
        return out


def vhost_of(config: Config) -> str:
    return unquote(urlsplit(config.urls[0]).path[1:]) or "/"


def service_names() -> tuple[str, ...]:
    """The names the demo's services serve on this host with a shared request queue each (``rpc_<name>``):
    the queuemaster, the Spark bridge, and the render levels every renderer process here shares."""
    return (QUEUEMASTER, SPARK_EXPIRE, SPARK_JOB, SPARK_STATS, *render_levels(short_hostname(), 0)[:2])


def candidates(config: Config, endpoints: Iterable[str] = ()) -> list[BrokerObject]:
    """Every object a demo run declares: the bus's shared ones with the TopOSM ``osm`` exchange (what
    ``qbroker provision`` declares for the demo's roles), the queuemaster's queue there, and the request queue
    of each of its services' names and of each endpoint given (those its services answered with)."""
    shared = [BrokerObject(item.kind, item.name) for item in shared_topology(config, (OSM_EXCHANGE,))]
    served = {*service_names(), *endpoints}
    return in_order(
        [
            *shared,
            BrokerObject("queue", QUEUEMASTER_OSM_QUEUE),
            *(BrokerObject("queue", config.queue_name("rpc", name)) for name in served),
        ]
    )


def prefix_owned(config: Config, item: BrokerObject) -> bool:
    return config.exchange_prefix == DEMO_PREFIX and item.name.startswith(DEMO_PREFIX)


class Record:
    """``WORKDIR/broker-objects.json``: the unprefixed objects a run declared, until they are removed."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / RECORD_FILE

    def read(self, config: Config) -> list[BrokerObject] | None:
        """The recorded objects on ``config``'s vhost; None when nothing is recorded."""
        try:
            data = json.loads(self.path.read_text())
            if data.get("vhost") != vhost_of(config):
                return []  # recorded on another vhost: not this broker's to clean
            return [BrokerObject(kind, name) for kind, name in data["objects"] if kind in ("queue", "exchange")]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    def exists(self) -> bool:
        return self.path.exists()

    def write(self, config: Config, objects: list[BrokerObject]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"vhost": vhost_of(config), "objects": [[o.kind, o.name] for o in objects]}))
        tmp.replace(self.path)

    def forget(self) -> None:
        self.path.unlink(missing_ok=True)


async def _on_channel(
    connection: aio_pika.abc.AbstractConnection, operation: Callable[[aio_pika.abc.AbstractChannel], Awaitable[Any]]
) -> Any:
    """``operation`` on a channel of its own: a refusal closes the channel it happens on."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        return await operation(channel)
    finally:
        if not channel.is_closed:
            await channel.close()


async def _passive(connection: aio_pika.abc.AbstractConnection, item: BrokerObject) -> Any:
    """The exchange or queue as it is (a passive declare needs no permission); None when it is not there."""

    async def declare(channel: aio_pika.abc.AbstractChannel) -> Any:
        if item.kind == "exchange":
            return await channel.declare_exchange(item.name, passive=True)
        return await channel.declare_queue(item.name, passive=True)

    try:
        return await _on_channel(connection, declare)
    except ChannelNotFoundEntity:
        return None


async def _delete(connection: aio_pika.abc.AbstractConnection, item: BrokerObject, *, if_unused: bool) -> None:
    async def delete(channel: aio_pika.abc.AbstractChannel) -> None:
        if item.kind == "exchange":
            await channel.exchange_delete(item.name, if_unused=if_unused)
        else:
            await channel.queue_delete(item.name, if_unused=if_unused)

    await _on_channel(connection, delete)


async def claim(config: Config, workdir: Path) -> list[BrokerObject]:
    """Before the run declares anything: which objects it will own (the prefix's and those absent now); the
    unprefixed ones are recorded in the work dir."""
    connection = await connect_amqp(broker_url(config.urls[0], config), timeout=config.connect_timeout)
    try:
        owned = [
            item
            for item in candidates(config)
            if prefix_owned(config, item) or await _passive(connection, item) is None
        ]
    finally:
        await connection.close()
    Record(workdir).write(config, [item for item in owned if not prefix_owned(config, item)])
    return owned


async def remove(config: Config, owned: Iterable[BrokerObject], workdir: Path) -> Removal:
    """Remove the ``owned`` objects still there (queues first) with ``config``'s account; forget the record
    once nothing is kept."""
    objects = in_order(owned)
    removal = Removal(user=url_user(config.urls[0], config))
    try:
        await asyncio.wait_for(_remove(config, objects, removal), BROKER_TIMEOUT)
    except (TimeoutError, AMQPConnectionError, OSError) as exc:
        removal.unreachable = f"{redact_url(config.urls[0])}: {exc or type(exc).__name__}"
        removal.unreached = [item for item in objects if item not in removal.removed]
    if removal.complete:
        Record(workdir).forget()
    return removal


async def _remove(config: Config, objects: list[BrokerObject], removal: Removal) -> None:
    connection = await connect_amqp(broker_url(config.urls[0], config), timeout=config.connect_timeout)
    try:
        dead = await _passive(connection, BrokerObject("queue", config.dead_queue_name))
        consumers = int(dead.declaration_result.consumer_count) if dead is not None else 0
        for item in objects:
            if consumers and prefix_owned(config, item):
                removal.kept[item] = f"{consumers} consumers of {config.dead_queue_name}: another program runs there"
                continue
            try:
                found = await _passive(connection, item)
                if found is None:
                    continue
                # The prefix's exchanges go with whatever is still bound to them (a request queue of ours
                # waiting for its expiry); another one only once nothing is bound to it. A queue only without
                # consumers: ours have stopped.
                await _delete(connection, item, if_unused=item.kind == "queue" or not prefix_owned(config, item))
            except ChannelAccessRefused:
                removal.refused.append(item)
            except (ChannelPreconditionFailed, ChannelLockedResource):
                removal.kept[item] = (
                    "another program consumes it"
                    if item.kind == "queue"
                    else "queues of other programs are bound to it"
                )
            else:
                removal.removed[item] = int(found.declaration_result.message_count) if item.kind == "queue" else None
    finally:
        await connection.close()


def owned_after(
    config: Config, workdir: Path, claimed: Iterable[BrokerObject] = (), endpoints: Iterable[str] = ()
) -> list[BrokerObject]:
    """What a run (or, with nothing claimed, an earlier one in ``workdir``) owns at its end: what it claimed,
    what the work dir records, and the prefix's objects with the request queues of ``endpoints``."""
    recorded = Record(workdir).read(config) or []
    return in_order(
        [*claimed, *recorded, *(item for item in candidates(config, endpoints) if prefix_owned(config, item))]
    )
