"""The queuemaster's own dispatch capacity (bench/queuemaster.py's ``dispatch_null`` and ``null_vs_floor``):
"null" render threads in the benchmark's process answer ``render`` and report ``rendered`` at once, so the
figures are the queuemaster's and the bus's, not rendering's.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from qbroker import Config, Unit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.peers import measure  # noqa: E402
from bench.peers_rpc import CONTENDERS  # noqa: E402
from bench.queuemaster_procs import (  # noqa: E402
    cpu_seconds,
    metatile_tiles,
    queuemaster_args,
    queuemaster_command,
    rabbit_pids,
    start,
    stop,
    wait_for,
)
from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402
from services.toposm.contract import QUEUEMASTER, render_thread  # noqa: E402


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
            await unit.call(
                QUEUEMASTER,
                {"command": "register", "hostname": "bench", "pid": os.getpid(), "threadid": i, "strategy": "by_zoom"},
            )
        t0 = time.perf_counter()
        done = acks.expect(n_metatiles)
        await unit.call(QUEUEMASTER, {"command": "expire", "tiles": metatile_tiles(n_metatiles)})
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - t0
        return {
            "null_render_threads": n_threads,
            "metatiles": n_metatiles,
            "seconds": round(elapsed, 3),
            "metatiles_per_second": round(n_metatiles / elapsed, 1),
        }
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
            await self.unit.call(
                QUEUEMASTER,
                {"command": "register", "hostname": "bench", "pid": os.getpid(), "threadid": i, "strategy": "by_zoom"},
            )
        await self.round(100, 10**6)  # warm up

    async def round(self, n: int, first: int) -> dict[str, float | None]:
        assert self.proc is not None
        self.sent += n
        done = self.acks.expect(self.sent)
        rabbit = rabbit_pids()
        t0, cpu0, own0, mq0 = (
            time.perf_counter(),
            cpu_seconds(self.proc.pid),
            time.process_time(),
            sum(cpu_seconds(p) for p in rabbit),
        )
        await self.unit.call(QUEUEMASTER, {"command": "expire", "tiles": metatile_tiles(n, first=first)})
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - t0
        cpu, own, mq = cpu_seconds(self.proc.pid), time.process_time(), sum(cpu_seconds(p) for p in rabbit)
        ms = 1000 / n
        commits = (await self.unit.call(QUEUEMASTER, {"command": "stats"}))["counters"].get("group_commits")
        per_metatile: float | None = None
        if commits is not None:  # older code does not count them
            per_metatile, self.commits = round((commits - self.commits) / n, 3), commits
        return {
            "metatiles_per_s": round(n / elapsed, 1),
            "commits_per_metatile": per_metatile,
            # What one dispatched metatile costs the queuemaster (two RPCs and the queue), the null
            # renderers (this process) and RabbitMQ (shared with anything else on the machine).
            "queuemaster_cpu_ms": round((cpu - cpu0) * ms, 3),
            "null_renderers_cpu_ms": round((own - own0) * ms, 3),
            "rabbitmq_cpu_ms": round((mq - mq0) * ms, 3),
        }

    async def stop(self) -> None:
        await self.unit.stop(drain_timeout=1)
        if self.proc is not None:
            stop([self.proc])
        delete_vhost(self.vhost)


async def bench_dispatch_null_vs_floor(
    n_threads: int, per_round: int, rounds: int, floor_calls: int, workdir: Path, old_services: Path | None = None
) -> dict[str, Any]:
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
            for item in order[r % len(order) :] + order[: r % len(order)]:  # rotate who goes first
                if isinstance(item, str):
                    row[item + "_sequential_calls_per_s"] = round(
                        (await measure(floors[item], floor_calls, 1))["calls_per_s"], 1
                    )
                else:
                    for key, value in (await item.round(per_round, r * per_round)).items():
                        row[f"{item.name}_{key}"] = value
            for d in dispatchers:
                for name in names:
                    row[f"{d.name}_ratio_to_{name}"] = round(
                        row[f"{d.name}_metatiles_per_s"] / row[name + "_sequential_calls_per_s"], 3
                    )
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
    return {
        "null_render_threads": n_threads,
        "metatiles_per_round": per_round,
        "floor_calls": floor_calls,
        "old_services": str(old_services) if old_services else None,
        "rounds": rows,
        "median": summary,
        "range": ranges,
    }
