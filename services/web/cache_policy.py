"""How long browsers and caches may keep a tile: mod_tile's ``add_expiry`` heuristic.

* a **dirty** tile (expired, its render queued) is served at once with a short max-age: ``dirty`` seconds
  plus a random hold-off of up to half of that, so the clients that saw it do not all come back at once;
* a **fresh** tile may be kept for the zoom band's floor (``low_zoom`` up to ``low_zoom_level``,
  ``medium_zoom`` up to ``medium_zoom_level``, ``minimum`` above) or ``age_factor`` x the time since it
  was rendered if that is longer (a tile unchanged for long is likely to stay unchanged), plus a random
  hold-off of up to ``jitter`` seconds, never more than ``max``;
* anything that is not a tile (a refusal, a timeout) is ``no-store``.

The defaults are those of tile.openstreetmap.org's mod_tile (``ModTileCacheDurationMax 604800``,
``...Dirty 900``, ``...Minimum 10800``, ``...MediumZoom 13 86400``, ``...LowZoom 9 518400``,
``ModTileCacheLastModifiedFactor 0.20``, a 3 h hold-off).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from email.utils import formatdate
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, field_validator
from pydantic_settings import NoDecode

from qbroker.settings import option


@dataclass(frozen=True)
class CachePolicy:
    max: int = 604_800
    minimum: int = 10_800
    low_zoom_level: int = 9
    low_zoom: int = 518_400
    medium_zoom_level: int = 13
    medium_zoom: int = 86_400
    dirty: int = 900
    age_factor: float = 0.20
    jitter: int = 10_800

    def floor(self, zoom: int) -> int:
        """The zoom band's max-age floor (also what the nginx front serves a hit with, see front.py)."""
        if zoom <= self.low_zoom_level:
            band = self.low_zoom
        elif zoom <= self.medium_zoom_level:
            band = self.medium_zoom
        else:
            band = self.minimum
        return min(band, self.max)

    def max_age(self, zoom: int, state: str, age: float, rng: random.Random | None = None) -> int:
        draw = (rng or random).random()  # noqa: S311 - spreading cache expiry, not a secret
        if state == "dirty":
            return min(int(self.dirty + self.dirty / 2 * draw), self.max)
        by_age = int(max(age, 0.0) * self.age_factor)
        return min(max(self.floor(zoom), by_age) + int(self.jitter * draw), self.max)

    def headers(self, zoom: int, state: str, age: float, now: float) -> dict[str, str]:
        seconds = self.max_age(zoom, state, age)
        return {"Cache-Control": f"public, max-age={seconds}", "Expires": formatdate(now + seconds, usegmt=True)}


NO_STORE = {"Cache-Control": "no-store"}


def _band(text: object) -> object:
    if not isinstance(text, str):
        return text
    level, _, seconds = text.partition(":")
    try:
        return int(level), int(seconds)
    except ValueError:
        raise ValueError(f"{text!r}: expected ZOOM:SECONDS, e.g. 9:518400") from None


ZoomBand = Annotated[tuple[int, int], NoDecode, BeforeValidator(_band)]
_D = CachePolicy()
_GROUP = "tile cache headers (mod_tile's ModTileCache* settings)"


class CacheOptions(BaseModel):
    """toposm-web's options for its cache headers (the program's settings inherit them)."""

    cache_max: int = option(_D.max, "longest max-age of any tile (DurationMax)", group=_GROUP, ge=0)
    cache_minimum: int = option(
        _D.minimum, "max-age floor of a fresh tile above the medium zooms (DurationMinimum)", group=_GROUP, ge=0
    )
    cache_low_zoom: ZoomBand = option(
        (_D.low_zoom_level, _D.low_zoom),
        "max-age floor up to ZOOM (DurationLowZoom)",
        metavar="ZOOM:SECONDS",
        group=_GROUP,
        default_text=f"{_D.low_zoom_level}:{_D.low_zoom}",
    )
    cache_medium_zoom: ZoomBand = option(
        (_D.medium_zoom_level, _D.medium_zoom),
        "max-age floor up to ZOOM (DurationMediumZoom)",
        metavar="ZOOM:SECONDS",
        group=_GROUP,
        default_text=f"{_D.medium_zoom_level}:{_D.medium_zoom}",
    )
    cache_dirty: int = option(
        _D.dirty, "max-age of a dirty tile, plus up to half of it at random (DurationDirty)", group=_GROUP, ge=0
    )
    cache_age_factor: float = option(
        _D.age_factor, "a fresh tile may be kept this fraction of its age (LastModifiedFactor)", group=_GROUP, ge=0
    )
    cache_jitter: int = option(_D.jitter, "random hold-off added to a fresh tile's max-age", group=_GROUP, ge=0)

    @field_validator("cache_low_zoom", "cache_medium_zoom")
    @classmethod
    def _seconds_not_negative(cls, band: tuple[int, int]) -> tuple[int, int]:
        if band[1] < 0:
            raise ValueError("must not be negative")
        return band

    def cache_policy(self) -> CachePolicy:
        """The policy the options describe."""
        return CachePolicy(
            max=self.cache_max,
            minimum=self.cache_minimum,
            low_zoom_level=self.cache_low_zoom[0],
            low_zoom=self.cache_low_zoom[1],
            medium_zoom_level=self.cache_medium_zoom[0],
            medium_zoom=self.cache_medium_zoom[1],
            dirty=self.cache_dirty,
            age_factor=self.cache_age_factor,
            jitter=self.cache_jitter,
        )
