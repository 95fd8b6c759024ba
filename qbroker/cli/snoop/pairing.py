"""Pairing replies with the request (or replied-to alert) they answer, by correlation id."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from qbroker.cli.snoop.events import Event


@dataclass
class Pending:
    seen_at: float
    name: str | None
    kind: str
    app: str | None
    replies: int = 0


class RequestTracker:
    """Requests seen but not yet answered, oldest first, bounded in number and age.

    A request gets exactly one reply, so it is forgotten when paired. An alert sent with reply-to
    (a gather, e.g. ``qbroker.ping``) may get many replies, so it is kept until it ages out.
    """

    def __init__(self, max_pending: int = 20000, max_age: float = 600.0) -> None:
        self._pending: OrderedDict[str, Pending] = OrderedDict()
        self._max_pending = max_pending
        self._max_age = max_age

    def __len__(self) -> int:
        return len(self._pending)

    def knows(self, correlation_id: str) -> bool:
        return correlation_id in self._pending

    def observe(self, event: Event) -> None:
        """Remember requests and alerts that expect replies; complete replies with name and latency."""
        if event.kind in ("request", "alert", "dead"):
            # A dead request (unroutable, expired in its queue) still gets a reply from the dead-letter
            # collector (no_server / queue_timeout): remember it so that reply is paired too.
            if event.reply_to and event.message_id:
                kind = "alert" if event.kind == "alert" else "request"
                self._pending[event.message_id] = Pending(event.time, event.name, kind, event.app)
                self._expire(event.time)
            return
        if event.kind != "reply" or not event.correlation_id:
            return
        pending = self._pending.get(event.correlation_id)
        if pending is None:
            return
        pending.replies += 1
        event.latency_ms = round(max(0.0, event.time - pending.seen_at) * 1000.0, 3)
        if event.name is None:
            event.name = pending.name
        if event.to_app is None:
            event.to_app = pending.app
        if pending.kind == "request":
            del self._pending[event.correlation_id]

    def _expire(self, now: float) -> None:
        while self._pending:
            key, oldest = next(iter(self._pending.items()))
            if len(self._pending) <= self._max_pending and now - oldest.seen_at <= self._max_age:
                break
            del self._pending[key]
