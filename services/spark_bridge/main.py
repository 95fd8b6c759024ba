"""``qbroker-spark-bridge``: serve spark.expire / spark.stats / spark.job on the bus (QBROKER_URL)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import structlog
from pyspark.sql import SparkSession

from qbroker import Unit, serve
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)

    def make_service(unit: Unit) -> SparkBridge:
        def build() -> SparkSession:
            log.info("starting Spark session", master=args.master)
            return build_session(args.master, "qbroker-spark-bridge", conf)

        return SparkBridge(unit, build, args.state_dir, max_jobs=args.max_jobs,
                           progress_interval=args.progress_interval)

    serve(args.app, make_service)


if __name__ == "__main__":
    main()
