"""A server's memory of the guaranteed requests it is running and has answered, so that a second copy of one
is answered without running its handler again.

A guaranteed request may reach its server twice: its caller publishes it again, with the same message id,
when its connection was lost before the broker confirmed it (``rpc.publish_until_confirmed``: the broker may
have had it all along), and the broker delivers it again when the ack of an answered copy was lost with its
connection. A copy that arrives while another runs waits for its outcome; one that arrives after the request
was answered gets that answer again. A run that hands its request on (a retry parked, a redelivery count
re-published) leaves no outcome: the copy it published, or a copy waiting, runs and answers. Only this process
remembers: a copy that reaches another server runs there (at least once, docs/semantics.md "Guaranteed
requests").

A copy is the same request only if everything that decides its answer is the same: the endpoint, the message
id, the sender's account (validated by the broker), the reply-to and the body. So a forged copy that reuses
someone's message id is a request of its own: it cannot read another caller's answer nor keep another
caller's request from running.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict

from qbroker.middleware import Outcome

RequestKey = tuple[str, str, str | None, str | None, str | None, bytes]
# A request without a deadline header (another protocol client's) is remembered this long after its answer.
KEPT_WITHOUT_DEADLINE_S = 600.0


def request_key(
    endpoint: str, message_id: str, sender: str | None, reply_to: str | None, content_type: str | None, body: bytes
) -> RequestKey:
    digest = hashlib.blake2b(body, digest_size=16).digest()
    return endpoint, message_id, sender, reply_to, content_type, digest


class GuaranteedRequests:
    """The guaranteed requests this unit runs (each with a future its copies wait on) and the outcomes of the
    last ``max_kept`` it answered, each until its deadline (plus ``slack``) has passed."""

    def __init__(self, max_kept: int, slack: float) -> None:
        self._max_kept = max_kept
        self._slack = slack
        self._running: dict[RequestKey, asyncio.Future[None]] = {}
        self._kept: OrderedDict[RequestKey, tuple[Outcome, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def kept(self, key: RequestKey) -> Outcome | None:
        """The outcome remembered for ``key``, None if there is none (any more)."""
        entry = self._kept.get(key)
        if entry is None:
            return None
        if entry[1] <= time.monotonic():
            del self._kept[key]
            return None
        return entry[0]

    def running(self, key: RequestKey) -> asyncio.Future[None] | None:
        """Done when the copy running now ends (answered, handed on, failed, or its connection lost)."""
        return self._running.get(key)

    def start(self, key: RequestKey) -> asyncio.Future[None]:
        """This copy runs: later copies wait for it. Returns the token that ``finish`` takes."""
        token: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running[key] = token
        return token

    def finish(
        self, key: RequestKey, token: asyncio.Future[None], outcome: Outcome | None, deadline: float | None
    ) -> None:
        """The run of ``token`` ended with ``outcome`` (None: without one: it handed the request on, or raised):
        remember it, and wake the copies waiting. A run that outlived its connection is remembered too: its
        answer is real."""
        if outcome is not None and self._max_kept > 0:
            remaining = deadline - time.time() if deadline is not None else KEPT_WITHOUT_DEADLINE_S
            self._kept[key] = (outcome, time.monotonic() + max(0.0, remaining) + self._slack)
            self._kept.move_to_end(key)
            self._forget_old()
        if self._running.get(key) is token:
            del self._running[key]
        if not token.done():
            token.set_result(None)

    def connection_lost(self) -> None:
        """The deliveries of the runs in progress went with the connection: the broker delivers those requests
        again, and a copy must not wait for a run that may never end (a handler stuck on a dead node)."""
        running, self._running = self._running, {}
        for token in running.values():
            if not token.done():
                token.set_result(None)

    def _forget_old(self) -> None:
        now = time.monotonic()
        while self._kept:
            key, (_, expires) = next(iter(self._kept.items()))
            if len(self._kept) <= self._max_kept and expires > now:
                return
            del self._kept[key]
