"""The server's CPU per request in ``rpc.serve_request``, an older qbroker against this one; prints JSON.

    .venv/bin/python bench/serve_overhead.py --old 11a40a1 [--rounds 7] [--requests 20000] [--metrics]

The RPC hot path without the broker, whose noise on a shared machine hides a few percent: a real ``Bus`` (not
connected; its reply and ack are no-ops) serves a realistic request (header with deadline, JSON body, a
handler with two validated parameters) ``--requests`` times. Each measurement runs in a fresh process (this
script with ``--child``), old and new alternating within a round; the ratio that counts is taken within a
round (docs/performance.md, "The middleware chain on the RPC hot path"). ``--metrics`` adds ``new_metrics``:
the new library with the bus's middleware holding qbroker.metrics' link (what ``instrument(unit)`` adds to a
server).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _child(tree: str, requests: int, metrics: bool) -> None:
    sys.path.insert(0, tree)

    import orjson

    from qbroker import Config
    from qbroker.bus import Bus
    from qbroker.endpoints import Endpoint, EndpointOptions
    from qbroker.handlers import Handler
    from qbroker.log import get_logger
    from qbroker.rpc import serve_request

    class Message:  # what aio-pika hands a consumer, as far as serve_request reads it
        def __init__(self) -> None:
            self.headers = {
                "version": 1,
                "app": "bench",
                "name": "bench.echo",
                "deadline": int((time.time() + 3600) * 1000),
            }
            self.body = orjson.dumps({"text": "hello", "times": 2})
            self.message_id, self.reply_to, self.correlation_id = "m" * 32, "r" * 32, None
            self.content_type, self.app_id, self.type, self.user_id = "application/json", "a" * 32, "rpc", None
            self.redelivered, self.delivery_mode, self.processed = False, 1, False

        async def ack(self) -> None:
            self.processed = True

    async def echo(text: str, times: int = 1) -> dict[str, str]:
        return {"text": text * times}

    async def main() -> dict[str, float]:
        async def no_connection(*_: object) -> None:
            return None

        bus = Bus(Config(), app="bench", uuid="u" * 32, log=get_logger(), on_connected=no_connection)

        async def send_reply(*_: object, **__: object) -> None:
            return None

        bus.send_reply = send_reply  # type: ignore[method-assign]
        if metrics:
            from qbroker.metrics import MetricsMiddleware, UnitMetrics

            bus.middleware.use(MetricsMiddleware(UnitMetrics()))
        endpoint = Endpoint(name="bench.echo", options=EndpointOptions())
        endpoint.handler = Handler(echo, "bench.echo")
        for _ in range(1000):  # warm up
            await serve_request(bus, endpoint, Message())  # type: ignore[arg-type]
        messages = [Message() for _ in range(requests)]
        cpu = time.process_time()
        for message in messages:
            await serve_request(bus, endpoint, message)  # type: ignore[arg-type]
        return {"cpu_us_per_request": (time.process_time() - cpu) / requests * 1e6}

    import uvloop

    print(json.dumps(uvloop.run(main())))


def _measure(tree: str, requests: int, metrics: bool = False) -> float:
    env = {**os.environ, "QBROKER_LOG_LEVEL": "WARNING", "PYTHONPATH": ""}
    out = subprocess.run(
        [sys.executable, __file__, "--child", tree, str(requests), str(int(metrics))],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["cpu_us_per_request"])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the commit whose qbroker to compare with")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--metrics", action="store_true", help="also measure the new library instrumented")
    args = parser.parse_args()
    old_us: list[float] = []
    new_us: list[float] = []
    metered_us: list[float] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as old_tree:
        archive = subprocess.run(["git", "archive", args.old, "qbroker"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", old_tree], input=archive.stdout, check=True)
        for round_no in range(args.rounds):
            order = [("old", old_tree, old_us), ("new", str(ROOT), new_us)]
            if args.metrics:
                order.append(("new_metrics", str(ROOT), metered_us))
            if round_no % 2:
                order.reverse()  # none always goes first
            for variant, tree, results in order:
                results.append(_measure(tree, args.requests, variant == "new_metrics"))
            print(
                f"round {round_no + 1}: old {old_us[-1]:.1f} us, new {new_us[-1]:.1f} us"
                + (f", new_metrics {metered_us[-1]:.1f} us" if args.metrics else ""),
                file=sys.stderr,
            )
    ratios = [n / o for n, o in zip(new_us, old_us, strict=True)]
    metered: dict[str, object] = {}
    if args.metrics:
        metered_ratios = [m / n for m, n in zip(metered_us, new_us, strict=True)]
        metered = {
            "new_metrics_cpu_us_per_request": _spread(metered_us, 2),
            "new_metrics/new cpu": _spread(metered_ratios, 3),
            "new_metrics/new cpu of the fastest runs": round(min(metered_us) / min(new_us), 3),
            "new_metrics - new us of the fastest runs": round(min(metered_us) - min(new_us), 2),
        }
    print(
        json.dumps(
            {
                "old": args.old,
                "requests": args.requests,
                "rounds": args.rounds,
                "nproc": os.cpu_count(),
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "old_cpu_us_per_request": {
                    "median": round(statistics.median(old_us), 2),
                    "min": round(min(old_us), 2),
                    "max": round(max(old_us), 2),
                },
                "new_cpu_us_per_request": {
                    "median": round(statistics.median(new_us), 2),
                    "min": round(min(new_us), 2),
                    "max": round(max(new_us), 2),
                },
                "new/old cpu": {
                    "median": round(statistics.median(ratios), 3),
                    "min": round(min(ratios), 3),
                    "max": round(max(ratios), 3),
                },
                # On a loaded machine other processes only ever add CPU time (cache, frequency): the least of
                # each side is the closest to its own cost.
                "new/old cpu of the fastest runs": round(min(new_us) / min(old_us), 3),
                **metered,
            },
            indent=2,
        )
    )


def _spread(values: list[float], digits: int) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


if __name__ == "__main__":
    main()
