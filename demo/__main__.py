"""``bin/demo``: the TopOSM services on the local broker, end to end (what it does: ``bin/demo --help``, whose
text is demo/arguments.py). Map data © OpenStreetMap contributors (ODbL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import qbroker
from demo import arguments
from demo.accounts import DemoAccounts, demo_accounts
from demo.broker_objects import DEMO_PREFIX, BrokerObject, Record, claim, owned_after, remove
from demo.leftovers import PidFile, clear_leftovers, stop_on_signals
from demo.osm_changes import DemoEdit, helsinki_edit, publish
from demo.processes import Service, watch
from demo.replicate import replicate
from demo.stack import free_port, service_log, start_stack, tile_at, write_overview
from demo.waits import changed_pixels, wait_queue_empty, wait_until_answering, wait_web
from qbroker import Unit
from qbroker.log import configure_logging
from services.toposm.contract import QUEUEMASTER, SPARK_JOB, SPARK_STATS, SparkJobCommand
from services.toposm.messages import RenderTileRequest, StatsRequest
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Metatile

BIN = Path(sys.executable).parent
STATS_LINES = 25  # of the CLI's answer on the console; all of it goes to WORKDIR/queuemaster-stats.json


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


@dataclass
class Demo:
    """One run's settings and what it learns on the way."""

    workdir: Path
    renderers: int
    web_url: str
    keep_running: bool
    edit: DemoEdit
    store: Path
    client_env: dict[str, str] | None  # toposm-replicate's: the client account, when there are accounts
    services: list[Service]
    endpoints: set[str] = field(default_factory=set)  # the services' names: their request queues go at the end

    @property
    def street_map(self) -> str:
        """The map at the edited street, in the map's own URL form (it opens on the data anyway)."""
        lon, lat = self.edit.centre
        return f"{self.web_url}/map#map=17/{lat:.5f}/{lon:.5f}"


class ServicesEnded(Exception):
    """Every service ended while the demo kept them running."""


async def run(demo: Demo) -> None:
    # A service that ends is reported at once, until the demo stops them itself.
    watcher = asyncio.ensure_future(watch(demo.services, lambda text: print(text, flush=True)))
    try:
        async with Unit("qbroker.demo") as unit:
            await show_the_stack(unit, demo)
            await render_edit_rerender(unit, demo)
            await show_stats(unit, demo)
            write_overviews(demo)
            if demo.keep_running:
                step(f"still running: status {demo.web_url}/  map {demo.street_map}  (Ctrl-C, SIGTERM or SIGHUP stops)")
                for service in demo.services:
                    if service.process.returncode is None:
                        print(f"  {service.name:<22} pid {service.pid:<7} log {service.log}", flush=True)
                await watcher  # until every service has ended (the demo is stopped before, normally)
                raise ServicesEnded
    finally:
        watcher.cancel()


async def show_the_stack(unit: Unit, demo: Demo) -> None:
    await wait_web(demo.web_url)
    step(f"live status page {demo.web_url}/   slippy map {demo.web_url}/map   metrics {demo.web_url}/metrics")
    print(f"  the edited street (Mikonkatu) on the map: {demo.street_map}", flush=True)
    step("waiting for the queuemaster, the renderers and the Spark bridge")
    deadline = time.monotonic() + 120
    while len((await wait_until_answering(unit, QUEUEMASTER, StatsRequest().body(), 60))["renderers"]) < demo.renderers:
        if time.monotonic() > deadline:
            raise TimeoutError("renderers did not register")
        await asyncio.sleep(0.5)
    await wait_until_answering(unit, SPARK_JOB, {"command": SparkJobCommand.LIST}, 180)
    async for reply in unit.gather("qbroker.ping", {}, timeout=3, gap=1.0):
        info = reply.body
        if info["uuid"] != unit.uuid:
            demo.endpoints.update(info["endpoints"])
            print(f"  {info['app']:<22} {info['uuid'][:8]}  pid {info['pid']:<7} {', '.join(info['endpoints'])}")


async def render_edit_rerender(unit: Unit, demo: Demo) -> None:
    workdir, edit = demo.workdir, demo.edit
    lon, lat = edit.centre
    step(f"requesting the tiles of central Helsinki at {lon:.4f},{lat:.4f}, zooms 10-17 (answered when drawn)")
    started = time.monotonic()
    tiles = [tile_at(lon, lat, z) for z in range(10, 18)]
    replies = await asyncio.gather(
        *(unit.call(QUEUEMASTER, RenderTileRequest(tile=str(t)).body(), timeout=180) for t in tiles)
    )
    for reply in replies:
        print(f"  {reply['tile']:<16} rendered (metatile {reply['metatile']})")
    print(f"  {len(replies)} tiles in {time.monotonic() - started:.1f}s")
    before = (await unit.call(QUEUEMASTER, StatsRequest().body()))["counters"]
    tile_store = TileStore(workdir / "tiles")
    for z in (16, 17):
        write_overview(tile_store, tile_at(lon, lat, z).metatile, workdir / f"before-{z}.png")

    step(
        f"an OSM edit published as replication diff 1: {edit.streets and 'Mikonkatu'} renamed "
        f"Qbrokerinkatu, node {edit.moved_node} moved, building {edit.new_building} drawn"
    )
    diff = publish(workdir / "replication", 1, edit.text, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(f"  {diff.relative_to(workdir)} and state.txt written; running toposm-replicate --once")
    status = await replicate(workdir, demo.store, demo.client_env)
    inputs = status.get("inputs") or {}
    print(
        f"  applied sequence {status['sequence']}: {status['metatiles']} metatiles expired (zooms 12-17); "
        f"ways resolved from the geometry store: {inputs.get('ways')}, moved nodes: {inputs.get('moved_nodes')}"
    )
    await asyncio.sleep(1.0)  # the expirations are broadcasts: let the queuemaster take them in
    after = await wait_queue_empty(unit)
    print(
        f"  queuemaster: {after['counters']['expired'] - before['expired']} metatiles expired, "
        f"{after['counters']['rendered'] - before['rendered']} re-rendered"
    )
    for z in (16, 17):
        write_overview(tile_store, tile_at(lon, lat, z).metatile, workdir / f"after-{z}.png")
        changed = changed_pixels(workdir / f"before-{z}.png", workdir / f"after-{z}.png")
        print(f"  z{z}: before-{z}.png / after-{z}.png differ in {changed} pixels")


async def show_stats(unit: Unit, demo: Demo) -> None:
    step("render stats from the queuemaster's render log, computed by Spark")
    stats = await unit.call(
        SPARK_STATS, {"paths": [str((demo.workdir / "render.log").resolve())], "wait": True, "chart": True}, timeout=300
    )
    summary = stats.get("result", stats)
    print(f"  {'zoom':>4} {'renders':>8} {'failures':>8} {'p50 s':>7} {'p95 s':>7} {'p99 s':>7}")
    for row in summary.get("per_zoom", []):
        print(
            f"  {row['zoom']:>4} {row['renders']:>8} {row['failures']:>8} {row['p50']:>7.3f} "
            f"{row['p95']:>7.3f} {row['p99']:>7.3f}"
        )
    for row in summary.get("per_host", []):
        print(f"  host {row['host']}: {row['renders']} renders by {row['renderers']} renderers, p95 {row['p95']:.3f}s")
    outputs = summary.get("outputs") or {}
    if outputs:
        print(
            f"  written: {outputs.get('json')}, {len(outputs.get('parquet') or {})} Parquet tables, "
            f"chart {outputs.get('chart')}"
        )

    step("the same from the shell: qbroker call toposm.queuemaster stats")
    cli = await asyncio.create_subprocess_exec(
        str(BIN / "qbroker"),
        "call",
        QUEUEMASTER,
        "stats",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    answer = demo.workdir / "queuemaster-stats.json"
    answer.write_bytes(out)
    print("  $ qbroker call toposm.queuemaster stats")
    lines = out.decode(errors="replace").splitlines()
    print("\n".join("  " + line for line in lines[:STATS_LINES]))
    if len(lines) > STATS_LINES:
        print(f"  … {len(lines) - STATS_LINES} more lines: the whole answer is in {answer}")
    if cli.returncode:
        print(f"  qbroker call failed (status {cli.returncode}):")
        print("\n".join("  " + line for line in err.decode(errors="replace").splitlines()))


def write_overviews(demo: Demo) -> None:
    lon, lat = demo.edit.centre
    tile_store = TileStore(demo.workdir / "tiles")
    overviews = []
    for z in (13, 15, 16):
        metatile: Metatile = tile_at(lon, lat, z).metatile
        path = demo.workdir / f"overview-{z}.png"
        write_overview(tile_store, metatile, path)
        overviews.append(str(path))
    step(f"map tiles are in {demo.workdir / 'tiles'}; overview mosaics: {', '.join(overviews)}")
    print("  map data © OpenStreetMap contributors (ODbL 1.0)")


def can_provision_here() -> tuple[bool, str]:
    """Whether this demo can make its own broker accounts: a local broker and a usable rabbitmqctl."""
    host = urlsplit(qbroker.Config().urls[0]).hostname or ""
    if host not in ("127.0.0.1", "localhost", "::1"):
        return False, f"the broker at {host} is not on this host"
    if shutil.which("rabbitmqctl") is None or os.geteuid() != 0:
        return False, "rabbitmqctl is not available to this user; run as root for per-program accounts"
    return True, "local broker, rabbitmqctl available"


def main() -> None:
    args = arguments.parse()
    # A closed terminal (SIGHUP), `timeout` or a supervisor (SIGTERM) stop the demo as Ctrl-C does.
    stop_on_signals(signal.SIGTERM, signal.SIGHUP)
    # The demo's own corner of the broker: a prefix keeps it out of the way of other traffic on the vhost.
    os.environ.setdefault("QBROKER_EXCHANGE_PREFIX", DEMO_PREFIX)
    # The services log at QBROKER_LOG_LEVEL into their files; this process's console shows only what it prints.
    os.environ.setdefault("QBROKER_LOG_LEVEL", "INFO")
    configure_logging("WARNING")
    # The demo's own account (QBROKER_URL), kept before the per-program accounts are made: it removes what the
    # run declared on the broker, which none of those may.
    own = qbroker.Config()
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"qbroker demo on {own.urls[0].split('@')[-1]} (exchange prefix {own.exchange_prefix!r}); logs in {workdir}")
    use_accounts, why = (args.accounts, "as asked") if args.accounts is not None else can_provision_here()
    if args.clean:
        sys.exit(clean(workdir, own, use_accounts))
    done = ["services stopped."] + (["Broker accounts deleted."] if use_accounts else [])
    try:
        for line in clear_leftovers(workdir, accounts=use_accounts, broker=own):
            print(f"  {line}" if not line.startswith(" ") else line)
        print(f"  broker accounts per program: {'yes' if use_accounts else 'no'} ({why})")
        claimed: list[BrokerObject] = []
        endpoints: set[str] = set()
        try:
            claimed = qbroker.run(claim(own, workdir))
            with contextlib.ExitStack() as stack:
                accounts = None
                if use_accounts:
                    accounts = stack.enter_context(demo_accounts(workdir, own.url, own.exchange_prefix))
                    # this process (and the `qbroker call` it runs) is a client like any other
                    os.environ.update({k: v for k, v in accounts.env("client").items() if k.startswith("QBROKER_")})
                    print(f"  accounts: {', '.join(sorted(accounts.names.values()))}")
                run_demo(args, workdir, accounts, endpoints)
        finally:
            if Record(workdir).exists():  # claimed: the run may have declared something
                removal = qbroker.run(remove(own, owned_after(own, workdir, claimed, endpoints), workdir))
                print("\n".join(removal.lines(workdir)), flush=True)
                done.append(removal.summary())
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM/SIGHUP (stop_on_signals)
        print(f"\ndemo stopped ({stop or 'SIGINT'}): {' '.join(filter(None, done))}", flush=True)
        return
    except ServicesEnded:
        print(f"\ndemo stopped (every service had ended): {' '.join(filter(None, done))}", flush=True)
        sys.exit(1)
    print(f"\ndemo finished: {' '.join(filter(None, done))}")


def clean(workdir: Path, own: qbroker.Config, use_accounts: bool) -> int:
    """``bin/demo --clean``: what earlier runs left; 0 when nothing is left, 1 when something was kept."""
    lines = clear_leftovers(workdir, accounts=use_accounts, broker=None)  # the processes first: they use the broker
    removal = qbroker.run(remove(own, owned_after(own, workdir), workdir))
    print("\n".join([*lines, *removal.lines(workdir)]) or "  nothing of the demo's was left", flush=True)
    return 0 if removal.complete else 1


def prepare_data(workdir: Path) -> tuple[Path, DemoEdit]:
    """The real extract (bin/ensure-osm-data), imported afresh into WORKDIR/helsinki; a fresh replication dir."""
    import shutil

    from services.osmstore.importer import import_extract

    root = Path(__file__).resolve().parents[1]
    data = subprocess.run(
        [str(root / "bin" / "ensure-osm-data")], cwd=root, capture_output=True, text=True, timeout=600, check=True
    ).stdout.strip()
    extract = root / data / "Helsinki.osm.pbf"
    step(f"importing {extract.name} (OpenStreetMap, ODbL) into {workdir / 'helsinki'}")
    started = time.monotonic()
    info = import_extract(extract, workdir / "helsinki", replace=True)
    print(
        f"  {info['counts']} in {time.monotonic() - started:.1f}s: rendering store (SQLite R*Tree) and "
        f"geometry store (Parquet, {info['geometry']['way_nodes']} way-node rows)"
    )
    shutil.rmtree(workdir / "replication", ignore_errors=True)
    return workdir / "helsinki", helsinki_edit(extract)


def run_demo(args: argparse.Namespace, workdir: Path, accounts: DemoAccounts | None, endpoints: set[str]) -> None:
    store, edit = prepare_data(workdir)
    bridge_log = workdir / "spark-bridge.log"
    with open(bridge_log, "ab") as log:  # the process has its own copy of the descriptor
        bridge = subprocess.Popen(
            [
                str(BIN / "qbroker-spark-bridge"),
                "--master",
                "local[2]",
                "--state-dir",
                str(workdir / "spark-state"),
                "--store",
                str(store),  # the store replication diffs are resolved against and applied to
                "--input-root",
                str(workdir),  # the demo's changes and render log live here
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.sql.shuffle.partitions=4",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=accounts.env("spark") if accounts is not None else None,
        )
    pids = PidFile(workdir)
    pids.add(bridge.pid)
    try:
        port = free_port(args.web_port)
        with start_stack(
            workdir,
            renderers=args.renderers,
            backend="mapnik",
            web_port=port,
            env_for=accounts.env if accounts is not None else None,
            store=store,
        ) as procs:
            pids.add(*(p.pid for p in procs))
            services = [
                Service(bridge, bridge_log),
                *(Service(p, service_log(workdir, i)) for i, p in enumerate(procs)),
            ]
            qbroker.run(
                run(
                    Demo(
                        workdir,
                        args.renderers,
                        f"http://127.0.0.1:{port}",
                        args.keep_running,
                        edit,
                        store,
                        accounts.env("client") if accounts is not None else None,
                        services,
                        endpoints,
                    )
                )
            )
    finally:
        if bridge.poll() is None:
            bridge.terminate()
        try:
            bridge.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(bridge.pid, signal.SIGKILL)  # its Spark JVM too
        pids.stop_leftovers()  # all stopped above; this forgets the file (and stops anything that lingered)


if __name__ == "__main__":
    main()
