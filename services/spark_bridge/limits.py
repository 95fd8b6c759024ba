"""The bridge's own ceilings: what no request can raise, whatever it asks for.

A request may ask for less than a ceiling (a tighter guard), never more: a value above the ceiling is
answered ``fail`` ``over_limit`` instead of being obeyed or silently clamped, so the caller learns what
the bridge allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.osmstore.osc_input import InputLimits
from services.toposm.error_messages import failed

_INPUT = InputLimits()


@dataclass(frozen=True)
class BridgeLimits:
    max_tiles: int = 50_000_000  # osm2pgsql's overall cap
    max_tiles_per_geometry: int = 10_000_000  # osm2pgsql's per-geometry cap
    # Jobs queued or running at once; one more is answered `busy` (status error: retry later).
    max_pending_jobs: int = 16
    # Finished job records (and their logs and default results) kept: the newest `keep_jobs`, none older
    # than `keep_seconds`. Bounds the state dir and the memory of `spark.job list`.
    keep_jobs: int = 1000
    keep_seconds: float = 7 * 86_400.0
    # osmChange input one job may read: decompressed bytes and objects (expire-list lines count as objects).
    max_input_bytes: int = _INPUT.max_bytes
    max_input_objects: int = _INPUT.max_objects

    def __post_init__(self) -> None:
        for name in (
            "max_tiles",
            "max_tiles_per_geometry",
            "max_pending_jobs",
            "keep_jobs",
            "max_input_bytes",
            "max_input_objects",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.keep_seconds <= 0:
            raise ValueError("keep_seconds must be positive")

    @property
    def input_limits(self) -> InputLimits:
        return InputLimits(max_bytes=self.max_input_bytes, max_objects=self.max_input_objects)

    def guard(self, name: str, asked: int | None) -> int:
        """The guard a job runs with: the request's value if it is within the ceiling, else ``fail``."""
        ceiling: int = getattr(self, name)
        if asked is None:
            return ceiling
        if asked > ceiling:
            raise failed("over_limit", f"{name}={asked}; the ceiling is {ceiling}")
        return asked
