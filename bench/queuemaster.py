"""Queuemaster throughput on real RabbitMQ; prints one JSON document.

* ``dispatch``: metatiles rendered per second end to end with N test-pattern renderer processes
  (one render thread each): expire, dispatch, render 64 tiles, write them, report ``rendered``.
* ``dispatch_null``: the queuemaster's own dispatch capacity, with in-process "null" render threads that
  answer ``render`` and report ``rendered`` at once without drawing anything.
* ``null_vs_floor``: null dispatch (8 threads) and the sequential RPC floors of bench/peers_rpc.py
  (raw aiormq, direct reply-to and the QBroker structure) interleaved in rounds, with the ratio per round, and
  with ``--old COMMIT`` that commit's queuemaster (its ``services/`` from ``git archive``) in the same
  rounds. Each round reports the CPU per metatile of the queuemaster, the null renderers (this process)
  and RabbitMQ, and the queue's commits per metatile. The end of a round is the last acknowledged
  ``rendered``, counted by the null renderers: no ``stats`` polls weigh on the queuemaster.
* ``pick``: microseconds per background pick from a render queue of 10k and 100k metatiles, half of them
  raised to important; a logarithmic pick barely grows with the queue.
* ``expiry``: expiry tiles ingested per second from ``expire_toposm`` text alerts (1000 tiles per
  message, each a distinct metatile, all queued and persisted), ``--expiry-pairs`` fresh queuemasters
  (alternating with ``--old``'s).
* ``ingest`` and ``big_queue``: bench/queuemaster_scale.py (no bus): expiry ingestion in process, and
  the memory and pick time of a 10-million-metatile queue.

Run: ``.venv/bin/python bench/queuemaster.py [--only null_vs_floor,expiry] [--metatiles 200]``. Needs
rabbitmqctl (each run uses a fresh vhost) and the toposm console scripts in the virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import qbroker
from qbroker import Config, Unit
from qbroker.log import configure_logging

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.peers import measure  # noqa: E402
from bench.peers_report import machine  # noqa: E402
from bench.peers_rpc import CONTENDERS  # noqa: E402
from bench.queuemaster_scale import bench_big_queue, bench_ingest  # noqa: E402
from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402
from services.toposm.contract import EXPIRE_TOPIC, QUEUEMASTER, join_expiry_list, render_thread  # noqa: E402

BIN = Path(sys.executable).parent


def start(args: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - lives as long as the process
    env = {**os.environ, "QBROKER_URL": url}
    return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def queuemaster_args(workdir: Path, tiles: str) -> list[str]:
    return [str(BIN / "toposm-queuemaster"), "--tile-root", str(workdir / tiles), "--state-file",
            str(workdir / f"q-{uuid.uuid4().hex}.sqlite"), "--render-missing-expired"]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


async def wait_for(unit: Unit, check: Any, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            s = await unit.call(QUEUEMASTER, {"command": "stats"}, timeout=5)
            if check(s):
                return s  # type: ignore[no-any-return]
        except Exception:  # noqa: S110 - not up yet
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError("benchmark condition not reached")


def metatile_tiles(n: int, zoom: int = 14, first: int = 0) -> list[str]:
    """n distinct metatiles at a zoom, as their top-left tiles (the Spark expiry convention)."""
    side = (1 << zoom) >> 3
    return [f"{zoom}/{(i % side) * 8}/{(i // side) * 8}" for i in range(first, first + n)]


async def bench_dispatch(n_renderers: int, n_metatiles: int, workdir: Path) -> dict[str, Any]:
    vhost = create_vhost("qbroker-bench")
    url = url_for_vhost(vhost)
    procs = [start(queuemaster_args(workdir, "tiles"), url, workdir / "qm.log")]
    unit = Unit("bench.client", config=Config(url=url))
    try:
        await unit.start()
        await wait_for(unit, lambda s: True)
        procs += [start([str(BIN / "toposm-renderer"), "--threads", "1", "--backend", "testpattern",
                         "--tile-root", str(workdir / "tiles")], url, workdir / f"r{i}.log")
                  for i in range(n_renderers)]
        await wait_for(unit, lambda s: len(s["renderers"]) == n_renderers, 60)
        t0 = time.perf_counter()
        await unit.call(QUEUEMASTER, {"command": "expire", "tiles": metatile_tiles(n_metatiles)})
        await wait_for(unit, lambda s: s["counters"]["rendered"] >= n_metatiles)
        elapsed = time.perf_counter() - t0
        return {"renderers": n_renderers, "metatiles": n_metatiles, "seconds": round(elapsed, 3),
                "metatiles_per_second": round(n_metatiles / elapsed, 2),
                "tiles_per_second": round(64 * n_metatiles / elapsed, 1)}
    finally:
        await unit.stop(drain_timeout=1)
        stop(procs)
        delete_vhost(vhost)


class NullAcks:
    """Counts the `rendered` reports the queuemaster acknowledged: the benchmark waits on this instead of
    polling `stats`, whose calls would be counted against the queuemaster's CPU and throughput."""

    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.reached = asyncio.Event()

    def expect(self, target: int) -> asyncio.Event:
        self.target = target
        self.reached = asyncio.Event()
        if self.count >= target:
            self.reached.set()
        return self.reached

    def acked(self) -> None:
        self.count += 1
        if self.count >= self.target:
            self.reached.set()


def null_renderer(unit: Unit, threadid: int, acks: NullAcks | None = None, take_next: bool = True) -> None:
    """A render thread that reports `rendered` immediately: measures the queuemaster, not rendering.
    Like toposm-renderer it asks for its next metatile in the answer (``take_next``; older queuemasters
    refuse the field)."""
    name = render_thread("bench", os.getpid(), threadid)
    endpoint = unit.commands(name, exclusive=True)
    tasks: set[asyncio.Task[Any]] = set()

    async def report(metatile: str | None) -> None:
        while metatile is not None:
            body: dict[str, Any] = {"command": "rendered", "metatile": metatile, "duration": 0.0}
            if take_next:
                body["next"] = True
            answer = await unit.call(QUEUEMASTER, body)
            if acks is not None:
                acks.acked()
            metatile = answer.get("render")  # handed the next one in the answer: "render" it at once

    @endpoint.command("render")
    async def render(metatile: str) -> dict[str, Any]:
        task = asyncio.ensure_future(report(metatile))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return {"command": "accepted"}

    @endpoint.command("ping")
    async def ping() -> dict[str, Any]:
        return {"command": "pong", "state": "idle"}


async def bench_dispatch_null(n_threads: int, n_metatiles: int, workdir: Path) -> dict[str, Any]:
    vhost = create_vhost("qbroker-bench")
    url = url_for_vhost(vhost)
    procs = [start(queuemaster_args(workdir, "tiles-null"), url, workdir / "qm-null.log")]
    unit = Unit("bench.null-renderer", config=Config(url=url))
    acks = NullAcks()
    for i in range(n_threads):
        null_renderer(unit, i, acks)
    try:
        await unit.start()
        await wait_for(unit, lambda s: True)
        for i in range(n_threads):
            await unit.call(QUEUEMASTER, {"command": "register", "hostname": "bench",
                                                   "pid": os.getpid(), "threadid": i, "strategy": "by_zoom"})
        t0 = time.perf_counter()
        done = acks.expect(n_metatiles)
        await unit.call(QUEUEMASTER, {"command": "expire", "tiles": metatile_tiles(n_metatiles)})
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - t0
        return {"null_render_threads": n_threads, "metatiles": n_metatiles, "seconds": round(elapsed, 3),
                "metatiles_per_second": round(n_metatiles / elapsed, 1)}
    finally:
        await unit.stop(drain_timeout=1)
        stop(procs)
        delete_vhost(vhost)


class NullDispatch:
    """One queuemaster (the working tree's, or ``services_from``'s code) with 8 null render threads in
    this process, on a vhost of its own."""

    def __init__(self, name: str, n_threads: int, workdir: Path, services_from: Path | None) -> None:
        self.name, self.n_threads, self.workdir, self.services_from = name, n_threads, workdir, services_from
        self.vhost = create_vhost("qbroker-bench")
        self.acks = NullAcks()
        self.unit = Unit("bench.null-renderer", config=Config(url=url_for_vhost(self.vhost)))
        # Older code refuses `next` (unknown field) unless it has it already.
        take_next = services_from is None or "next: bool" in (services_from / "services/toposm/messages.py").read_text()
        for i in range(n_threads):
            null_renderer(self.unit, i, self.acks, take_next=take_next)
        self.proc: subprocess.Popen[bytes] | None = None
        self.sent = 0
        self.commits = 0

    async def start(self) -> None:
        args = queuemaster_command(self.workdir, f"tiles-{self.name}", self.services_from)
        self.proc = start(args, url_for_vhost(self.vhost), self.workdir / f"qm-{self.name}.log")
        await self.unit.start()
        await wait_for(self.unit, lambda s: True)
        for i in range(self.n_threads):
            await self.unit.call(QUEUEMASTER, {"command": "register", "hostname": "bench",
                                                        "pid": os.getpid(), "threadid": i, "strategy": "by_zoom"})
        await self.round(100, 10**6)  # warm up

    async def round(self, n: int, first: int) -> dict[str, float | None]:
        assert self.proc is not None
        self.sent += n
        done = self.acks.expect(self.sent)
        rabbit = rabbit_pids()
        t0, cpu0, own0, mq0 = time.perf_counter(), cpu_seconds(self.proc.pid), time.process_time(), \
            sum(cpu_seconds(p) for p in rabbit)
        await self.unit.call(QUEUEMASTER, {"command": "expire", "tiles": metatile_tiles(n, first=first)})
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - t0
        cpu, own, mq = cpu_seconds(self.proc.pid), time.process_time(), sum(cpu_seconds(p) for p in rabbit)
        ms = 1000 / n
        commits = (await self.unit.call(QUEUEMASTER, {"command": "stats"}))["counters"].get("group_commits")
        per_metatile: float | None = None
        if commits is not None:  # older code does not count them
            per_metatile, self.commits = round((commits - self.commits) / n, 3), commits
        return {"metatiles_per_s": round(n / elapsed, 1), "commits_per_metatile": per_metatile,
                # What one dispatched metatile costs the queuemaster (two RPCs and the queue), the null
                # renderers (this process) and RabbitMQ (shared with anything else on the machine).
                "queuemaster_cpu_ms": round((cpu - cpu0) * ms, 3),
                "null_renderers_cpu_ms": round((own - own0) * ms, 3),
                "rabbitmq_cpu_ms": round((mq - mq0) * ms, 3)}

    async def stop(self) -> None:
        await self.unit.stop(drain_timeout=1)
        if self.proc is not None:
            stop([self.proc])
        delete_vhost(self.vhost)


def rabbit_pids() -> list[int]:
    """The RabbitMQ server's Erlang VM (not the short-lived ones of rabbitmqctl, also beam.smp)."""
    found = subprocess.run(["pgrep", "-f", "beam.smp.* -s rabbit boot"], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


async def bench_dispatch_null_vs_floor(n_threads: int, per_round: int, rounds: int, floor_calls: int,
                                       workdir: Path, old_services: Path | None = None) -> dict[str, Any]:
    """Null dispatch and the sequential RPC floors (bench/peers_rpc.py, client and server in this process),
    interleaved in rounds; the ratio is taken within each round. With ``old_services`` (a directory holding
    an older ``services/``, e.g. from ``git archive``) the old queuemaster runs in the same rounds."""
    names = ["floor_direct", "floor_seed"]
    vhosts = [create_vhost("qbroker-bench") for _ in names]
    dispatchers = [NullDispatch("null", n_threads, workdir, None)]
    if old_services is not None:
        dispatchers.append(NullDispatch("null_old", n_threads, workdir, old_services))
    stops: list[Any] = []
    rows: list[dict[str, Any]] = []
    try:
        floors = {}
        for name, vhost in zip(names, vhosts, strict=True):
            stops.append(await CONTENDERS[name].serve(url_for_vhost(vhost)))
            floors[name], stop_client = await CONTENDERS[name].connect(url_for_vhost(vhost))
            stops.append(stop_client)
            await measure(floors[name], 100, 1)  # warm up
        for d in dispatchers:
            await d.start()
        for r in range(rounds):
            row: dict[str, Any] = {"load_average": os.getloadavg()[0]}
            order: list[Any] = [*names, *dispatchers]
            for item in order[r % len(order):] + order[:r % len(order)]:  # rotate who goes first
                if isinstance(item, str):
                    row[item + "_sequential_calls_per_s"] = round((await measure(floors[item], floor_calls, 1))
                                                                  ["calls_per_s"], 1)
                else:
                    for key, value in (await item.round(per_round, r * per_round)).items():
                        row[f"{item.name}_{key}"] = value
            for d in dispatchers:
                for name in names:
                    row[f"{d.name}_ratio_to_{name}"] = round(row[f"{d.name}_metatiles_per_s"]
                                                             / row[name + "_sequential_calls_per_s"], 3)
            if old_services is not None:
                row["null_new_over_old"] = round(row["null_metatiles_per_s"] / row["null_old_metatiles_per_s"], 3)
            rows.append(row)
    finally:
        for d in dispatchers:
            await d.stop()
        for stop_one in reversed(stops):
            await stop_one()
        for vhost in vhosts:
            delete_vhost(vhost)
    keys = [key for key in (rows[0] if rows else {}) if rows[0][key] is not None]
    summary = {key: round(statistics.median(row[key] for row in rows), 3) for key in keys}
    ranges = {key: [min(row[key] for row in rows), max(row[key] for row in rows)] for key in keys}
    return {"null_render_threads": n_threads, "metatiles_per_round": per_round, "floor_calls": floor_calls,
            "old_services": str(old_services) if old_services else None,
            "rounds": rows, "median": summary, "range": ranges}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def queuemaster_command(workdir: Path, tiles: str, services_from: Path | None) -> list[str]:
    args = queuemaster_args(workdir, tiles)
    if services_from is None:
        return args
    # Older code: its services/ first on the path (qbroker stays the working tree's, the same for both).
    return [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from services.tiles.queuemaster.main import main; main()", str(services_from), *args[1:]]


async def bench_expiry(n_messages: int, per_message: int, workdir: Path,
                       services_from: Path | None = None) -> dict[str, Any]:
    vhost = create_vhost("qbroker-bench")
    url = url_for_vhost(vhost)
    procs = [start(queuemaster_command(workdir, f"tiles-exp-{uuid.uuid4().hex}", services_from), url,
                   workdir / "qm-exp.log")]
    unit = Unit("bench.expirer", config=Config(url=url))
    tiles = metatile_tiles(n_messages * per_message, zoom=16)
    bodies = [join_expiry_list(tiles[i * per_message:(i + 1) * per_message]) for i in range(n_messages)]
    try:
        await unit.start()
        await wait_for(unit, lambda s: True)
        t0, cpu0 = time.perf_counter(), cpu_seconds(procs[0].pid)
        for body in bodies:
            await unit.alert(EXPIRE_TOPIC, body, content_type="text/plain")
        published = time.perf_counter() - t0
        total = n_messages * per_message
        s = await wait_for(unit, lambda s: s["counters"]["expired"] >= total)
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(procs[0].pid) - cpu0
        # Per CPU-second of the queuemaster process: steadier than wall time on a shared machine. (The
        # 50 ms stats polls that detect the end are included: a few of them per run.)
        return {"code": "old" if services_from else "new", "messages": n_messages, "tiles_per_message": per_message,
                "tiles": total, "queued": s["queues"]["total"], "seconds": round(elapsed, 3),
                "publishing_seconds": round(published, 3),
                "tiles_per_second": round(total / elapsed, 1),
                "tiles_per_queuemaster_cpu_second": round(total / cpu) if cpu > 0 else None,
                "load_average": os.getloadavg()[0]}
    finally:
        await unit.stop(drain_timeout=1)
        stop(procs)
        delete_vhost(vhost)


async def bench_expiry_pairs(pairs: int, n_messages: int, per_message: int, workdir: Path,
                             old_services: Path | None) -> dict[str, Any]:
    """The new code's expiry ingestion, alternating with the old code's when given, in fresh processes."""
    runs = []
    for _ in range(pairs):
        runs.append(await bench_expiry(n_messages, per_message, workdir))
        if old_services is not None:
            runs.append(await bench_expiry(n_messages, per_message, workdir, old_services))
    summary: dict[str, Any] = {}
    for code in ("new", "old"):
        mine = [r for r in runs if r["code"] == code]
        for key in ("tiles_per_second", "tiles_per_queuemaster_cpu_second"):
            if mine:
                summary[f"{code}_{key}"] = {"median": statistics.median(r[key] for r in mine),
                                            "min": min(r[key] for r in mine), "max": max(r[key] for r in mine)}
    return {"runs": runs, "summary": summary}


def bench_pick(size: int, workdir: Path, picks: int = 2000) -> dict[str, Any]:
    from harness.queues import fill_half_raised
    from services.tiles.queuemaster.queue_store import QueueStore
    from services.tiles.queuemaster.render_queue import RenderQueue

    q = RenderQueue(QueueStore(workdir / f"pick-{size}.sqlite"))
    fill_half_raised(q, size)
    started = time.perf_counter()
    with q.batch():
        for _ in range(picks):
            q.pop(14)
    return {"queued": size, "picks": picks, "us_per_pick": round((time.perf_counter() - started) / picks * 1e6, 2)}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def archive(commit: str, workdir: Path) -> Path:
    """``services/`` as of ``commit``, unpacked under workdir (the repo's qbroker stays in use)."""
    target = workdir / f"old-{commit}"
    target.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "services"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=tar.stdout, check=True)
    return target


SCENARIOS = "dispatch,dispatch_null,null_vs_floor,expiry,ingest,pick,big_queue"


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metatiles", type=int, default=200)
    p.add_argument("--renderers", default="1,2,4")
    p.add_argument("--null-metatiles", type=int, default=3000)
    p.add_argument("--expiry-messages", type=int, default=100)
    p.add_argument("--expiry-pairs", type=int, default=3, help="expiry runs (each new, then old with --old)")
    p.add_argument("--rounds", type=int, default=3, help="null_vs_floor rounds")
    p.add_argument("--floor-calls", type=int, default=600, help="sequential floor calls per round")
    p.add_argument("--big-queue", type=int, default=10_000_000, help="metatiles queued by big_queue")
    p.add_argument("--old", metavar="COMMIT", help="null_vs_floor and expiry also run this commit's queuemaster "
                   "(its services/ from `git archive`), in the same rounds")
    p.add_argument("--only", default=SCENARIOS, help=f"comma-separated subset of {SCENARIOS}")
    a = p.parse_args()
    only = set(a.only.split(","))
    configure_logging("WARNING")  # logs to stderr; stdout is the JSON result
    workdir = Path(tempfile.mkdtemp(prefix="toposm-bench-"))  # service logs are kept there on failure
    result: dict[str, Any] = {"machine": machine(), "uptime_before": uptime(), "load_average_before": os.getloadavg()}
    old_services = archive(a.old, workdir) if a.old else None
    if a.old:
        result["old_commit"] = a.old
    try:
        if "dispatch" in only:
            result["dispatch"] = [await bench_dispatch(int(n), a.metatiles, workdir) for n in a.renderers.split(",")]
        if "dispatch_null" in only:
            result["dispatch_null"] = [await bench_dispatch_null(n, a.null_metatiles, workdir) for n in (1, 8)]
        if "null_vs_floor" in only:
            result["null_vs_floor"] = await bench_dispatch_null_vs_floor(
                8, a.null_metatiles // a.rounds, a.rounds, a.floor_calls, workdir, old_services)
        if "expiry" in only:
            result["expiry"] = await bench_expiry_pairs(a.expiry_pairs, a.expiry_messages, 1000, workdir, old_services)
        if "ingest" in only:
            result["ingest"] = bench_ingest(200_000, workdir)
        if "pick" in only:
            result["pick"] = [bench_pick(size, workdir) for size in (10_000, 100_000)]
        if "big_queue" in only:
            result["big_queue"] = bench_big_queue(a.big_queue, workdir)
    except BaseException:
        print(f"benchmark failed; service logs in {workdir}", file=sys.stderr)
        raise
    result["load_average_after"] = os.getloadavg()
    result["uptime_after"] = uptime()
    shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    qbroker.run(main())  # uvloop when installed, as the services and bench/peers.py use
