"""Request models of the bridge's endpoints (the wire boundary)."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.spark_bridge.tilemath import MAX_ZOOM_LIMIT


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
        description="osmChange (.osc/.osc.gz), expire lists (z/x/y "
        "per line), Parquet or CSV with lon/lat columns; paths on the bridge host.",
    )
    min_zoom: int = Field(10, ge=0, le=MAX_ZOOM_LIMIT)
    max_zoom: int = Field(18, ge=0, le=MAX_ZOOM_LIMIT)
    publish: bool = Field(True, description="Publish expirations on expire_toposm; false = result only.")
    max_tiles: int = Field(50_000_000, ge=1, description="Fail the job above this many expired tiles.")
    max_tiles_per_geometry: int = Field(10_000_000, ge=1)
    batch_max_tiles: int = Field(2_000, ge=1, le=100_000, description="Metatiles per expire_toposm message.")
    batch_max_bytes: int = Field(65_536, ge=64, le=8_000_000, description="Bytes per expire_toposm message.")

    @model_validator(mode="after")
    def _zoom_order(self) -> Self:
        if self.min_zoom > self.max_zoom:
            raise ValueError(f"min_zoom ({self.min_zoom}) is greater than max_zoom ({self.max_zoom})")
        return self


class StatsRequest(_Request):
    paths: list[str] = Field(..., min_length=1, description="Render logs (JSON lines, optionally .gz).")
    request_paths: list[str] = Field(
        default_factory=list, description="Optional request logs (JSON lines with tile or zoom and time)."
    )
    window_seconds: int = Field(60, ge=1, le=86_400 * 31)
    since: float | None = Field(None, description="Only renders started at or after this epoch time.")
    until: float | None = Field(None, description="Only renders started before this epoch time.")
    chart: bool = Field(False, description="Also write chart.png.")
    output_dir: str | None = Field(
        None, description="Where to write stats.json/*.parquet; default <state-dir>/results/<job_id>."
    )

    @model_validator(mode="after")
    def _time_order(self) -> Self:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        return self
