"""The queuemaster's settings: the command line's options (``main``), read by the state machine and the
bus adapter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.toposm.tilemath import ZoomRange

from .access import AccessPolicy
from .buckets import BucketLimits

# Render and bulk requests waiting at once, in all and per account (the AMQP user-id the broker validated);
# beyond either a new one is answered `busy`. The total bounds the queuemaster's memory; the per-account cap
# is below it, so one account alone never fills it (docs/tiles.md "Requests and waiters").
MAX_WAITS = 10_000
MAX_WAITS_PER_ACCOUNT = 1_000
# Seconds a request that carries no deadline (the osm wire; a raw AMQP client) waits for its metatile.
DEFAULT_DEADLINE = 600.0
# Seconds a stopping queuemaster waits for handlers in progress (the answers to its waiting requests, a
# `rendered` being recorded); then what still runs is abandoned (qbroker.unit.Unit.stop).
DRAIN_TIMEOUT = 5.0


@dataclass
class QueuemasterSettings:
    tile_root: Path
    state_file: Path
    zooms: ZoomRange = ZoomRange(0, 18)
    render_log: Path | None = None
    # Expirations of never-rendered metatiles are ignored unless this is set (they render on request).
    render_missing_expired: bool = False
    # An expired metatile also expires its ancestors down to this zoom; None: no propagation.
    propagate_to_zoom: int | None = None
    seed: int | None = None  # strategy RNG seed, for reproducible picks
    ping_interval: float = 1.0  # liveness: how often each render thread is pinged
    ping_misses: int = 3  # consecutive unanswered pings (timeouts) before a thread counts as dead
    dispatch_timeout: float = 5.0
    access: AccessPolicy = AccessPolicy()  # who may send renderer commands (checked against user_id)
    buckets: BucketLimits = BucketLimits()  # render threads background and bulk work may take at once
    metrics_port: int | None = None  # --metrics-port (services/toposm/metrics_port.py); None: no metrics server
    metrics_host: str = "127.0.0.1"
    tile_store: str = "png"  # png or meta (tile_store.py): how the renderers store what they render
    max_waits: int = MAX_WAITS  # --max-waits
    max_waits_per_account: int = MAX_WAITS_PER_ACCOUNT  # --max-waits-per-account
    default_deadline: float = DEFAULT_DEADLINE  # --default-deadline
    drain_timeout: float = DRAIN_TIMEOUT  # --drain-timeout

    def __post_init__(self) -> None:
        if not 0 < self.max_waits_per_account < self.max_waits:
            raise ValueError(
                f"--max-waits-per-account ({self.max_waits_per_account}) must be above 0 and below "
                f"--max-waits ({self.max_waits}): one account alone must never fill the queuemaster"
            )
        if self.default_deadline <= 0:
            raise ValueError(f"--default-deadline must be above 0, not {self.default_deadline}")
