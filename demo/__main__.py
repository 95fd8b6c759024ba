"""``bin/demo``: import the real Helsinki extract, start the TopOSM queuemaster, Mapnik renderers and the Spark
bridge on the local broker, request map tiles, publish a real-looking OSM edit as a replication diff and let
``toposm-replicate`` apply it (Spark expires the tiles it touches, the renderers redraw them: before/after
pictures), and compute render stats with Spark. Map data © OpenStreetMap contributors (ODbL).

    bin/demo [--workdir var/demo] [--renderers 2] [--web-port 8080] [--keep-running]

The live status page and the slippy map (toposm-web) run beside the services from the start; their URLs
are printed first, and ``--keep-running`` leaves everything up after the demo until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import qbroker
from demo.accounts import DemoAccounts, demo_accounts
from demo.leftovers import PidFile, clear_leftovers, stop_on_signals
from demo.osm_changes import DemoEdit, helsinki_edit, publish
from demo.stack import free_port, start_stack, tile_at, write_overview
from qbroker import QBrokerError, Unit
from qbroker.log import configure_logging
from services.tiles.contract import QUEUEMASTER, SPARK_JOB, SPARK_STATS
from services.tiles.tile_store import TileStore
from services.tiles.tilemath import Metatile

BIN = Path(sys.executable).parent


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


async def wait_until_answering(unit: Unit, name: str, body: dict[str, Any], within: float) -> Any:
    deadline = time.monotonic() + within
    while True:
        try:
            return await unit.call(name, body, timeout=5)
        except QBrokerError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def wait_queue_empty(unit: Unit, within: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        stats: dict[str, Any] = await unit.call(QUEUEMASTER, {"command": "stats"})
        if not stats["queues"]["total"] and not stats["queues"]["rendering"]:
            return stats
        if time.monotonic() > deadline:
            raise TimeoutError("the render queue did not drain")
        await asyncio.sleep(0.5)


async def wait_web(url: str, within: float = 60) -> None:
    """Until toposm-web answers its JSON status (it starts beside the other services)."""
    import aiohttp

    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url + "/api/status") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"toposm-web did not answer at {url}")
            await asyncio.sleep(0.3)


def changed_pixels(before: Path, after: Path) -> int:
    from PIL import Image, ImageChops

    diff = ImageChops.difference(Image.open(before).convert("RGB"), Image.open(after).convert("RGB")).convert("L")
    histogram = diff.point(lambda v: 255 if v else 0).histogram()
    return int(histogram[255])


async def replicate(workdir: Path, store: Path, env: dict[str, str] | None) -> dict[str, Any]:
    """Run toposm-replicate once over the demo's replication directory; returns STORE/replication.json."""
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "toposm-replicate"), "--source", str(workdir / "replication"), "--store", str(store),
        "--start", "1", "--once", "--min-zoom", "12", "--max-zoom", "17",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)
    PidFile(workdir).add(proc.pid)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 600)
    except BaseException:  # interrupted (a signal, a timeout): it must not outlive the demo
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    (workdir / "replicate.log").write_bytes(out)
    if proc.returncode != 0:
        raise RuntimeError(f"toposm-replicate failed ({proc.returncode}): {out.decode()[-1000:]}")
    status: dict[str, Any] = json.loads((store / "replication.json").read_text())
    return status


async def run(workdir: Path, renderers: int, web_url: str, keep_running: bool, edit: DemoEdit, store: Path,
              replicate_env: dict[str, str] | None) -> None:
    lon, lat = edit.centre
    async with Unit("qbroker.demo") as unit:
        await wait_web(web_url)
        # The map opens on the data anyway; this link opens it on the edited street, in the map's own URL form.
        street_map = f"{web_url}/map#map=17/{lat:.5f}/{lon:.5f}"
        step(f"live status page {web_url}/   slippy map {web_url}/map   metrics {web_url}/metrics")
        print(f"  the edited street (Mikonkatu) on the map: {street_map}", flush=True)
        step("waiting for the queuemaster, the renderers and the Spark bridge")
        deadline = time.monotonic() + 120
        while len((await wait_until_answering(unit, QUEUEMASTER, {"command": "stats"}, 60))["renderers"]) < renderers:
            if time.monotonic() > deadline:
                raise TimeoutError("renderers did not register")
            await asyncio.sleep(0.5)
        await wait_until_answering(unit, SPARK_JOB, {"command": "list"}, 180)
        async for reply in unit.gather("qbroker.ping", {}, timeout=3, gap=1.0):
            info = reply.body
            if info["uuid"] != unit.uuid:
                print(f"  {info['app']:<22} {info['uuid'][:8]}  pid {info['pid']:<7} {', '.join(info['endpoints'])}")

        step(f"requesting the tiles of central Helsinki at {lon:.4f},{lat:.4f}, zooms 10-17 (answered when drawn)")
        started = time.monotonic()
        tiles = [tile_at(lon, lat, z) for z in range(10, 18)]
        replies = await asyncio.gather(*(unit.call(QUEUEMASTER, {"command": "render", "tile": str(t)}, timeout=180)
                                         for t in tiles))
        for reply in replies:
            print(f"  {reply['tile']:<16} rendered (metatile {reply['metatile']})")
        print(f"  {len(replies)} tiles in {time.monotonic() - started:.1f}s")
        before = (await unit.call(QUEUEMASTER, {"command": "stats"}))["counters"]
        tile_store = TileStore(workdir / "tiles")
        for z in (16, 17):
            write_overview(tile_store, tile_at(lon, lat, z).metatile, workdir / f"before-{z}.png")

        step(f"an OSM edit published as replication diff 1: {edit.streets and 'Mikonkatu'} renamed "
             f"Qbrokerinkatu, node {edit.moved_node} moved, building {edit.new_building} drawn")
        diff = publish(workdir / "replication", 1, edit.text, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        print(f"  {diff.relative_to(workdir)} and state.txt written; running toposm-replicate --once")
        status = await replicate(workdir, store, replicate_env)
        inputs = status.get("inputs") or {}
        print(f"  applied sequence {status['sequence']}: {status['metatiles']} metatiles expired (zooms 12-17); "
              f"ways resolved from the geometry store: {inputs.get('ways')}, moved nodes: {inputs.get('moved_nodes')}")
        await asyncio.sleep(1.0)  # the expirations are broadcasts: let the queuemaster take them in
        after = await wait_queue_empty(unit)
        print(f"  queuemaster: {after['counters']['expired'] - before['expired']} metatiles expired, "
              f"{after['counters']['rendered'] - before['rendered']} re-rendered")
        for z in (16, 17):
            write_overview(tile_store, tile_at(lon, lat, z).metatile, workdir / f"after-{z}.png")
            changed = changed_pixels(workdir / f"before-{z}.png", workdir / f"after-{z}.png")
            print(f"  z{z}: before-{z}.png / after-{z}.png differ in {changed} pixels")

        step("render stats from the queuemaster's render log, computed by Spark")
        stats = await unit.call(SPARK_STATS, {"paths": [str((workdir / "render.log").resolve())], "wait": True,
                                                "chart": True}, timeout=300)
        summary = stats.get("result", stats)
        print(f"  {'zoom':>4} {'renders':>8} {'failures':>8} {'p50 s':>7} {'p95 s':>7} {'p99 s':>7}")
        for row in summary.get("per_zoom", []):
            print(f"  {row['zoom']:>4} {row['renders']:>8} {row['failures']:>8} {row['p50']:>7.3f} "
                  f"{row['p95']:>7.3f} {row['p99']:>7.3f}")
        for row in summary.get("per_host", []):
            print(f"  host {row['host']}: {row['renders']} renders by {row['renderers']} renderers, "
                  f"p95 {row['p95']:.3f}s")
        outputs = summary.get("outputs") or {}
        if outputs:
            print(f"  written: {outputs.get('json')}, {len(outputs.get('parquet') or {})} Parquet tables, "
                  f"chart {outputs.get('chart')}")

        step("the same from the shell: qbroker call toposm.queuemaster stats")
        cli = subprocess.run([str(BIN / "qbroker"), "call", QUEUEMASTER, "stats"], capture_output=True, text=True,
                             timeout=60, env=os.environ)
        print("  $ qbroker call toposm.queuemaster stats")
        print("\n".join("  " + line for line in cli.stdout.splitlines()[:25]))

        overviews = []
        for z in (13, 15, 16):
            metatile: Metatile = tile_at(lon, lat, z).metatile
            path = workdir / f"overview-{z}.png"
            write_overview(tile_store, metatile, path)
            overviews.append(str(path))
        step(f"map tiles are in {workdir / 'tiles'}; overview mosaics: {', '.join(overviews)}")
        print("  map data © OpenStreetMap contributors (ODbL 1.0)")
        if keep_running:
            step(f"still running: status {web_url}/  map {street_map}  (Ctrl-C, SIGTERM or SIGHUP stops)")
            await asyncio.Event().wait()


def can_provision_here() -> tuple[bool, str]:
    """Whether this demo can make its own broker accounts: a local broker and a usable rabbitmqctl."""
    host = urlsplit(qbroker.Config().urls[0]).hostname or ""
    if host not in ("127.0.0.1", "localhost", "::1"):
        return False, f"the broker at {host} is not on this host"
    if shutil.which("rabbitmqctl") is None or os.geteuid() != 0:
        return False, "rabbitmqctl is not available to this user; run as root for per-program accounts"
    return True, "local broker, rabbitmqctl available"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("var/demo"))
    parser.add_argument("--renderers", type=int, default=2)
    parser.add_argument("--web-port", type=int, default=8080, help="toposm-web's port (another if taken)")
    parser.add_argument("--keep-running", action="store_true",
                        help="leave the services up until Ctrl-C (or SIGTERM, SIGHUP)")
    parser.add_argument("--accounts", action=argparse.BooleanOptionalAction, default=None,
                        help="one broker account per program, made with `qbroker provision` (needs rabbitmqctl "
                        "on this host) and deleted afterwards; see docs/security.md. Default: on when the "
                        "broker is local and rabbitmqctl can be run here")
    args = parser.parse_args()
    # A closed terminal (SIGHUP), `timeout` or a supervisor (SIGTERM) stop the demo as Ctrl-C does.
    stop_on_signals(signal.SIGTERM, signal.SIGHUP)
    # The demo's own corner of the broker: a prefix keeps it out of the way of other traffic on the vhost.
    os.environ.setdefault("QBROKER_EXCHANGE_PREFIX", "demo.")
    os.environ.setdefault("QBROKER_LOG_LEVEL", "WARNING")
    configure_logging()
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"qbroker demo on {qbroker.Config().urls[0].split('@')[-1]} (exchange prefix "
          f"{os.environ['QBROKER_EXCHANGE_PREFIX']!r}); logs in {workdir}")
    use_accounts, why = (args.accounts, "as asked") if args.accounts is not None else can_provision_here()
    done = "services stopped." + (" Broker accounts deleted." if use_accounts else "")
    try:
        cleared = clear_leftovers(workdir, accounts=use_accounts)
        if cleared:
            print(f"  {cleared}")
        print(f"  broker accounts per program: {'yes' if use_accounts else 'no'} ({why})")
        with contextlib.ExitStack() as stack:
            accounts = None
            if use_accounts:
                accounts = stack.enter_context(demo_accounts(workdir, qbroker.Config().url,
                                                             os.environ["QBROKER_EXCHANGE_PREFIX"]))
                # this process (and the `qbroker call` it runs) is a client like any other
                os.environ.update({k: v for k, v in accounts.env("client").items() if k.startswith("QBROKER_")})
                print(f"  accounts: {', '.join(sorted(accounts.names.values()))}")
            run_demo(args, workdir, accounts)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM/SIGHUP (stop_on_signals)
        print(f"\ndemo stopped ({stop or 'SIGINT'}): {done}", flush=True)
        return
    print(f"\ndemo finished: {done}")


def prepare_data(workdir: Path) -> tuple[Path, DemoEdit]:
    """The real extract (bin/ensure-osm-data), imported afresh into WORKDIR/helsinki; a fresh replication dir."""
    import shutil

    from services.osmstore.importer import import_extract

    root = Path(__file__).resolve().parents[1]
    data = subprocess.run([str(root / "bin" / "ensure-osm-data")], cwd=root, capture_output=True, text=True,
                          timeout=600, check=True).stdout.strip()
    extract = root / data / "Helsinki.osm.pbf"
    step(f"importing {extract.name} (OpenStreetMap, ODbL) into {workdir / 'helsinki'}")
    started = time.monotonic()
    info = import_extract(extract, workdir / "helsinki", replace=True)
    print(f"  {info['counts']} in {time.monotonic() - started:.1f}s: rendering store (SQLite R*Tree) and "
          f"geometry store (Parquet, {info['geometry']['way_nodes']} way-node rows)")
    shutil.rmtree(workdir / "replication", ignore_errors=True)
    return workdir / "helsinki", helsinki_edit(extract)


def run_demo(args: argparse.Namespace, workdir: Path, accounts: DemoAccounts | None) -> None:
    store, edit = prepare_data(workdir)
    bridge_log = open(workdir / "spark-bridge.log", "ab")  # noqa: SIM115 - closed with the process
    bridge = subprocess.Popen(
        [str(BIN / "qbroker-spark-bridge"), "--master", "local[2]", "--state-dir", str(workdir / "spark-state"),
         "--store", str(store),  # the store replication diffs are resolved against and applied to
         "--input-root", str(workdir),  # the demo's changes and render log live here
         "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4"],
        stdout=bridge_log, stderr=subprocess.STDOUT, start_new_session=True,
        env=accounts.env("spark") if accounts is not None else None,
    )
    pids = PidFile(workdir)
    pids.add(bridge.pid)
    try:
        port = free_port(args.web_port)
        with start_stack(workdir, renderers=args.renderers, backend="mapnik", web_port=port,
                         env_for=accounts.env if accounts is not None else None, store=store) as procs:
            pids.add(*(p.pid for p in procs))
            qbroker.run(run(workdir, args.renderers, f"http://127.0.0.1:{port}", args.keep_running, edit, store,
                            accounts.env("client") if accounts is not None else None))
    finally:
        bridge.terminate()
        try:
            bridge.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(bridge.pid, signal.SIGKILL)  # its Spark JVM too
        bridge_log.close()
        pids.stop_leftovers()  # all stopped above; this forgets the file (and stops anything that lingered)


if __name__ == "__main__":
    main()
