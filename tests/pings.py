"""Pinging units and counting what comes back (tests/qbroker/core/test_ping_guard.py, tests/qbroker/security/)."""

from __future__ import annotations

from typing import Any

from qbroker import Unit
from qbroker.envelope import new_message_id
from qbroker.presence import PING


def count_handled(unit: Unit, part: str) -> list[str]:
    """Every ``part`` handled by ``unit`` (its status), as handler observers see it."""
    seen: list[str] = []
    unit.handler_observers.append(lambda name, kind, status, seconds: seen.append(status) if name == part else None)
    return seen


def count_stray_replies(unit: Unit) -> list[Any]:
    """Replies that reach ``unit`` for nothing it asked (its own calls and gathers still get theirs)."""
    stray: list[Any] = []

    def watching(reply: Any, message: Any) -> None:
        if not unit.pending.deliver(reply):
            stray.append(reply)

    unit.bus._deliver = watching  # type: ignore[method-assign]
    return stray


async def ping_as(sender: Unit, reply_to: str, count: int) -> None:
    """``count`` pings from ``sender``'s account, each naming ``reply_to`` for the answers."""
    for _ in range(count):
        message = sender.bus.make_message({}, kind="alert", name=PING, message_id=new_message_id(), reply_to=reply_to)
        await sender.bus.publish("alert", PING, message)
