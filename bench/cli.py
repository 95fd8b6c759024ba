"""CLI and qbroker-debug costs on a real broker; prints JSON.

1. start-up: wall time of `qbroker --help` and of a whole `qbroker call` (connect, call, stop), median;
2. the snooper's own pipeline (decode, pair, filter, JSON line) in-process, events/s;
3. the debugger's effect on the bus: concurrent call throughput and latency with and without a
   `qbroker-debug --json` running, and how many request/reply pairs it captured.

    .venv/bin/python bench/cli.py [--runs 5] [--calls 5000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from qbroker import Config, Unit
from qbroker.cli.snoop.captured import Captured
from qbroker.cli.snoop.events import decode
from qbroker.cli.snoop.filters import EventFilter
from qbroker.cli.snoop.pairing import RequestTracker
from qbroker.cli.snoop.render import Renderer

BASE_URL = os.environ.get("QBROKER_URL", "amqp://guest:guest@127.0.0.1:5672/")
URL = BASE_URL  # replaced by a throwaway vhost's URL in main()
BIN = Path(sys.executable).parent


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)


def _throwaway_vhost() -> tuple[str, str]:
    """A vhost of our own, so the run leaves no queues or exchanges behind (deleted at the end)."""
    vhost = f"bench-cli-{uuid.uuid4().hex[:8]}"
    _rabbitmqctl("add_vhost", vhost)
    _rabbitmqctl("set_permissions", "-p", vhost, urlsplit(BASE_URL).username or "guest", ".*", ".*", ".*")
    parts = urlsplit(BASE_URL)
    return vhost, urlunsplit((parts.scheme, parts.netloc, "/" + vhost, parts.query, ""))


def _server(
    url: str, prefix: str, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event
) -> None:
    async def main() -> None:
        unit = Unit("bench.cli.server", config=Config(url=url, exchange_prefix=prefix))

        @unit.rpc("bench.cli.echo", prefetch=256)
        async def echo(body: object) -> object:
            return body

        await unit.start()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await unit.stop()

    asyncio.run(main())


def _env(prefix: str) -> dict[str, str]:
    return {**os.environ, "QBROKER_URL": URL, "QBROKER_EXCHANGE_PREFIX": prefix}


def _wall(args: list[str], prefix: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(args, env=_env(prefix), check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 1)


async def _until_shown(out: Any, lines: int, limit: float = 60.0) -> None:
    """Wait until the debugger has printed ``lines`` events (it may lag behind the calls)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with open(out.name, "rb") as current:
            if sum(1 for _ in current) >= lines:
                return
        await asyncio.sleep(0.2)


def _cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pipeline(n_pairs: int) -> float:
    roles = {"rpc": "rpc", "reply": "reply", "alert": "alert", "dead": "dead"}
    tracker, keep, out = RequestTracker(), EventFilter.build(kinds=["request,reply"]), io.StringIO()
    renderer = Renderer(as_json=True, with_body=False, stream=out)
    body = b'{"text":"hello","times":2}'
    started = time.perf_counter()
    for i in range(n_pairs):
        mid = f"m{i}"
        for captured in (
            Captured(
                "traffic",
                "rpc",
                "svc.echo",
                body,
                {"version": 1, "name": "svc.echo", "app": "c"},
                app_id="u1",
                message_id=mid,
                reply_to="u1",
                content_type="application/json",
            ),
            Captured(
                "traffic",
                "reply",
                "u1",
                body,
                {"version": 1, "app": "s"},
                app_id="u2",
                message_id=f"r{i}",
                correlation_id=mid,
                content_type="application/json",
            ),
        ):
            event = decode(captured, roles)
            assert event is not None
            tracker.observe(event)
            if keep(event):
                renderer.show(event)
    return round(2 * n_pairs / (time.perf_counter() - started))


async def _calls(client: Unit, n: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            t0 = time.perf_counter()
            await client.call("bench.cli.echo", {"i": i}, timeout=30)
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "calls_per_s": round(n / elapsed),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(0.99 * len(latencies))] * 1000, 2),
    }


async def _live(prefix: str, n: int, concurrency: int) -> dict[str, object]:
    client = Unit("bench.cli.client", config=Config(url=URL, exchange_prefix=prefix, dead_letters=False))
    await client.start()
    try:
        await _calls(client, 200, concurrency)  # warm-up
        without = await _calls(client, n, concurrency)
        with tempfile.NamedTemporaryFile() as out:
            # asyncio, not Popen: the client lives in this event loop and must answer the debugger's
            # start-up qbroker.ping while we wait for it to be ready.
            debugger = await asyncio.create_subprocess_exec(
                str(BIN / "qbroker-debug"),
                "--json",
                "--kind",
                "request,reply",
                env=_env(prefix),
                stdout=out,
                stderr=asyncio.subprocess.PIPE,
            )
            assert debugger.stderr is not None
            while b"watching" not in await debugger.stderr.readline():  # ready: queues bound
                pass
            cpu_before = _cpu_seconds(debugger.pid)
            with_debugger = await _calls(client, n, concurrency)
            await _until_shown(out, 2 * n)  # let it work through the backlog in its queue before Ctrl-C
            debugger_cpu = _cpu_seconds(debugger.pid) - cpu_before
            debugger.send_signal(2)
            await asyncio.wait_for(debugger.wait(), 30)
            out.seek(0)
            events = [json.loads(line) for line in out.read().splitlines()]
        replies = [e for e in events if e["kind"] == "reply" and e["latency_ms"] is not None]
        seen_latency = sorted(e["latency_ms"] for e in replies)
        return {
            "calls": n,
            "concurrency": concurrency,
            "without_debugger": without,
            "with_debugger": with_debugger,
            "debugger_requests_seen": sum(e["kind"] == "request" for e in events),
            "debugger_replies_seen": sum(e["kind"] == "reply" for e in events),
            "debugger_replies_paired": len(replies),
            "debugger_observed_p50_ms": seen_latency[len(seen_latency) // 2] if seen_latency else None,
            "debugger_cpu_ms_per_message": round(1000 * debugger_cpu / max(1, len(events)), 3),
        }
    finally:
        await client.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--pipeline-pairs", type=int, default=20000)
    args = parser.parse_args()
    global URL
    vhost, URL = _throwaway_vhost()
    prefix = ""
    ready, stop = multiprocessing.Event(), multiprocessing.Event()
    server = multiprocessing.Process(target=_server, args=(URL, prefix, ready, stop), daemon=True)
    server.start()
    ready.wait(30)
    try:
        result = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "startup_ms": {
                "qbroker_help_median": _wall([str(BIN / "qbroker"), "--help"], prefix, args.runs),
                "qbroker_call_median": _wall(
                    [str(BIN / "qbroker"), "call", "bench.cli.echo", "text=x"], prefix, args.runs
                ),
            },
            "snoop_pipeline_events_per_s": _pipeline(args.pipeline_pairs),
            "live": asyncio.run(_live(prefix, args.calls, args.concurrency)),
        }
    finally:
        stop.set()
        server.join(15)
        _rabbitmqctl("delete_vhost", vhost)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
