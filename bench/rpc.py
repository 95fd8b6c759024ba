"""RPC and alert throughput on a real broker; prints JSON.

The echo server runs in its own process (as it would in production); the client measures:
sequential calls/s, 64-concurrent calls/s, p50/p99 latency of each, and one-way alert msgs/s
(published and received by a listener in the server process), and how fast a call to a name nobody
serves fails with ``no_server`` (answered by the dead-letter path, not by the caller's deadline).

    .venv/bin/python bench/rpc.py [--seq 3000] [--conc 20000] [--alerts 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
import uuid
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import qbroker
from qbroker import Config, NoServer, Unit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402


def _run(coro: Any, loop: str) -> Any:
    return asyncio.run(coro) if loop == "asyncio" else qbroker.run(coro)


def _server(url: str, prefix: str, loop: str, ready: Event, stop: Event) -> None:
    async def main() -> None:
        unit = Unit("bench.server", config=Config(url=url, exchange_prefix=prefix))
        received = 0

        @unit.rpc("bench.echo", prefetch=256)
        async def echo(body: object) -> object:
            return body

        @unit.rpc("bench.alerts_received")
        async def alerts_received() -> int:
            return received

        @unit.on_alert("bench.tick")
        async def tick() -> None:
            nonlocal received
            received += 1

        await unit.start()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await unit.stop()

    _run(main(), loop)


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _bench(
    url: str, prefix: str, n_seq: int, n_conc: int, n_alerts: int, concurrency: int, n_no_server: int
) -> dict[str, object]:
    client = Unit("bench.client", config=Config(url=url, exchange_prefix=prefix))
    await client.start()
    payload = {"text": "hello", "n": 1}
    for _ in range(200):  # warm up
        await client.call("bench.echo", payload)

    latencies: list[float] = []
    started = time.perf_counter()
    for _ in range(n_seq):
        t0 = time.perf_counter()
        await client.call("bench.echo", payload)
        latencies.append(time.perf_counter() - t0)
    seq_elapsed = time.perf_counter() - started

    conc_latencies: list[float] = []
    remaining = n_conc

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            await client.call("bench.echo", payload, timeout=30)
            conc_latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    conc_elapsed = time.perf_counter() - started

    base = await client.call("bench.alerts_received")
    started = time.perf_counter()
    batch = 256
    for i in range(0, n_alerts, batch):
        await asyncio.gather(*(client.alert("bench.tick", {"i": j}) for j in range(i, min(n_alerts, i + batch))))
    published = time.perf_counter() - started
    while await client.call("bench.alerts_received") - base < n_alerts:
        if time.perf_counter() - started > 120:
            break
        await asyncio.sleep(0.02)
    delivered = time.perf_counter() - started

    no_server: list[float] = []
    for _ in range(n_no_server):
        t0 = time.perf_counter()
        try:
            await client.call("bench.nobody_serves_this", payload, timeout=30)
        except NoServer:
            no_server.append(time.perf_counter() - t0)
    await client.stop()
    ms = 1000.0
    return {
        "sequential": {
            "calls": n_seq,
            "calls_per_s": round(n_seq / seq_elapsed, 1),
            "p50_ms": round(_percentile(latencies, 0.5) * ms, 3),
            "p99_ms": round(_percentile(latencies, 0.99) * ms, 3),
            "mean_ms": round(statistics.fmean(latencies) * ms, 3),
        },
        "concurrent": {
            "calls": n_conc,
            "in_flight": concurrency,
            "calls_per_s": round(n_conc / conc_elapsed, 1),
            "p50_ms": round(_percentile(conc_latencies, 0.5) * ms, 3),
            "p99_ms": round(_percentile(conc_latencies, 0.99) * ms, 3),
        },
        "alerts": {
            "messages": n_alerts,
            "published_per_s": round(n_alerts / published, 1),
            "delivered_per_s": round(n_alerts / delivered, 1),
        },
        "no_server": {
            "calls": n_no_server,
            "answered_no_server": len(no_server),
            "p50_ms": round(_percentile(no_server, 0.5) * ms, 3) if no_server else None,
            "p99_ms": round(_percentile(no_server, 0.99) * ms, 3) if no_server else None,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=3000)
    parser.add_argument("--conc", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--alerts", type=int, default=20000)
    parser.add_argument("--no-server", type=int, default=300, help="calls to a name nobody serves")
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="event loop of both processes (qbroker.run picks uvloop when installed)",
    )
    args = parser.parse_args()
    os.environ.setdefault("QBROKER_LOG_LEVEL", "WARNING")
    from qbroker.log import configure_logging

    configure_logging()
    prefix = f"bench-{uuid.uuid4().hex[:6]}."
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    vhost = create_vhost("qbroker-bench")  # a throwaway vhost: nothing is left on the broker
    url = url_for_vhost(vhost)
    server = ctx.Process(target=_server, args=(url, prefix, args.loop, ready, stop), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise SystemExit("bench server did not start")
        result = _run(
            _bench(url, prefix, args.seq, args.conc, args.alerts, args.concurrency, args.no_server), args.loop
        )
    finally:
        stop.set()
        server.join(15)
        delete_vhost(vhost)
    result["loop"] = args.loop
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
