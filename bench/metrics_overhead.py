"""What the library's Prometheus metrics cost a call, and that they cost nothing when off; prints JSON.

    .venv/bin/python bench/metrics_overhead.py [--transport memory|rabbitmq] [--batches 30] [--calls 300]
    .venv/bin/python bench/metrics_overhead.py --instructions --old bfd2149 [--transport rabbitmq] [--rounds 3]

Both modes run an echo server and its client in one process (one uvloop), ``Unit.call`` after ``Unit.call``.

Time (the default): a plain pair and an instrumented one (``qbroker.metrics.instrument`` on both units),
each on a broker of its own (a fresh in-memory broker or a throwaway vhost), take turns: ``--batches``
batches of ``--calls`` calls, the order flipping every batch. Figures: CPU and wall time per call and their
ratio within each pair of batches; on a shared machine these carry its noise.

Instructions (``--instructions``, needs valgrind): the CPU instructions this process executes per call,
counted by callgrind, which does not depend on what else the machine runs: each variant runs once with no
calls and once with ``--calls`` calls (after the same warm-up), and the difference over the calls is per
call. Variants: ``old`` and ``old_metrics`` (the library at ``--old``, from ``git archive``, plain and
instrumented), ``new`` and ``new_metrics`` (this tree, plain and instrumented). On RabbitMQ a few thousand
instructions per call vary with the network's timing (how many reads a reply takes): compare figures against
that spread (``--rounds``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("plain", "metrics")
PAYLOAD = {"text": "hello", "n": 1}
WARMUP = 200


def _spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


async def _pair(url: str, metrics: bool) -> tuple[Any, Any]:
    from qbroker import Config, Unit

    server = Unit("bench.server", config=Config(url=url))

    @server.rpc("bench.echo", prefetch=256)
    async def echo(body: object) -> object:
        return body

    client = Unit("bench.client", config=Config(url=url))
    if metrics:
        from qbroker.metrics import instrument

        instrument(server)
        instrument(client)
    await server.start()
    await client.start()
    for _ in range(WARMUP):
        await client.call("bench.echo", PAYLOAD, timeout=60)
    return server, client


async def _timed(urls: dict[str, str], batches: int, calls: int) -> dict[str, dict[str, list[float]]]:
    pairs = {name: await _pair(urls[name], name == "metrics") for name in VARIANTS}
    samples: dict[str, dict[str, list[float]]] = {name: {"cpu_us": [], "wall_us": []} for name in VARIANTS}
    try:
        for batch in range(batches):
            for name in VARIANTS if batch % 2 == 0 else VARIANTS[::-1]:
                client = pairs[name][1]
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    await client.call("bench.echo", PAYLOAD, timeout=60)
                samples[name]["cpu_us"].append((time.process_time() - cpu) / calls * 1e6)
                samples[name]["wall_us"].append((time.perf_counter() - wall) / calls * 1e6)
    finally:
        for server, client in pairs.values():
            await client.stop()
            await server.stop()
    return samples


async def _counted(url: str, metrics: bool, calls: int) -> None:
    server, client = await _pair(url, metrics)
    for _ in range(calls):
        await client.call("bench.echo", PAYLOAD, timeout=60)
    await client.stop()
    await server.stop()


def _child(tree: str, url: str, metrics: bool, calls: int) -> None:
    sys.path.insert(0, tree)
    import uvloop

    if url.startswith("memory://"):
        from qbroker.testing import memory_config  # registers memory://

        url = memory_config().urls[0]
    uvloop.run(_counted(url, metrics, calls))


def _instructions(tree: str, url: str, metrics: bool, calls: int) -> int:
    env = {**os.environ, "QBROKER_LOG_LEVEL": "WARNING", "PYTHONPATH": ""}
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--child",
            tree,
            url,
            str(int(metrics)),
            str(calls),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
        check=True,
    )
    found = re.search(r"Collected : ([0-9,]+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind: {out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def _instruction_run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    per_call: dict[str, list[float]] = {"old": [], "old_metrics": [], "new": [], "new_metrics": []}
    with tempfile.TemporaryDirectory() as old_tree:
        archive = subprocess.run(["git", "archive", args.old, "qbroker"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", old_tree], input=archive.stdout, check=True)
        for round_no in range(args.rounds):
            for variant, tree, metrics in (
                ("old", old_tree, False),
                ("old_metrics", old_tree, True),
                ("new", str(ROOT), False),
                ("new_metrics", str(ROOT), True),
            ):
                base = _instructions(tree, url, metrics, 0)
                total = _instructions(tree, url, metrics, args.calls)
                per_call[variant].append((total - base) / args.calls)
                print(
                    f"round {round_no + 1} {variant:<11} {per_call[variant][-1]:10.0f} instructions per call",
                    file=sys.stderr,
                )
    old, new, metered = per_call["old"], per_call["new"], per_call["new_metrics"]
    return {
        "instructions_per_call": {v: _spread(c, 0) for v, c in per_call.items()},
        "new/old": _spread([n / o for n, o in zip(new, old, strict=True)]),
        "new_metrics/old_metrics": _spread([n / o for n, o in zip(metered, per_call["old_metrics"], strict=True)]),
        "new_metrics/new": _spread([m / n for m, n in zip(metered, new, strict=True)]),
        "new_metrics - new": _spread([m - n for m, n in zip(metered, new, strict=True)], 0),
        "samples": per_call,
    }


def _time_run(args: argparse.Namespace, urls: dict[str, str]) -> dict[str, Any]:
    import uvloop

    if args.transport == "memory":
        from qbroker.testing import memory_config  # registers memory://

        urls = {name: memory_config().urls[0] for name in VARIANTS}
    samples = uvloop.run(_timed(urls, args.batches, args.calls))
    summary: dict[str, Any] = {}
    for figure in ("cpu_us", "wall_us"):
        plain, metered = samples["plain"][figure], samples["metrics"][figure]
        summary[figure] = {name: _spread(samples[name][figure], 1) for name in VARIANTS}
        summary[f"metrics/plain {figure}"] = _spread([m / p for m, p in zip(metered, plain, strict=True)])
        # Other processes only ever add time: the least of each side is the closest to its own cost.
        summary[f"metrics - plain {figure} of the fastest batches"] = round(min(metered) - min(plain), 1)
    return {"summary": summary, "samples": samples}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transport", choices=["memory", "rabbitmq"], default="memory")
    parser.add_argument("--batches", type=int, default=30, help="time: batches per variant")
    parser.add_argument("--calls", type=int, default=300, help="calls per batch (time) or per count (instructions)")
    parser.add_argument("--instructions", action="store_true", help="count instructions with callgrind instead")
    parser.add_argument("--old", default=None, help="instructions: the commit whose qbroker to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="instructions: every variant counted this often")
    args = parser.parse_args()
    if args.instructions and args.old is None:
        parser.error("--instructions needs --old COMMIT")
    os.environ.setdefault("QBROKER_LOG_LEVEL", "WARNING")
    sys.path.insert(0, str(ROOT))
    from harness.broker import create_vhost, delete_vhost, url_for_vhost

    vhosts = [create_vhost("qbroker-metrics-bench") for _ in VARIANTS] if args.transport == "rabbitmq" else []
    urls = (
        {name: url_for_vhost(vhost) for name, vhost in zip(VARIANTS, vhosts, strict=True)}
        if vhosts
        else {name: "memory://" for name in VARIANTS}
    )
    load_before = os.getloadavg()
    try:
        result = _instruction_run(args, urls["plain"]) if args.instructions else _time_run(args, urls)
    finally:
        for vhost in vhosts:
            delete_vhost(vhost)
    print(
        json.dumps(
            {
                "mode": "instructions" if args.instructions else "time",
                "transport": args.transport,
                "old": args.old,
                "calls": args.calls,
                "nproc": os.cpu_count(),
                "load_before": load_before,
                "load_after": os.getloadavg(),
                **result,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
