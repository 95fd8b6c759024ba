"""The sending side of a unit: call, cast, alert, gather, broadcast and schedule, once the unit is started."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from qbroker import rpc
from qbroker.alerts import gather
from qbroker.bus import Bus
from qbroker.config import Config
from qbroker.envelope import JSON, new_message_id
from qbroker.errors import ConnectionLost, ErrorInfo, NotStarted
from qbroker.replies import Reply
from qbroker.schedule import Schedule, Scheduler
from qbroker.serving import broadcast_key

State = Literal["new", "starting", "started", "stopping", "stopped"]


class UnitCalls:
    """What a started ``Unit`` sends; ``Unit`` sets these attributes (qbroker.unit)."""

    bus: Bus
    config: Config
    state: State
    scheduler: Scheduler

    def _check_started(self, what: str) -> None:
        if self.state not in ("starting", "started"):
            raise NotStarted(f"{what}() on a unit that is {self.state}: call start() first")

    async def call_reply(
        self,
        name: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        debug: bool = False,
        priority: int | None = None,
        retries: int = 0,
        content_type: str = JSON,
        guarantee: bool = False,
        on_delivered: Callable[[Reply], object] | None = None,
    ) -> Reply:
        """Call ``name``; return the Reply (ok or warn), raise the remote error (error or fail).

        ``guarantee``: a persistent request that survives a broker restart; ``on_delivered(notice)``: called
        when a server picks the request up (RQ DELIVERED). See docs/semantics.md."""
        self._check_started("call")
        timeout = self.config.call_timeout if timeout is None else timeout
        return await rpc.call_with_retries(
            self.bus,
            name,
            body,
            timeout=timeout,
            debug=debug,
            priority=priority,
            retries=retries,
            content_type=content_type,
            guarantee=guarantee,
            on_delivered=on_delivered,
            running=self._running,
        )

    def _running(self) -> bool:
        return self.state in ("starting", "started")

    async def call(
        self,
        name: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        debug: bool = False,
        priority: int | None = None,
        retries: int = 0,
        content_type: str = JSON,
        guarantee: bool = False,
        on_delivered: Callable[[Reply], object] | None = None,
    ) -> Any:
        """Call ``name`` and return the reply body; raise the remote error."""
        reply = await self.call_reply(
            name,
            body,
            timeout=timeout,
            debug=debug,
            priority=priority,
            retries=retries,
            content_type=content_type,
            guarantee=guarantee,
            on_delivered=on_delivered,
        )
        return reply.body

    async def cast(
        self,
        name: str,
        body: Any = None,
        *,
        priority: int | None = None,
        ttl: float | None = None,
        content_type: str = JSON,
        guarantee: bool = False,
    ) -> None:
        """A one-way request (RQ NOREPLY): one server handles it, nobody is answered; ``guarantee``: persistent."""
        self._check_started("cast")
        # Unserved casts expire (to `dead`, counted) instead of running as a stale burst on restart.
        ttl = self.config.cast_ttl if ttl is None else ttl
        with self.bus.middleware.sending("cast", name) as sending:
            message = self.bus.make_message(
                body,
                kind="rpc",
                name=name,
                message_id=new_message_id(),
                content_type=content_type,
                expiration_s=ttl,
                priority=priority,
                deadline=time.time() + ttl,
                persistent=guarantee,
                extra_headers=sending.headers,
            )
            if not await self.bus.wait_connected(self.config.call_timeout):
                raise ConnectionLost(f"not connected to a broker (cast {name})")
            if guarantee:  # confirmed, published again across a lost connection for up to call_timeout
                loop = asyncio.get_running_loop()
                await rpc.publish_until_confirmed(
                    self.bus, name, message, until=loop.time() + self.config.call_timeout, expires_at=loop.time() + ttl
                )
            else:
                await self.bus.publish("rpc", name, message)

    def schedule(
        self,
        name: str,
        body: Any = None,
        *,
        every: float | None = None,
        cron: str | None = None,
        kind: Literal["cast", "alert"] = "cast",
        nohaste: bool = False,
    ) -> Schedule:
        """Send ``name`` every ``every`` seconds or on a ``cron`` line until unscheduled or stopped."""
        self._check_started("schedule")

        made: list[Schedule] = []

        async def send() -> None:
            if kind == "alert":
                await self.alert(name, body)
            else:
                # A send is stale once the next one is due: that is its TTL (at most cast_ttl).
                due = made[0].next_delay(time.time(), first=False) if made else self.config.cast_ttl
                await self.cast(name, body, ttl=max(0.001, min(due, self.config.cast_ttl)))

        made.append(self.scheduler.add(name, kind, send, every=every, cron=cron, nohaste=nohaste))
        return made[0]

    def unschedule(self, schedule_id: str) -> bool:
        return self.scheduler.remove(schedule_id)

    async def alert(
        self,
        name: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        error: ErrorInfo | None = None,
        message_id: str | None = None,
    ) -> None:
        """Broadcast the alert ``name`` to every listener whose pattern matches (nobody answers).

        ``error`` attaches an error element: report an error state, or (status ``ok``) say it is over.
        ``message_id`` (default: a new random one) lets a sender give one event the same id wherever it
        publishes it, so listeners that hear it twice can tell."""
        self._check_started("alert")
        with self.bus.middleware.sending("alert", name) as sending:
            message = self.bus.make_message(
                body,
                kind="alert",
                name=name,
                message_id=message_id or new_message_id(),
                content_type=content_type,
                error=error,
                extra_headers=sending.headers,
            )
            if not await self.bus.wait_connected(self.config.call_timeout):
                raise ConnectionLost(f"not connected to a broker (alert {name})")
            await self.bus.publish("alert", name, message)

    def gather(
        self,
        name: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        max_replies: int | None = None,
        gap: float | None = None,
        content_type: str = JSON,
    ) -> AsyncIterator[Reply]:
        """Broadcast ``name`` and iterate over the replies (stops on count, deadline or gap)."""
        self._check_started("gather")
        return gather(
            self.bus,
            name,
            body,
            timeout=self.config.call_timeout if timeout is None else timeout,
            max_replies=max_replies,
            gap=gap,
            content_type=content_type,
        )

    def broadcast(
        self,
        name: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        max_replies: int | None = None,
        gap: float | None = None,
    ) -> AsyncIterator[Reply]:
        """Send a request to *every* server of ``name`` (RQ BROADCAST) and iterate over their replies,
        as ``gather`` does (errors come as replies with ``reply.error``, not raised)."""
        return self.gather(broadcast_key(name), body, timeout=timeout, max_replies=max_replies, gap=gap)
