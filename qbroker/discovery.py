"""How a unit makes itself known: ``qbroker.start`` / ``qbroker.stop`` announcements on the alert exchange.

A unit answers ``qbroker.ping`` with its description (``Unit.describe``); it announces the short form
(app, uuid, host, pid, endpoint names, listener patterns) when it starts, when its endpoints change and
when it stops. At start, with debuggers listening, it waits (briefly) until each has followed its uuid:
without that a short-lived client (``qbroker call``) gets its reply before a debugger has bound its
reply key, and the debugger never shows the reply (the seed's design has this race).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from qbroker.alerts import gather
from qbroker.bus import Bus
from qbroker.envelope import new_message_id
from qbroker.errors import QBrokerError

START, STOP, PING = "qbroker.start", "qbroker.stop", "qbroker.ping"


class Announcer:
    def __init__(self, bus: Bus, describe: Callable[[], dict[str, Any]]) -> None:
        self.bus = bus
        self._describe = describe

    def announcement(self) -> dict[str, Any]:
        info = self._describe()
        body = {k: info[k] for k in ("app", "uuid", "host", "pid", "listeners")}
        body["endpoints"] = sorted(info["endpoints"])
        return body

    async def announce(self, name: str) -> None:
        """Publish ``name`` (start, stop) with our short description; a lost broker is not an error here."""
        with contextlib.suppress(QBrokerError, asyncio.TimeoutError, OSError):
            message = self.bus.make_message(self.announcement(), kind="alert", name=name,
                                            message_id=new_message_id())
            await self.bus.publish("alert", name, message)

    async def announce_start(self) -> None:
        config = self.bus.config
        debuggers = await self.bus.queue_consumers(config.debuggers_queue_name) if config.debugger_wait else 0
        if not debuggers:
            await self.announce(START)
            return
        with contextlib.suppress(QBrokerError, asyncio.TimeoutError, OSError):
            replies = gather(self.bus, START, self.announcement(), timeout=config.debugger_wait,
                             max_replies=debuggers)
            async for _ in replies:
                pass
