"""The queuemaster's view of registered render threads."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from services.toposm.strategy import StrategyMix
from services.toposm.tilemath import Metatile


@dataclass(eq=False)
class RenderThread:
    endpoint: str  # toposm.render.<host>.<pid>.<threadid>
    hostname: str
    pid: int
    threadid: int
    strategy: StrategyMix
    reply_to: str | None  # the renderer process's queue: identifies it for a bare `unregister`
    user: str | None = None  # the broker account that registered it: only it may report or unregister
    # How to reach it: a qbroker endpoint, or the TopOSM wire (raw JSON on the `osm` exchange, no replies
    # to `render`; never pinged: its liveness is its reply_to queue's, asked of the broker).
    wire: str = "qbroker"
    metatile: Metatile | None = None  # what it renders now
    busy_since: float | None = None
    # Dispatched but the renderer's answer is not in yet, or the renderer refused: not idle either way.
    pending: bool = False
    missed_pings: int = 0
    ping_in_flight: bool = False
    rendered: int = 0
    registered_at: float = field(default_factory=time.time)
    # The `rendered` report whose answer handed this thread its current metatile, and that answer: a
    # retried report (the answer was lost) gets the same answer again instead of a second metatile.
    handed: tuple[Metatile, dict[str, Any]] | None = None

    @property
    def idle(self) -> bool:
        return self.metatile is None and not self.pending

    @property
    def state(self) -> str:
        if self.metatile is not None:
            return "rendering"
        return "dispatching" if self.pending else "idle"

    def describe(self) -> dict[str, object]:
        return {
            "renderer": self.endpoint,
            "hostname": self.hostname,
            "pid": self.pid,
            "threadid": self.threadid,
            "strategy": str(self.strategy),
            "state": self.state,
            "metatile": str(self.metatile) if self.metatile else None,
            "busy_for": (round(time.time() - self.busy_since, 3) if self.busy_since and self.metatile else None),
            "rendered": self.rendered,
            "wire": self.wire,
        }


class RenderThreadRegistry:
    """Threads by endpoint, in registration order (dispatch rotates over them for fairness)."""

    def __init__(self) -> None:
        self._threads: dict[str, RenderThread] = {}
        self._by_metatile: dict[Metatile, RenderThread] = {}
        self._rotation = 0

    def __len__(self) -> int:
        return len(self._threads)

    def __iter__(self) -> Iterator[RenderThread]:
        return iter(list(self._threads.values()))

    def get(self, endpoint: str) -> RenderThread | None:
        return self._threads.get(endpoint)

    def add(self, thread: RenderThread) -> RenderThread | None:
        """Register (or replace) a thread; returns the replaced one, if any."""
        old = self._threads.pop(thread.endpoint, None)
        if old is not None and old.metatile is not None:
            self._by_metatile.pop(old.metatile, None)
        self._threads[thread.endpoint] = thread
        if thread.metatile is not None:
            self._by_metatile[thread.metatile] = thread
        return old

    def remove(self, thread: RenderThread) -> None:
        if self._threads.get(thread.endpoint) is thread:
            del self._threads[thread.endpoint]
        if thread.metatile is not None and self._by_metatile.get(thread.metatile) is thread:
            del self._by_metatile[thread.metatile]

    def assign(self, thread: RenderThread, metatile: Metatile | None) -> None:
        if thread.metatile is not None and self._by_metatile.get(thread.metatile) is thread:
            del self._by_metatile[thread.metatile]
        thread.metatile = metatile
        thread.busy_since = time.time() if metatile is not None else None
        if metatile is not None:
            self._by_metatile[metatile] = thread

    def rendering(self, metatile: Metatile) -> RenderThread | None:
        return self._by_metatile.get(metatile)

    def matching(
        self, reply_to: str | None, hostname: str | None, pid: int | None, threadid: int | None
    ) -> list[RenderThread]:
        """Threads an `unregister` names: by ids when given, else every thread behind reply_to."""
        found = []
        for t in self._threads.values():
            if hostname is None and pid is None and threadid is None:
                if reply_to is not None and t.reply_to == reply_to:
                    found.append(t)
            elif (
                (hostname is None or t.hostname == hostname)
                and (pid is None or t.pid == pid)
                and (threadid is None or t.threadid == threadid)
            ):
                found.append(t)
        return found

    def idle_in_rotation(self) -> list[RenderThread]:
        """Idle threads, starting one further along each time so no thread starves the others."""
        threads = list(self._threads.values())
        if not threads:
            return []
        self._rotation = (self._rotation + 1) % len(threads)
        rotated = threads[self._rotation :] + threads[: self._rotation]
        return [t for t in rotated if t.idle]

    def handed_again(
        self,
        metatile: Metatile,
        reporter: tuple[str | None, int | None, int | None],
        owned: Callable[[RenderThread], bool],
        named: bool = False,
    ) -> dict[str, Any] | None:
        """A retried ``rendered`` whose first answer handed its thread the next metatile (the answer was
        lost on the way): that answer again, if the thread (the reporter, when it names itself or ``named``
        demands it, and of the caller's account) still has the metatile it was handed."""
        for thread in self._threads.values():
            if thread.handed is None or thread.handed[0] != metatile:
                continue
            answer = thread.handed[1]
            same = (reporter[0] is None and not named) or reporter == (thread.hostname, thread.pid, thread.threadid)
            if same and owned(thread) and str(thread.metatile) == answer["render"]:
                return dict(answer)
        return None
