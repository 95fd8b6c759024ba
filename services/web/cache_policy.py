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

import argparse
import random
from dataclasses import dataclass
from email.utils import formatdate


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


def _band(text: str) -> tuple[int, int]:
    level, _, seconds = text.partition(":")
    try:
        return int(level), int(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ZOOM:SECONDS, e.g. 9:518400") from None


def add_cache_options(p: argparse.ArgumentParser) -> None:
    d = CachePolicy()
    g = p.add_argument_group("tile cache headers (mod_tile's ModTileCache* settings)")
    g.add_argument("--cache-max", type=int, default=d.max, help="longest max-age of any tile (DurationMax)")
    g.add_argument("--cache-minimum", type=int, default=d.minimum,
                   help="max-age floor of a fresh tile above the medium zooms (DurationMinimum)")
    g.add_argument("--cache-low-zoom", type=_band, default=(d.low_zoom_level, d.low_zoom), metavar="ZOOM:SECONDS",
                   help="max-age floor up to ZOOM (DurationLowZoom)")
    g.add_argument("--cache-medium-zoom", type=_band, default=(d.medium_zoom_level, d.medium_zoom),
                   metavar="ZOOM:SECONDS", help="max-age floor up to ZOOM (DurationMediumZoom)")
    g.add_argument("--cache-dirty", type=int, default=d.dirty,
                   help="max-age of a dirty tile, plus up to half of it at random (DurationDirty)")
    g.add_argument("--cache-age-factor", type=float, default=d.age_factor,
                   help="a fresh tile may be kept this fraction of its age (LastModifiedFactor)")
    g.add_argument("--cache-jitter", type=int, default=d.jitter, help="random hold-off added to a fresh tile's max-age")


def cache_policy_from(a: argparse.Namespace) -> CachePolicy:
    """The policy the options describe; ValueError naming the option that makes no sense."""
    numbers = {"--cache-max": a.cache_max, "--cache-minimum": a.cache_minimum, "--cache-dirty": a.cache_dirty,
               "--cache-jitter": a.cache_jitter, "--cache-low-zoom": a.cache_low_zoom[1],
               "--cache-medium-zoom": a.cache_medium_zoom[1]}
    for name, value in numbers.items():
        if value < 0:
            raise ValueError(f"{name} must not be negative")
    if a.cache_age_factor < 0:
        raise ValueError("--cache-age-factor must not be negative")
    return CachePolicy(max=a.cache_max, minimum=a.cache_minimum, low_zoom_level=a.cache_low_zoom[0],
                       low_zoom=a.cache_low_zoom[1], medium_zoom_level=a.cache_medium_zoom[0],
                       medium_zoom=a.cache_medium_zoom[1], dirty=a.cache_dirty, age_factor=a.cache_age_factor,
                       jitter=a.cache_jitter)
