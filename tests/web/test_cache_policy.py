"""mod_tile's cache heuristic and the on-disk freshness markers, without a bus."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

from services.toposm.freshness import FreshnessStore, nginx_lookup_map
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Metatile, Tile
from services.web.cache_policy import CachePolicy

DAY = 86_400


def test_fresh_max_age_is_the_zoom_floor_or_a_fraction_of_the_age_capped() -> None:
    policy = CachePolicy(jitter=0)
    assert policy.max_age(9, "fresh", 0) == 6 * DAY  # low zooms
    assert policy.max_age(13, "fresh", 0) == DAY  # medium zooms
    assert policy.max_age(17, "fresh", 0) == 3 * 3600  # the minimum above
    assert policy.max_age(17, "fresh", 10 * DAY) == 2 * DAY  # 0.2 x the age beats the floor
    assert policy.max_age(17, "fresh", 100 * DAY) == 7 * DAY  # never past the max


def test_jitter_and_dirty_hold_off_stay_in_bounds() -> None:
    policy = CachePolicy()
    rng = random.Random(1)
    fresh = {policy.max_age(17, "fresh", 0, rng) for _ in range(200)}
    assert min(fresh) >= 3 * 3600 and max(fresh) <= 6 * 3600 and len(fresh) > 100
    dirty = {policy.max_age(17, "dirty", 100 * DAY, rng) for _ in range(200)}
    assert min(dirty) >= 900 and max(dirty) <= 1350


def test_dirty_until_rendered_again_and_missing_never_marked(tmp_path: Path) -> None:
    tiles = TileStore(tmp_path)
    fresh = FreshnessStore(tiles)
    tile = Tile(12, 1001, 2047)
    assert fresh.state(tile).state == "missing"
    assert fresh.expire([tile.metatile]) == 0  # never rendered: missing, not dirty
    tiles.write({t: b"png" for t in tile.metatile.tiles()})
    os.utime(tiles.path(tile), (1000, 1000))
    assert fresh.state(tile).state == "fresh"
    assert fresh.expire([tile.metatile], when=2000) == 1
    assert fresh.state(tile).state == "dirty"
    assert FreshnessStore(tiles).state(tile).state == "dirty"  # another server of the root sees it
    tiles.write({tile: b"png"})  # rendered again now, after the expiry
    assert fresh.state(tile).state == "fresh"
    assert not fresh.marker(tile.metatile).exists()


def test_the_nginx_lookup_finds_every_metatiles_marker() -> None:
    """What front.py's regex and map compute from /tiles/z/x/y.png is marker()'s path, for every tile."""
    lookup = dict(nginx_lookup_map())
    store = FreshnessStore(TileStore("/t"))
    for x, y in [(0, 0), (7, 8), (999, 1000), (1007, 123456), (2**20 - 1, 5), (124_999, 125_000)]:
        tx, ty = str(x), str(y)
        hi = lambda s: s[:-3] or "0"  # noqa: E731 - the regex's (?<xh>...) part, "0" by the map when empty
        lo = lambda s: s[-3:]  # noqa: E731
        computed = f"/t/.expired/20/{hi(tx)}/{hi(ty)}/{lookup[lo(tx)]}-{lookup[lo(ty)]}"
        assert computed == str(store.marker(Tile(20, x, y).metatile)), (x, y)
    assert re.fullmatch(r"\d+", str(len(lookup))) and len(lookup) == 1110
    assert str(store.marker(Metatile(2, 0, 0))) == "/t/.expired/2/0/0/0-0"
