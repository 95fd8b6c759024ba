"""Counters and per-zoom render times that the `stats` command reports."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ZoomTiming:
    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def add(self, duration: float) -> None:
        self.count += 1
        self.total += duration
        self.max = max(self.max, duration)

    def describe(self) -> dict[str, float]:
        mean = self.total / self.count if self.count else 0.0
        return {"count": self.count, "mean": round(mean, 4), "max": round(self.max, 4), "total": round(self.total, 3)}


@dataclass
class QueuemasterStats:
    started: float = field(default_factory=time.time)
    counters: Counter[str] = field(default_factory=Counter)
    render_time: dict[int, ZoomTiming] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def rendered(self, zoom: int, duration: float | None) -> None:
        if duration is not None:
            self.render_time.setdefault(zoom, ZoomTiming()).add(duration)

    def describe(self, group_commits: int = 0) -> dict[str, object]:
        names = ("requested", "expired", "rendered", "failed")
        counters = {name: self.counters[name] for name in names}
        counters.update({k: v for k, v in sorted(self.counters.items()) if k not in names})
        if group_commits:
            counters["group_commits"] = group_commits
        return {
            "counters": counters,
            "render_time": {str(z): t.describe() for z, t in sorted(self.render_time.items())},
            "uptime": round(time.time() - self.started, 3),
        }
