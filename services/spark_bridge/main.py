"""``qbroker-spark-bridge``: serve spark.expire / spark.stats / spark.job on the bus (QBROKER_URL)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

import structlog

from qbroker import Config, Unit
from qbroker.log import configure_logging
from services.spark_bridge.service import SparkBridge
from services.spark_bridge.spark_session import DEFAULT_MASTER, build_session

log = structlog.get_logger("spark_bridge")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="qbroker-spark-bridge", description=__doc__)
    p.add_argument(
        "--master",
        default=os.environ.get("SPARK_MASTER", DEFAULT_MASTER),
        help="local[*] (default), spark://host:7077 (standalone) or sc://host:15002 (Spark Connect)",
    )
    p.add_argument("--max-jobs", type=int, default=2, help="jobs running at once; more wait queued")
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path("spark-bridge-state"),
        help="job records, logs and stats outputs (survive restarts)",
    )
    p.add_argument("--app", default="spark.bridge", help="qbroker app name of this unit")
    p.add_argument("--progress-interval", type=float, default=1.0, help="seconds between progress alerts")
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable), e.g. spark.driver.memory=2g",
    )
    args = p.parse_args(argv)
    if args.max_jobs < 1:
        p.error("--max-jobs must be at least 1")
    if args.progress_interval <= 0:
        p.error("--progress-interval must be positive")
    for item in args.conf:
        if "=" not in item:
            p.error(f"--conf {item!r}: expected KEY=VALUE")
    return args


async def serve(args: argparse.Namespace) -> None:
    conf = dict(item.split("=", 1) for item in args.conf)
    # Session start blocks for seconds (JVM launch): keep it off the event loop.
    spark = await asyncio.to_thread(build_session, args.master, "qbroker-spark-bridge", conf)
    unit = Unit(args.app, config=Config())  # type: ignore[call-arg]  # from QBROKER_* env
    bridge = SparkBridge(unit, spark, args.state_dir, max_jobs=args.max_jobs, progress_interval=args.progress_interval)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await unit.start()
    log.info("spark bridge online", master=args.master, max_jobs=args.max_jobs, state_dir=str(args.state_dir))
    try:
        await stop.wait()
    finally:
        await bridge.close()
        await unit.stop()
        await asyncio.to_thread(spark.stop)


def main(argv: list[str] | None = None) -> None:
    configure_logging()
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
