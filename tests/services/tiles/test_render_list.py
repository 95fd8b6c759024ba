"""``toposm-render-list`` on the real broker, with the real queuemaster and Mapnik renderers drawing the
Helsinki extract: an area pre-rendered (every metatile mercantile says is in it, each once), skipped with
``--missing-only``, stopped with SIGINT (what it queued withdrawn) and resumed to the end, while an
on-demand request is answered by the render thread the bulk limit keeps free."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import mercantile

from harness import HANG, eventually
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Metatile, Tile
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data  # noqa: F401 - session fixtures

from .conftest import BIN, TileBus, stats, wait_renderers

ROOT = Path(__file__).resolve().parents[3]
LIST_HANG = 4 * HANG  # only catches a render-list that never ends
EXTRACT = (24.9351766, 60.1641551, 24.9534132, 60.1791074)  # the Helsinki extract's nodes
AROUND = (24.90, 60.15, 24.98, 60.19)  # the extract and the sea and land around it


def bbox_text(bbox: tuple[float, ...]) -> str:
    return ",".join(str(v) for v in bbox)


def expected_metatiles(bbox: tuple[float, ...], zooms: range) -> set[Metatile]:
    """The oracle: the metatiles of the tiles mercantile finds in the box."""
    return {Tile(t.z, t.x, t.y).metatile for t in mercantile.tiles(*bbox, zooms=list(zooms))}


def render_list_command() -> list[str]:
    script = BIN / "toposm-render-list"  # absent until the venv is re-installed with the new entry point
    return [str(script)] if script.exists() else [sys.executable, "-m", "services.tiles.render_list.main"]


async def start_render_list(bus: TileBus, *args: str) -> asyncio.subprocess.Process:
    log = open(bus.tmp / "render-list.log", "ab")  # noqa: SIM115 - the child keeps it
    try:
        return await asyncio.create_subprocess_exec(
            *render_list_command(),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env={**os.environ, "QBROKER_URL": bus.url, "PYTHONPATH": str(ROOT)},
        )
    finally:
        log.close()


async def finished(proc: asyncio.subprocess.Process) -> tuple[int, dict[str, Any]]:
    out, _ = await asyncio.wait_for(proc.communicate(), LIST_HANG)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out.decode().strip().splitlines()[-1])


def ok_renders(bus: TileBus, among: set[Metatile]) -> list[str]:
    return [
        r["metatile"]
        for r in bus.render_log_lines()
        if r["status"] == "ok" and Metatile(*map(int, r["metatile"].split("/"))) in among
    ]


async def test_an_area_is_pre_rendered_once_then_skipped(bus: TileBus, imported_store: Path) -> None:  # noqa: F811
    expected = expected_metatiles(EXTRACT, range(13, 17))
    bus.queuemaster()
    bus.renderer("--store", str(imported_store), backend="mapnik", threads=2)
    client = await bus.client()
    await wait_renderers(client, 2, timeout=60)

    code, report = await finished(
        await start_render_list(bus, "--bbox", bbox_text(EXTRACT), "--zooms", "13-16", "--window", "4", "--json")
    )
    assert code == 0, (bus.tmp / "render-list.log").read_text()
    assert report["metatiles"] == len(expected) == report["rendered"] and report["complete"]
    assert report["skipped"] == report["failed"] == 0
    assert {z: row["rendered"] for z, row in report["by_zoom"].items()} == {
        str(z): sum(1 for m in expected if m.z == z) for z in range(13, 17)
    }
    assert sorted(ok_renders(bus, expected)) == sorted(str(m) for m in expected)  # each once
    store = TileStore(bus.tile_root)
    assert all(store.metatile_exists(m) for m in expected)

    code, report = await finished(
        await start_render_list(bus, "--bbox", bbox_text(EXTRACT), "--zooms", "13-16", "--missing-only", "--json")
    )
    assert code == 0 and report["skipped"] == len(expected) and report["rendered"] == 0
    assert len(ok_renders(bus, expected)) == len(expected)  # nothing drawn again
    assert (await stats(client))["counters"]["bulk_skipped"] == len(expected)


async def test_stopped_and_resumed_while_requests_get_a_free_thread(bus: TileBus, imported_store: Path) -> None:  # noqa: F811
    expected = expected_metatiles(AROUND, range(13, 16))
    resume = bus.tmp / "resume.json"
    bus.queuemaster("--max-bulk-threads", "1")
    bus.renderer("--store", str(imported_store), "--render-delay", "0.5", backend="mapnik", threads=2)
    client = await bus.client()
    await wait_renderers(client, 2, timeout=60)
    args = (
        "--bbox",
        bbox_text(AROUND),
        "--zooms",
        "13-15",
        "--window",
        "4",
        "--resume",
        str(resume),
        "--json",
        "--drain-timeout",
        "60",
    )
    proc = await start_render_list(bus, *args)

    def settled() -> int:
        try:
            progress = json.loads(resume.read_text())
        except (OSError, ValueError):
            return 0
        return int(progress["next"]) + len(progress["settled_ahead"])

    await eventually(lambda: settled() >= 2, timeout=LIST_HANG)
    # A viewer's tile (z17: not in the job): one thread is never given bulk work, so it renders this at once.
    answer = await client.call("toposm.queuemaster", {"command": "render", "tile": "17/74620/37939"}, timeout=60)
    assert answer["command"] == "rendered"
    during = await stats(client)
    assert proc.returncode is None  # the bulk job is still going: the request did not wait for it
    assert during["queues"]["rendering_by_class"].get("bulk", 0) <= 1
    assert during["thread_limits"] == {"background": None, "bulk": 1}

    proc.send_signal(signal.SIGINT)
    code, first = await finished(proc)
    assert code == 3 and not first["complete"] and 2 <= first["settled"] < len(expected)

    async def withdrawn() -> bool:  # what it had queued is gone; nothing of it renders any more
        s = await stats(client)
        return s["queues"]["bulk"] == 0 and s["queues"]["rendering"] == 0

    await eventually(withdrawn, timeout=60)
    assert settled() == first["settled"]
    assert len(ok_renders(bus, expected)) == first["rendered"]

    code, second = await finished(await start_render_list(bus, *args))
    assert code == 0 and second["complete"] and second["settled"] == len(expected)
    assert second["rendered"] == len(expected) and second["failed"] == 0  # counts carried over from the file
    assert sorted(ok_renders(bus, expected)) == sorted(str(m) for m in expected)  # each exactly once
