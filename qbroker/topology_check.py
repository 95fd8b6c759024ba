"""Finding the bus's shared exchanges and queues at connect, and declaring them only where allowed.

Per object (``qbroker.topology``), on a throwaway channel of the unit's connection:

1. the full declaration. Accepted: the object exists as qbroker declares it, or it did not exist and this
   account may create it (a development bus with ``guest``). Refused with PRECONDITION_FAILED: it exists
   with another setting, which the refusal names; the declaration is tried again with the existing value
   (``Shared.adopt``), until it is accepted: each difference is logged with what it costs, and the object
   is used as it is (another program, e.g. the original QBroker, declared it first). A difference qbroker
   cannot work with (``Shared.required``) raises ``TopologyConflict``. Refused with ACCESS_REFUSED: this
   account may not configure shared names (no provisioned role may: docs/security.md), and no full
   declaration is tried again on this connection;
2. otherwise a passive declaration, which the broker checks no permission for: the object is there (and
   trusted as it is) or missing. Every missing object is named in one ``TopologyMissing``, with the command
   that declares them.

The broker closes a channel on each refusal, which is why none of this runs on a channel the unit keeps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from aio_pika.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed
from aiormq.exceptions import ChannelAccessRefused
from structlog.typing import FilteringBoundLogger

from qbroker.errors import TopologyConflict, TopologyMissing
from qbroker.topology import Difference, Shared, read_difference
from qbroker.transport import Channel, Connection, Queue

T = TypeVar("T")
MAX_DIFFERENCES = 16  # more settings than an exchange or queue has: a refusal loop ends here
PROVISION_HINT = "`qbroker provision DEPLOYMENT.toml` declares them (docs/security.md)"


@dataclass(frozen=True)
class Declared:
    shared: Shared  # as it exists: qbroker's declaration with the differences adopted
    differences: list[Difference]
    entity: Any  # the exchange or queue object, on the probe's channel
    repeatable: bool  # the full declaration of ``shared`` was accepted: a unit's channel may repeat it


class TopologyProbe:
    """Declares or finds shared objects on throwaway channels of ``connection``; ``close()`` when done. The
    first may be lent (``channel``: the caller checks ``is_closed`` after; a refusal closed it), which saves
    opening and closing one where nothing is refused (docs/performance.md)."""

    def __init__(self, connection: Connection, log: FilteringBoundLogger, channel: Channel | None = None) -> None:
        self._connection = connection
        self._channel = self._lent = channel
        self.log = log
        self.may_configure: bool | None = None  # None until a full declaration was accepted or refused

    async def _run(self, operation: Callable[[Channel], Awaitable[T]]) -> T:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(publisher_confirms=False)
        try:
            return await operation(self._channel)
        except (ChannelPreconditionFailed, ChannelAccessRefused, ChannelNotFoundEntity):
            self._channel = None  # the broker closed it
            raise

    async def close(self) -> None:
        if self._channel is not None and self._channel is not self._lent and not self._channel.is_closed:
            with contextlib.suppress(Exception):
                await self._channel.close()
        self._channel = None

    async def declare(self, shared: Shared) -> Declared | None:
        """``shared`` as it exists, or None if it is missing and this account may not declare it. Raises
        TopologyConflict for a difference qbroker cannot use."""
        wanted, found = shared, list[Difference]()
        while self.may_configure is not False and len(found) < MAX_DIFFERENCES:
            try:
                declared = await self._run(partial(_declare, shared=wanted, passive=False))
            except ChannelAccessRefused:
                self.may_configure = False
                break
            except ChannelPreconditionFailed as exc:
                difference = read_difference(wanted, str(exc))
                if difference is not None and difference.required:
                    raise TopologyConflict(
                        f"{difference}: this unit cannot work with it as it is (delete it, or use "
                        "another vhost or QBROKER_EXCHANGE_PREFIX)"
                    ) from None
                if difference is None or not difference.readable or difference.setting in {d.setting for d in found}:
                    self.log.warning(
                        "shared object differs in a way not read; used as it is", object=str(wanted), refusal=str(exc)
                    )
                    break  # trust it as it is: the passive declaration below
                found.append(difference)
                wanted = wanted.adopt(difference)
                continue
            self.may_configure = True
            return Declared(wanted, found, declared, repeatable=True)
        try:
            declared = await self._run(partial(_declare, shared=wanted, passive=True))
        except ChannelNotFoundEntity:
            return None
        return Declared(wanted, found, declared, repeatable=False)

    async def bind(self, declared: Declared) -> None:
        """Bind a queue just declared (on the probe's current channel) as its declaration says."""
        for exchange, key in declared.shared.bindings:
            await self._run(partial(_bind, queue=declared.entity, exchange=exchange, key=key))


async def _declare(channel: Channel, *, shared: Shared, passive: bool) -> Any:
    arguments = dict(shared.arguments) if not passive else None
    if shared.type is not None:
        return await channel.declare_exchange(
            shared.name,
            shared.type,
            durable=shared.durable,
            auto_delete=shared.auto_delete,
            passive=passive,
            arguments=arguments,
        )
    return await channel.declare_queue(
        shared.name, durable=shared.durable, auto_delete=shared.auto_delete, passive=passive, arguments=arguments
    )


async def _bind(_: Channel, *, queue: Queue, exchange: str, key: str) -> None:
    await queue.bind(exchange, routing_key=key)


def warn_differences(log: FilteringBoundLogger, found: Sequence[Difference]) -> None:
    for difference in found:
        log.warning(
            "shared object exists with other settings; used as it is",
            difference=str(difference),
            cost=difference.cost(),
        )


async def ensure_shared(
    connection: Connection, objects: Sequence[Shared], log: FilteringBoundLogger, channel: Channel | None = None
) -> None:
    """Every object of ``objects`` there (declared where this account may), queues bound; differences logged.
    Raises TopologyMissing naming every missing object, TopologyConflict for one qbroker cannot use. ``channel``
    is tried first (see TopologyProbe)."""
    probe = TopologyProbe(connection, log, channel)
    missing: list[Shared] = []
    try:
        for shared in objects:
            declared = await probe.declare(shared)
            if declared is None:
                missing.append(shared)
                continue
            warn_differences(log, declared.differences)
            if not missing:  # a binding to a missing exchange would only fail
                await probe.bind(declared)
    finally:
        await probe.close()
    if missing:
        names = ", ".join(str(shared) for shared in missing)
        raise TopologyMissing(
            f"the bus's shared exchanges and queues are missing ({names}) and this account may "
            f"not declare them: {PROVISION_HINT}"
        )
