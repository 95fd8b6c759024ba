"""Request models of the bridge's endpoints (the wire boundary)."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.spark_bridge.tile_columns import MAX_ZOOM_LIMIT
from services.toposm.contract import EXPIRE_TOPIC

MAX_PATHS = 1000  # inputs per request: each is checked at submit time on the event loop's worker thread


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wait: bool = Field(False, description="Answer with the finished job instead of its id at once.")
    wait_timeout: float | None = Field(
        None, gt=0, description="With wait: give up waiting after this many seconds (the job keeps running)."
    )


class ExpireRequest(_Request):
    paths: list[str] = Field(
        ...,
        min_length=1,
        max_length=MAX_PATHS,
        description="osmChange (.osc/.osc.gz), expire lists (z/x/y "
        "per line), Parquet or CSV with lon/lat columns; paths under the bridge's input roots.",
    )
    min_zoom: int = Field(10, ge=0, le=MAX_ZOOM_LIMIT)
    max_zoom: int = Field(18, ge=0, le=MAX_ZOOM_LIMIT)
    publish: bool = Field(True, description=f"Publish expirations on {EXPIRE_TOPIC}; false = result only.")
    # None: the bridge's own ceiling (BridgeLimits); a value above the ceiling is refused, never obeyed.
    max_tiles: int | None = Field(None, ge=1, description="Fail the job above this many expired tiles.")
    max_tiles_per_geometry: int | None = Field(None, ge=1)
    batch_max_tiles: int = Field(2_000, ge=1, le=100_000, description=f"Metatiles per {EXPIRE_TOPIC} message.")
    batch_max_bytes: int = Field(65_536, ge=64, le=8_000_000, description=f"Bytes per {EXPIRE_TOPIC} message.")
    # A name looked up among the bridge's --store options, never a path (services/spark_bridge/stores.py).
    store: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="A store this bridge was "
        "started with (--store): resolve the diff against its geometry, then apply it.",
    )
    sequence: int | None = Field(None, ge=0, description="With store: the diff's replication sequence number.")
    first_sequence: int | None = Field(
        None,
        ge=0,
        description="With sequence: the diff merges the replication "
        "diffs first_sequence..sequence (default: it is diff sequence alone).",
    )
    apply: bool = Field(True, description="With store: apply the diff to the store (false: expire only).")

    @model_validator(mode="after")
    def _zoom_order(self) -> Self:
        if self.min_zoom > self.max_zoom:
            raise ValueError(f"min_zoom ({self.min_zoom}) is greater than max_zoom ({self.max_zoom})")
        if self.store is None and (self.sequence is not None or not self.apply):
            raise ValueError("sequence and apply only go with store")
        if self.first_sequence is not None and (self.sequence is None or self.first_sequence > self.sequence):
            raise ValueError("first_sequence needs a sequence at or above it")
        return self


class StatsRequest(_Request):
    paths: list[str] = Field(..., min_length=1, max_length=MAX_PATHS, description="Render logs (JSON lines, .gz ok).")
    request_paths: list[str] = Field(
        default_factory=list,
        max_length=MAX_PATHS,
        description="Optional request logs (JSON lines with tile or zoom and time).",
    )
    window_seconds: int = Field(60, ge=1, le=86_400 * 31)
    since: float | None = Field(None, description="Only renders started at or after this epoch time.")
    until: float | None = Field(None, description="Only renders started before this epoch time.")
    chart: bool = Field(False, description="Also write chart.png.")
    output_dir: str | None = Field(
        None,
        description="A name: outputs go to <state-dir>/outputs/<name> (default <state-dir>/results/<job_id>); "
        "never a path.",
    )

    @model_validator(mode="after")
    def _time_order(self) -> Self:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        return self
