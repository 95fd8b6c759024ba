"""qbroker against an older qbroker and the QBroker-structured floor, in one run; prints JSON.

    .venv/bin/python bench/rpc_versions.py --old 0438d47 [--rounds 3] [--calls 3000] [--levels 1,64] [--metrics]

Two versions of one package cannot share a process, so every measurement runs in a fresh process (this
script again, with ``--child``): the old library comes from ``git archive <old> qbroker bench`` in a temporary
directory, put first on ``sys.path``. In each round every level measures old, new and ``floor_seed``
(bench/peers_rpc.py) one after the other, each in its own throwaway vhost, with the echo server and the client
on one uvloop (as docs/performance.md's peer figures were measured). Figures: calls/s and the process's CPU
time per call; the ratios that count are taken within a round. ``--metrics`` adds ``new_metrics``: the new
library with both units instrumented (``qbroker.metrics``, bench/peers_rpc.py's ``qbroker_metrics``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _child(tree: str, contender: str, calls: int, level: int) -> None:
    sys.path[:0] = [str(Path(tree) / "bench"), tree]
    import peers_rpc  # type: ignore[import-not-found]  # the tree's own copy, with the tree's qbroker
    import uvloop

    from harness.broker import create_vhost, delete_vhost, url_for_vhost  # from this checkout (PYTHONPATH)

    async def main(url: str) -> dict[str, float]:
        spec = peers_rpc.CONTENDERS[contender]
        stop_server = await spec.serve(url)
        call, stop_client = await spec.connect(url)
        for _ in range(200):  # warm up
            await call()
        slots = asyncio.Semaphore(level)

        async def one() -> None:
            async with slots:
                await call()

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(calls)))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        await stop_client()
        await stop_server()
        return {"calls_per_s": calls / wall, "cpu_us_per_call": cpu / calls * 1e6}

    vhost = create_vhost("qbroker-versions")
    try:
        uvloop.install()
        print(json.dumps(asyncio.run(main(url_for_vhost(vhost)))))
    finally:
        delete_vhost(vhost)


def _measure(tree: str, contender: str, calls: int, level: int) -> dict[str, float]:
    env = {**os.environ, "QBROKER_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", tree, contender, str(calls), str(level)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _median_range(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the commit whose qbroker to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--levels", default="1,64")
    parser.add_argument("--metrics", action="store_true", help="also measure the new library instrumented")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    variants = [
        ("old", "qbroker"),
        ("new", "qbroker"),
        *([("new_metrics", "qbroker_metrics")] if args.metrics else []),
        ("floor_seed", "floor_seed"),
    ]
    samples: dict[str, dict[str, list[dict[str, float]]]] = {
        str(level): {variant: [] for variant, _ in variants} for level in levels
    }
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as old_tree:
        archive = subprocess.run(
            ["git", "archive", args.old, "qbroker", "bench"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", old_tree], input=archive.stdout, check=True)
        for round_no in range(args.rounds):
            for level in levels:
                for variant, contender in variants:
                    result = _measure(old_tree if variant == "old" else str(ROOT), contender, args.calls, level)
                    samples[str(level)][variant].append(result)
                    print(
                        f"round {round_no + 1} level {level:>3} {variant:<11} {result['calls_per_s']:7.0f} calls/s "
                        f"{result['cpu_us_per_call']:5.0f} us CPU per call",
                        file=sys.stderr,
                    )
    summary: dict[str, Any] = {}
    for level, by_variant in samples.items():
        old, new, floor = by_variant["old"], by_variant["new"], by_variant["floor_seed"]
        summary[level] = {
            "calls_per_s": {v: _median_range([r["calls_per_s"] for r in runs]) for v, runs in by_variant.items()},
            "cpu_us_per_call": {
                v: _median_range([r["cpu_us_per_call"] for r in runs]) for v, runs in by_variant.items()
            },
            "new/old calls_per_s": _median_range(
                [n["calls_per_s"] / o["calls_per_s"] for n, o in zip(new, old, strict=True)]
            ),
            "new/floor_seed calls_per_s": _median_range(
                [n["calls_per_s"] / f["calls_per_s"] for n, f in zip(new, floor, strict=True)]
            ),
            "old/floor_seed calls_per_s": _median_range(
                [o["calls_per_s"] / f["calls_per_s"] for o, f in zip(old, floor, strict=True)]
            ),
            "new/old cpu_us_per_call": _median_range(
                [n["cpu_us_per_call"] / o["cpu_us_per_call"] for n, o in zip(new, old, strict=True)]
            ),
        }
        if "new_metrics" in by_variant:
            metered = by_variant["new_metrics"]
            summary[level]["new_metrics/new calls_per_s"] = _median_range(
                [m["calls_per_s"] / n["calls_per_s"] for m, n in zip(metered, new, strict=True)]
            )
            summary[level]["new_metrics/new cpu_us_per_call"] = _median_range(
                [m["cpu_us_per_call"] / n["cpu_us_per_call"] for m, n in zip(metered, new, strict=True)]
            )
    print(
        json.dumps(
            {
                "old": args.old,
                "new": subprocess.run(
                    ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
                ).stdout.strip(),
                "calls": args.calls,
                "rounds": args.rounds,
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "summary": summary,
                "samples": samples,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
