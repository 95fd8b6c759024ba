"""``GET /api/extent`` scans the tile root on the thread pool that also reads tiles: requests that arrive
while a scan runs share it, so a flood of them holds one thread, not all of them."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from harness import HANG
from services.toposm.tile_store import TileStore
from services.web.extent import SharedScan, tile_root_extent

EMPTY = {"zoom": None, "bounds": None}


async def test_requests_during_a_scan_share_it_and_a_later_one_scans_again() -> None:
    started, release = threading.Event(), threading.Event()
    scans: list[int] = []

    def blocking_scan() -> dict[str, Any]:
        scans.append(1)
        started.set()
        release.wait(HANG)
        return EMPTY

    shared = SharedScan(blocking_scan)
    first = asyncio.ensure_future(shared.get())
    assert await asyncio.to_thread(started.wait, HANG)
    flood = [asyncio.ensure_future(shared.get()) for _ in range(200)]
    flood[0].cancel()  # a client that went away cancels its own wait, not the scan
    release.set()
    assert await first == EMPTY
    assert [await waiter for waiter in flood[1:]] == [EMPTY] * 199
    assert len(scans) == 1
    started.clear()
    assert await shared.get() == EMPTY
    assert len(scans) == 2


async def test_the_shared_scan_reads_the_tile_root(tmp_path: Path) -> None:
    store = TileStore(tmp_path)
    shared = SharedScan(lambda: tile_root_extent(store))
    assert await shared.get() == EMPTY
    (tmp_path / "12" / "2331").mkdir(parents=True)
    (tmp_path / "12" / "2331" / "1185.png").write_bytes(b"")
    answer = await shared.get()
    (south, west), (north, east) = answer["bounds"]
    assert answer["zoom"] == 12 and south < 60.17 < north and west < 24.94 < east
