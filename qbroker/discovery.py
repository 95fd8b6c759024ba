"""How a unit makes itself known (``qbroker.start`` / ``qbroker.stop`` announcements on the alert exchange),
and reading what units say of themselves, whichever QBroker wrote it.

A unit answers ``qbroker.ping`` with its description (``Unit.describe``); it announces the short form
(app, uuid, host, pid, endpoint names, listener patterns) when it starts, when its endpoints change and
when it stops. At start, with debuggers listening, it waits (briefly) until each has followed its uuid:
without that a short-lived client (``qbroker call``) gets its reply before a debugger has bound its
reply key, and the debugger never shows the reply (the protocol's discovery has this race: docs/semantics.md,
"The debugger and short-lived clients").

How a unit answers pings: ``qbroker.presence``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from qbroker import rpc
from qbroker.alerts import gather
from qbroker.bus import Bus
from qbroker.codecs import JSON_OBJ
from qbroker.envelope import new_message_id
from qbroker.errors import QBrokerError
from qbroker.presence import PING, START, STOP, UUID_ADDRESS

__all__ = ["PING", "START", "STOP", "Announcer", "ask_original", "complete_original", "unit_summary"]
ORIGINAL = "original"  # the ``dialect`` of a unit summary made from the original's ping reply


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
            message = self.bus.make_message(self.announcement(), kind="alert", name=name, message_id=new_message_id())
            await self.bus.publish("alert", name, message)

    async def announce_start(self) -> None:
        config = self.bus.config
        debuggers = await self.bus.queue_consumers(config.debuggers_queue_name) if config.debugger_wait else 0
        if not debuggers:
            await self.announce(START)
            return
        with contextlib.suppress(QBrokerError, asyncio.TimeoutError, OSError):
            replies = gather(self.bus, START, self.announcement(), timeout=config.debugger_wait, max_replies=debuggers)
            async for _ in replies:
                pass


# -- reading discovery answers, whichever QBroker wrote them ----------------------------------------------


def unit_summary(body: Any, content_type: str | None = None) -> dict[str, Any] | None:
    """A ping reply's body in qbroker's shape (``Unit.describe``), or None when it is not a unit's. The original's
    (``{app, uuid, args}``, or with ``endpoints: ["rpc.<name>", "alert.<pattern>"]`` when asked on ``rpc``)
    becomes ``{app, uuid, args, dialect: "original"}``, with ``endpoints: {name: {}}`` and ``listeners`` when
    it said them."""
    if not isinstance(body, dict) or not isinstance(body.get("uuid"), str):
        return None
    original = content_type == JSON_OBJ or ("args" in body and "host" not in body)
    if not original:
        return body
    summary = {k: v for k, v in body.items() if k in ("app", "uuid", "args")}
    summary["dialect"] = ORIGINAL
    tags = body.get("endpoints")
    if isinstance(tags, list):  # absent (not empty) when it did not say: see complete_original
        tags = [t for t in tags if isinstance(t, str)]
        summary["endpoints"] = {t[len("rpc.") :]: {} for t in tags if t.startswith("rpc.")}
        summary["listeners"] = sorted(t[len("alert.") :] for t in tags if t.startswith("alert."))
    return summary


async def ask_original(bus: Bus, uuid: str, timeout: float) -> dict[str, Any] | None:
    """The original unit ``uuid``'s own description, endpoints included (its ``qbroker.ping`` on ``rpc``,
    addressed to ``qbroker.uuid.<uuid>``), or None if it does not answer in time."""
    with contextlib.suppress(QBrokerError):
        reply = await rpc.call(bus, PING, {}, timeout=timeout, routing_key=f"{UUID_ADDRESS}{uuid}")
        if reply.error is None:
            return unit_summary(reply.body, JSON_OBJ)
    return None


async def complete_original(bus: Bus, units: list[dict[str, Any]], timeout: float) -> None:
    """Ask each original unit among ``units`` (summaries) for its endpoints, all at once; fill them in."""
    originals = [u for u in units if u.get("dialect") == ORIGINAL and "endpoints" not in u]
    answers = await asyncio.gather(*(ask_original(bus, u["uuid"], timeout) for u in originals))
    for unit, answer in zip(originals, answers, strict=True):
        if answer is not None and "endpoints" in answer:
            unit.update(endpoints=answer["endpoints"], listeners=answer["listeners"])
