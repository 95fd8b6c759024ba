"""Chaos and fuzz harness: runs the reliability tests in their long form and prints their figures.

    .venv/bin/python bench/chaos.py fuzz [--count 10000]   # every core consumer kind, COUNT messages each
    .venv/bin/python bench/chaos.py osm [--count 10000]    # the queuemaster's `osm` wire, likewise
    .venv/bin/python bench/chaos.py restart                 # broker restart with 1000 calls in flight
    .venv/bin/python bench/chaos.py stale                   # stopped service -> no_server time, after grace
    .venv/bin/python bench/chaos.py queuemaster             # queuemaster SIGKILL, 10,000 queued, 50 waiting
    .venv/bin/python bench/chaos.py renderer                # renderer SIGKILL mid-render -> waiter answered

Each runs the matching test on the real broker (a private node or a throwaway vhost, never the user's
data), so the figure printed is the one the test also checks. docs/reliability.md keeps the results.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = {
    "fuzz": ("tests/qbroker/core/test_fuzz.py", "fuzz:"),
    "osm": ("tests/services/tiles/test_osm_fuzz.py", "OSM-FUZZ:"),
    "restart": ("tests/qbroker/core/test_reconnect.py::test_broker_restart_with_1000_calls_in_flight", "RESTART-1000:"),
    "renderer": (
        "tests/services/tiles/test_bus_faults.py::test_renderer_sigkill_mid_render_is_redispatched",
        "RENDERER-SIGKILL:",
    ),
    "queuemaster": (
        "tests/services/tiles/test_bus_faults.py::test_queuemaster_sigkill_with_10000_queued_and_50_requesters",
        "QM-SIGKILL:",
    ),
    "stale": ("tests/qbroker/core/test_stale_service.py::test_stopped_service_answers_no_server_after_grace", "STALE:"),
}


def run(what: str, count: int) -> int:
    path, marker = TESTS[what]
    env = dict(os.environ, QBROKER_FUZZ_COUNT=str(count))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", path, "-q", "-s", "-p", "no:cacheprovider", "-o", "timeout=7200"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    figures = [line for line in proc.stdout.splitlines() if marker in line]
    summary = [line for line in proc.stdout.splitlines() if " passed" in line or " failed" in line]
    for line in figures + summary[-1:]:
        print(f"{what}: {line.strip()}")
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
    return proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=[*TESTS, "all"])
    parser.add_argument("--count", type=int, default=10_000, help="fuzzed messages per consumer kind")
    args = parser.parse_args()
    codes = [run(what, args.count) for what in (TESTS if args.what == "all" else [args.what])]
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
