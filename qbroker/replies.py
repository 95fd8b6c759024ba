"""Replies on the unit's reply queue, routed to waiting calls and gathers by correlation id."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from qbroker.envelope import DEBUG_INFO_HEADER, Header, read_body, read_error, read_header
from qbroker.errors import ErrorInfo, QBrokerError, error_from_info


@dataclass
class Reply:
    """One reply: its body, its error element (if any) and its header."""

    body: Any
    error: ErrorInfo | None
    header: Header
    # False: the message could not be read (its error element says why). A call holds such a reply for a
    # while in case a readable one to the same request follows (``PendingReplies``).
    readable: bool = True
    # In a reply to a request with ``debug``: who handled it and how (envelope.debug_info), as the server wrote it.
    debug_info: dict[str, Any] | None = None

    @property
    def status(self) -> str:
        return self.error.status if self.error is not None else "ok"

    @property
    def warning(self) -> ErrorInfo | None:
        return self.error if self.error is not None and self.error.status == "warn" else None

    @property
    def cleared(self) -> ErrorInfo | None:
        """Status ``ok`` with an id: the sender says the error state ``id`` of ``part`` is over."""
        return self.error if self.error is not None and self.error.status == "ok" else None

    def raise_for_status(self) -> None:
        if self.error is not None and self.error.status in ("error", "fail"):
            raise error_from_info(self.error)


def parse_reply(message: AbstractIncomingMessage, *, accept: list[str], max_bytes: int) -> Reply:
    """A Reply even for a malformed message: the problem becomes its error element."""
    try:
        header = read_header(message)
        error = read_error(message)
        body = read_body(message, accept=accept, max_bytes=max_bytes)
    except QBrokerError as exc:
        return failed_reply(message, exc)
    if header.debug:
        info = (message.headers or {}).get(DEBUG_INFO_HEADER)
        return Reply(body=body, error=error, header=header, debug_info=info if isinstance(info, dict) else None)
    return Reply(body=body, error=error, header=header)


def failed_reply(message: AbstractIncomingMessage, exc: QBrokerError) -> Reply:
    """A reply whose problem is its error element, for the call its correlation id names."""

    def text(value: object) -> str | None:
        return value if isinstance(value, str) else None

    header = Header(
        version=0,
        message_id=text(message.message_id),
        correlation_id=text(message.correlation_id),
        app_id=text(message.app_id),
        content_type=text(message.content_type) or "application/json",
    )
    return Reply(body=None, error=exc.to_info(part="qbroker.reply"), header=header, readable=False)


class PendingReplies:
    """Futures of calls in flight and queues of gathers, keyed by the request's message id.

    A call takes the first readable reply to its request and ignores any later one. Two answers to one
    request are normal where two dead-letter collectors share the bus (qbroker's and another program's, e.g.
    the original QBroker's: both answer a dead request), and the other program's may be one qbroker cannot
    read: so an unreadable reply is held ``unreadable_grace`` seconds, and answers the call only if no
    readable one came meanwhile."""

    def __init__(self, unreadable_grace: float = 0.0) -> None:
        self.unreadable_grace = unreadable_grace
        self._held: dict[str, asyncio.TimerHandle] = {}
        self._calls: dict[str, asyncio.Future[Reply]] = {}
        # A gather's queue gets its replies, then the QBrokerError that ended it early (connection lost).
        self._gathers: dict[str, asyncio.Queue[Reply | QBrokerError]] = {}
        self._durable: set[str] = set()
        self._on_delivered: dict[str, Callable[[Reply], object]] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def expect(
        self, message_id: str, *, durable: bool = False, on_delivered: Callable[[Reply], object] | None = None
    ) -> asyncio.Future[Reply]:
        """A future for the reply to ``message_id``; a ``durable`` one (a guaranteed request) outlives a
        lost connection: its request is kept by the broker and answered once both sides are back."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._calls[message_id] = future
        if durable:
            self._durable.add(message_id)
        if on_delivered is not None:
            self._on_delivered[message_id] = on_delivered
        return future

    def forget(self, message_id: str) -> None:
        self._release_held(message_id)
        self._calls.pop(message_id, None)
        self._durable.discard(message_id)
        self._on_delivered.pop(message_id, None)

    def delivered(self, notice: Reply) -> bool:
        """A server picked up the request ``notice`` answers: tell the caller that asked (once)."""
        callback = self._on_delivered.pop(notice.header.correlation_id or "", None)
        if callback is None:
            return False
        callback(notice)
        return True

    def open_gather(self, message_id: str) -> asyncio.Queue[Reply | QBrokerError]:
        queue: asyncio.Queue[Reply | QBrokerError] = asyncio.Queue()
        self._gathers[message_id] = queue
        return queue

    def close_gather(self, message_id: str) -> None:
        self._gathers.pop(message_id, None)

    def deliver(self, reply: Reply) -> bool:
        """Hand a reply to whoever waits for it; False if nobody does (late or foreign reply)."""
        key = reply.header.correlation_id
        if key is None:
            return False
        if not reply.readable and key in self._calls and self.unreadable_grace > 0:
            if key not in self._held:  # the first unreadable one is the one shown, if no readable one comes
                self._held[key] = asyncio.get_running_loop().call_later(self.unreadable_grace, self._answer, key, reply)
            return True
        self._release_held(key)
        future = self._calls.pop(key, None)
        if future is not None:
            if not future.done():
                future.set_result(reply)
            return True
        queue = self._gathers.get(key)
        if queue is not None:
            queue.put_nowait(reply)
            return True
        return False

    def _answer(self, key: str, reply: Reply) -> None:
        self._held.pop(key, None)
        future = self._calls.pop(key, None)
        if future is not None and not future.done():
            future.set_result(reply)

    def _release_held(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            held.cancel()

    def fail_all(self, exc: QBrokerError, *, keep_durable: bool = True) -> None:
        """Connection lost: calls in flight fail fast instead of waiting for a reply that can't come;
        guaranteed ones keep waiting (``keep_durable``) unless the unit itself is closing."""
        keep = self._durable if keep_durable else set()
        calls = self._calls
        self._calls = {key: future for key, future in calls.items() if key in keep}
        for key, future in calls.items():
            if key not in keep:
                self._release_held(key)
                if not future.done():
                    future.set_exception(exc)
        # Gathers end now with what they have: no further reply can reach a closed reply queue.
        for queue in self._gathers.values():
            queue.put_nowait(exc)
