"""``--tile-store meta``: metatiles written as mod_tile ``.meta`` files, read back by a reader written here from
mod_tile's documented layout (includes/metatile.h, src/metatile.cpp, src/store_file_utils.c), not from ours."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

from services.tiles.renderer.backends import create_backend
from services.tiles.renderer.worker import render_metatile
from services.toposm.tile_store import MetaTileStore, TileStore, open_tile_store
from services.toposm.tilemath import Metatile, Tile
from services.web.extent import tile_root_extent

METATILE = 8


def mod_tile_path(root: Path, x: int, y: int, z: int) -> Path:
    """xyz_to_meta with DIRECTORY_HASH: x, y rounded down to the metatile, then five bytes of one nibble of x
    over one nibble of y, lowest first, written highest first."""
    x &= ~(METATILE - 1)
    y &= ~(METATILE - 1)
    hashed = []
    for _ in range(5):
        hashed.append(((x & 0x0F) << 4) | (y & 0x0F))
        x >>= 4
        y >>= 4
    return root / str(z) / str(hashed[4]) / str(hashed[3]) / str(hashed[2]) / str(hashed[1]) / f"{hashed[0]}.meta"


def read_meta(path: Path) -> tuple[bytes, int, tuple[int, int, int], dict[tuple[int, int], bytes]]:
    """struct meta_layout: char magic[4]; int count; int x, y, z; struct entry {int offset; int size} index[count];
    then the data, offsets from the start of the file. Tile (x, y) is entry (x & 7) * 8 + (y & 7)."""
    data = path.read_bytes()
    magic, count, x, y, z = struct.unpack_from("<4siiii", data, 0)
    tiles = {}
    for i in range(count):
        offset, size = struct.unpack_from("<ii", data, 20 + 8 * i)
        assert 0 <= offset and offset + size <= len(data)
        if size:
            tiles[(x + i // METATILE, y + i % METATILE)] = data[offset : offset + size]
    return magic, count, (x, y, z), tiles


def test_a_metatile_is_one_meta_file_in_mod_tiles_layout(tmp_path: Path) -> None:
    metatile = Tile(12, 2331, 1185).metatile  # central Helsinki
    tiles = create_backend("testpattern").render(metatile)
    store = MetaTileStore(tmp_path / "meta")
    store.write(tiles)
    path = tmp_path / "meta" / "12/0/0/148/26/128.meta"  # 2328 = 0x918, 1184 = 0x4a0, worked out by hand
    assert path == mod_tile_path(tmp_path / "meta", 2331, 1185, 12) == store.path(Tile(12, 2335, 1191))
    assert [p for p in (tmp_path / "meta").rglob("*") if p.is_file()] == [path]  # nothing else, no PNG
    magic, count, header, stored = read_meta(path)
    assert (magic, count, header) == (b"META", 64, (2328, 1184, 12))
    assert stored == {(t.x, t.y): data for t, data in tiles.items()}
    assert path.stat().st_size == 20 + 64 * 8 + sum(len(d) for d in tiles.values())
    assert all(store.read(t) == data for t, data in tiles.items())
    assert oct(path.stat().st_mode & 0o777) == "0o644"

    png = TileStore(tmp_path / "png")
    png.write(tiles)
    assert tile_root_extent(store) == tile_root_extent(png)  # the map opens at the same place


def test_low_zooms_have_empty_entries_and_the_worker_writes_either_kind(tmp_path: Path) -> None:
    render_metatile("testpattern", str(tmp_path), "1/0/0", tile_store="meta")
    magic, count, header, stored = read_meta(tmp_path / "1/0/0/0/0/0.meta")
    assert (magic, count, header) == (b"META", 64, (0, 0, 1))
    assert sorted(stored) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # the zoom's four tiles; 60 entries of size 0
    store = open_tile_store(tmp_path, "meta")
    assert store.metatile_exists(Metatile(1, 0, 0)) and not store.metatile_exists(Metatile(2, 0, 0))
    assert store.read(Tile(1, 1, 1)) == stored[(1, 1)]
    assert not (tmp_path / "1/0/0.png").exists()


def test_expiry_sets_the_meta_file_back_twenty_years_as_mod_tile_does(tmp_path: Path) -> None:
    store = MetaTileStore(tmp_path)
    metatile = Metatile(14, 100, 200)
    store.write(create_backend("testpattern").render(metatile))
    path = store.path(metatile.top_left)
    now = time.time()
    os.utime(path, (now, now))
    store.mark_expired(metatile)
    back = time.gmtime(path.stat().st_mtime)
    assert back.tm_year == time.gmtime(now).tm_year - 20
    os.utime(path, (now, 946_684_800))  # 2000-01-01: mod_tile takes a file from before 2006 as expired already
    store.mark_expired(metatile)
    assert path.stat().st_mtime == 946_684_800


def test_a_damaged_or_foreign_meta_file_reads_as_missing(tmp_path: Path) -> None:
    store = MetaTileStore(tmp_path)
    metatile = Metatile(14, 100, 200)
    store.write(create_backend("testpattern").render(metatile))
    path = store.path(metatile.top_left)
    tile = metatile.top_left
    good = path.read_bytes()
    path.write_bytes(good[:300])
    assert store.read(tile) is None
    path.write_bytes(b"METZ" + good[4:])
    assert store.read(tile) is None
    path.write_bytes(good[:8] + struct.pack("<i", 8) + good[12:])  # another metatile's header
    assert store.read(tile) is None


def test_zooms_past_twenty_are_refused_not_written_over_other_metatiles(tmp_path: Path) -> None:
    """mod_tile's path hashes five nibbles of x and y: from zoom 21 two metatiles share a file (mod_tile stops
    at 20). A render there must fail, not overwrite the other metatile (then taken for rendered by the
    queuemaster, which asks whether the file is there), and a queuemaster or toposm-web set up for it refuses
    to start."""
    import subprocess
    import sys

    import pytest

    from harness import HANG

    store = MetaTileStore(tmp_path)
    first, second = Metatile(21, 0, 0), Metatile(21, 1 << 17, 0)  # one file: 21/0/0/0/0/0.meta
    for metatile in (first, second):
        with pytest.raises(ValueError, match="20"):
            store.write({metatile.top_left: b"tile"})
    assert not list(tmp_path.rglob("*.meta"))
    assert not store.metatile_exists(first) and not store.metatile_exists(second)
    for script in ("toposm-queuemaster", "toposm-web"):
        run = subprocess.run(
            [
                str(Path(sys.executable).parent / script),
                "--tile-root",
                str(tmp_path),
                "--tile-store",
                "meta",
                "--max-zoom",
                "21",
            ],
            capture_output=True,
            text=True,
            timeout=HANG,
        )
        assert run.returncode == 64 and "20" in run.stderr, (script, run.stderr[-1000:])
