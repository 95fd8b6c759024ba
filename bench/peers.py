"""qbroker against its peers, all in one run, interleaved in rounds on the same loop kind; prints JSON.

RPC contenders (bench/peers_rpc.py): qbroker ``Unit.call``, aio-pika ``patterns.RPC``, FastStream
``request()``, a raw-aiormq floor with the QBroker structure (docs/wire-format.md) and the direct-reply-to
floor. One-way (bench/peers_alerts.py): qbroker alerts and a raw-aiormq one-way floor, both with confirms
pipelined.

Every contender has its own throwaway vhost, created for the run and deleted after it. Two variants:
``same``, every server and client in this process on one event loop, and ``two``, the servers and
listeners in one other process (same loop kind). All contenders stay connected for the variant; each
round measures every concurrency level for every contender (the order rotates each round), then the
alerts. The figures that count are the ratios of qbroker to a peer *within a round*, because the
machine is shared and its speed drifts between rounds; the JSON gives their median and range.

    .venv/bin/python bench/peers.py [--quick] [--rounds 5] [--calls 200] [--variants same,two]
    .venv/bin/python bench/peers.py --contenders qbroker,qbroker_metrics --plot ''   # what metrics cost
    .venv/bin/pip install --group bench   # FastStream, matplotlib, uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.peers_alerts import ONE_WAY, Done, Publish  # noqa: E402
from bench.peers_report import goals, machine, summarize  # noqa: E402
from bench.peers_rpc import CONTENDERS, Call, Stop  # noqa: E402
from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402

Samples = dict[str, Any]


def _run(coro: Coroutine[Any, Any, Any], loop: str) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def measure(call: Call, n: int, concurrency: int) -> dict[str, float]:
    """``n`` calls, ``concurrency`` in flight (each worker calls, waits, calls again)."""
    latencies: list[float] = []
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(n, concurrency))))
    elapsed = time.perf_counter() - started
    return {
        "calls_per_s": n / elapsed,
        "p50_ms": _percentile(latencies, 0.5) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
    }


def calls_at(level: int, calls: int) -> int:
    # Enough calls that ramp-up and ramp-down are a small part of a run even at 256 in flight.
    return calls if level == 1 else max(2 * calls, 4 * level)


class AlertClock:
    """When each alert run's last message was delivered (perf_counter is system-wide on Linux)."""

    def __init__(self, queue: Queue[tuple[str, float]] | None) -> None:
        self.queue = queue
        self.waiting: dict[str, asyncio.Future[float]] = {}

    def done(self, run: str) -> None:  # called by an in-process listener
        future = self.waiting.get(run)
        if future is not None and not future.done():
            future.set_result(time.perf_counter())

    async def wait(self, run: str, timeout: float) -> float:
        if self.queue is None:
            return await asyncio.wait_for(self.waiting[run], timeout)
        queue = self.queue
        got, at = await asyncio.get_running_loop().run_in_executor(None, lambda: queue.get(True, timeout))
        if got != run:
            raise RuntimeError(f"alert run {got} finished while waiting for {run}")
        return float(at)


def _serve_all_process(
    urls: dict[str, str], loop: str, ready: Event, stop: Event, delivered: Queue[tuple[str, float]]
) -> None:
    """The ``two`` variant's other process: every echo server and alert listener."""
    os.environ.setdefault("QBROKER_LOG_LEVEL", "WARNING")

    def done(run: str) -> None:
        delivered.put((run, time.perf_counter()))

    async def main() -> None:
        stops = [await c.serve(urls[name]) for name, c in CONTENDERS.items() if name in urls]  # --contenders
        stops += [await o.listen(urls["alerts:" + name], done) for name, o in ONE_WAY.items()]
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for stop_one in stops:
            await stop_one()

    _run(main(), loop)


async def _variant(
    args: argparse.Namespace, urls: dict[str, str], clock: AlertClock, in_process: bool, log: Callable[[str], None]
) -> Samples:
    stops: list[Stop] = []
    calls: dict[str, Call] = {}
    publishers: dict[str, Publish] = {}
    for name in args.contenders:
        if in_process:
            stops.append(await CONTENDERS[name].serve(urls[name]))
        calls[name], stop = await CONTENDERS[name].connect(urls[name])
        stops.append(stop)
    for name in ONE_WAY:
        if in_process:
            done: Done = clock.done
            stops.append(await ONE_WAY[name].listen(urls["alerts:" + name], done))
        publishers[name], stop = await ONE_WAY[name].connect(urls["alerts:" + name])
        stops.append(stop)
    for call in calls.values():  # warm up: connections, caches, the broker's queue processes
        await measure(call, args.warmup, 1)
        await measure(call, args.warmup, 16)
    samples: Samples = {
        "rpc": {str(level): {name: [] for name in calls} for level in args.levels},
        "alerts": {name: [] for name in publishers},
    }
    order = list(calls)
    one_way = list(publishers)
    try:
        for round_no in range(args.rounds):
            shift = round_no % len(order)
            rotated = order[shift:] + order[:shift]
            for level in args.levels:
                for name in rotated:
                    result = await measure(calls[name], calls_at(level, args.calls), level)
                    samples["rpc"][str(level)][name].append(result)
                    log(
                        f"round {round_no + 1} level {level:>3} {name:<13} {result['calls_per_s']:8.1f} calls/s "
                        f"p99 {result['p99_ms']:7.1f} ms"
                    )
            for name in one_way[round_no % len(one_way) :] + one_way[: round_no % len(one_way)]:
                run = uuid.uuid4().hex[:8]
                if in_process:
                    clock.waiting[run] = asyncio.get_running_loop().create_future()
                started = time.perf_counter()
                await publishers[name](run, args.alerts, args.window)
                published = time.perf_counter()
                finished = await clock.wait(run, 120)
                samples["alerts"][name].append(
                    {
                        "published_per_s": args.alerts / (published - started),
                        "delivered_per_s": args.alerts / (finished - started),
                    }
                )
                log(f"round {round_no + 1} alerts {name:<13} {samples['alerts'][name][-1]['delivered_per_s']:8.1f}/s")
    finally:
        for stop in reversed(stops):
            try:
                await stop()
            except Exception as exc:  # a peer's close failing must not hide the figures
                log(f"closing failed: {exc!r}")
    return samples


def _vhosts(names: list[str]) -> dict[str, str]:
    with ThreadPoolExecutor(len(names)) as pool:  # rabbitmqctl takes ~1 s per call: in parallel
        vhosts = list(pool.map(lambda _: create_vhost("qbroker-peers"), names))
    return dict(zip(names, vhosts, strict=True))


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    names = list(args.contenders) + ["alerts:" + name for name in ONE_WAY]
    vhosts = _vhosts(names)
    urls = {name: url_for_vhost(vhost) for name, vhost in vhosts.items()}
    samples: dict[str, Samples] = {}
    load_before = os.getloadavg()
    try:
        for variant in args.variants:
            log(f"variant {variant}")
            if variant == "same":
                samples[variant] = _run(_variant(args, urls, AlertClock(None), True, log), args.loop)
                continue
            ctx = multiprocessing.get_context("spawn")
            ready, stop = ctx.Event(), ctx.Event()
            delivered: Queue[tuple[str, float]] = ctx.Queue()
            server = ctx.Process(target=_serve_all_process, args=(urls, args.loop, ready, stop, delivered), daemon=True)
            server.start()
            try:
                if not ready.wait(60):
                    raise SystemExit("the server process did not start")
                samples[variant] = _run(_variant(args, urls, AlertClock(delivered), False, log), args.loop)
            finally:
                stop.set()
                server.join(20)
    finally:
        with ThreadPoolExecutor(len(vhosts)) as pool:
            list(pool.map(delete_vhost, vhosts.values()))
    result: dict[str, Any] = {
        "machine": machine(),
        "loop": args.loop,
        "load_average_before_after": [load_before, os.getloadavg()],
        "versions": {p: _version(p) for p in ("aio-pika", "aiormq", "pamqp", "faststream", "uvloop")},
        "settings": {
            "rounds": args.rounds,
            "calls": {str(level): calls_at(level, args.calls) for level in args.levels},
            "alerts": args.alerts,
            "alert_window": args.window,
            "warmup": args.warmup,
        },
        "variants": {variant: summarize(s) for variant, s in samples.items()},
    }
    result["goals"] = goals(result["variants"])
    result["raw"] = samples
    return result


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke test: 1 round, few calls (seconds)")
    parser.add_argument("--rounds", type=int, default=5, help="short rounds: the machine's speed drifts")
    parser.add_argument("--calls", type=int, default=200, help="calls at 1 in flight (2x at the other levels)")
    parser.add_argument("--levels", default="1,8,64,256", help="calls in flight, comma-separated")
    parser.add_argument("--alerts", type=int, default=2000, help="one-way alerts per contender per round")
    parser.add_argument("--window", type=int, default=256, help="alerts awaiting their confirm at a time")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--variants", default="same,two", help="same (one process), two (servers apart)")
    parser.add_argument(
        "--contenders",
        default=",".join(c for c in CONTENDERS if c != "qbroker_metrics"),
        help="default: all but qbroker_metrics (not a peer: the library instrumented)",
    )
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="in every process")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "img" / "peers.png"), help="PNG ('' for none)")
    parser.add_argument("--output", default="", help="also write the JSON here")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.calls, args.alerts, args.warmup = 1, 60, 300, 20
        args.plot = "" if args.plot == parser.get_default("plot") else args.plot
    args.levels = [int(x) for x in args.levels.split(",")]
    args.variants = [v for v in args.variants.split(",") if v]
    args.contenders = [c for c in args.contenders.split(",") if c]
    os.environ.setdefault("QBROKER_LOG_LEVEL", "WARNING")
    # Killed with SIGTERM, still delete the vhosts (the finally in run()).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from qbroker.log import configure_logging

    configure_logging()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = run(args, log)
    if args.plot:
        from bench.peers_plot import plot

        out = Path(args.plot).resolve()
        plot(result, out)
        result["plot"] = str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out)
    text = json.dumps(result, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
