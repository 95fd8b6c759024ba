"""``qbroker-spark-bridge``: serve spark.expire / spark.stats / spark.job on the bus (QBROKER_URL)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import structlog
from pyspark.sql import SparkSession

from qbroker import Unit, serve
from qbroker.metrics_port import add_metrics_options, check_metrics_options
from services.spark_bridge.limits import BridgeLimits
from services.spark_bridge.metrics import NAMESPACE
from services.spark_bridge.service import SparkBridge
from services.spark_bridge.spark_session import DEFAULT_MASTER, build_session
from services.spark_bridge.store_lookup import DRIVER_LOOKUP_BYTES
from services.spark_bridge.stores import Stores
from services.toposm.contract import SPARK_BRIDGE
from services.toposm.metrics_port import service_metrics

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
    p.add_argument(
        "--input-root",
        action="append",
        type=Path,
        default=[Path(r) for r in os.environ.get("SPARK_BRIDGE_INPUT_ROOTS", "").split(os.pathsep) if r],
        metavar="DIR",
        help="directory requests may read inputs from (repeatable; env SPARK_BRIDGE_INPUT_ROOTS, "
        "os.pathsep-separated); default <state-dir>/inputs. Nothing outside these is ever read.",
    )
    limits = BridgeLimits()
    p.add_argument("--max-pending", type=int, default=limits.max_pending_jobs,
                   help="jobs queued or running at once; past it requests are answered `busy`")
    p.add_argument("--max-tiles-ceiling", type=int, default=limits.max_tiles,
                   help="no expire job may expire more tiles than this, whatever it asks")
    p.add_argument("--max-tiles-per-geometry-ceiling", type=int, default=limits.max_tiles_per_geometry)
    p.add_argument("--max-input-bytes", type=int, default=limits.max_input_bytes,
                   help="osmChange bytes (decompressed) one job may read; more fails the job naming the limit")
    p.add_argument("--max-input-objects", type=int, default=limits.max_input_objects,
                   help="osmChange objects (and expire-list lines) one job may read")
    p.add_argument("--keep-jobs", type=int, default=limits.keep_jobs, help="finished job records kept")
    p.add_argument("--keep-days", type=float, default=limits.keep_seconds / 86_400,
                   help="finished job records older than this are deleted")
    p.add_argument("--spark-ui", action="store_true",
                   help="serve the Spark web UI (off by default: it shows job details to anyone who can connect)")
    p.add_argument("--store", action="append", type=Path, default=[], metavar="DIR",
                   help="an OSM store (toposm-import) that expire requests may name to resolve and apply "
                   "diffs against (repeatable); requests name it by its directory name")
    p.add_argument("--driver-lookup-mib", type=float, default=DRIVER_LOOKUP_BYTES / (1 << 20), metavar="MIB",
                   help="rows a diff's store lookups may fetch on the bridge itself (estimated MiB per "
                   "lookup step, default %(default)g); bigger lookups run in Spark tasks; 0: always in Spark")
    p.add_argument("--operator-users", default=os.environ.get("TOPOSM_OPERATOR_USERS", ""),
                   help="broker accounts that see and cancel every job (comma-separated; env TOPOSM_OPERATOR_USERS); "
                   "every other account sees and cancels only the jobs it submitted")
    p.add_argument("--app", default=SPARK_BRIDGE, help="qbroker app name of this unit")
    p.add_argument("--progress-interval", type=float, default=1.0, help="seconds between progress alerts")
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable), e.g. spark.driver.memory=2g",
    )
    add_metrics_options(p)
    args = p.parse_args(argv)
    check_metrics_options(p, args)
    if args.max_jobs < 1:
        p.error("--max-jobs must be at least 1")
    if args.progress_interval <= 0:
        p.error("--progress-interval must be positive")
    for item in args.conf:
        if "=" not in item:
            p.error(f"--conf {item!r}: expected KEY=VALUE")
    try:
        args.limits = BridgeLimits(
            max_tiles=args.max_tiles_ceiling,
            max_tiles_per_geometry=args.max_tiles_per_geometry_ceiling,
            max_pending_jobs=args.max_pending,
            keep_jobs=args.keep_jobs,
            keep_seconds=args.keep_days * 86_400,
            max_input_bytes=args.max_input_bytes,
            max_input_objects=args.max_input_objects,
        )
    except ValueError as exc:
        p.error(str(exc))
    for root in args.input_root:
        if not root.is_dir():
            p.error(f"--input-root {root}: not a directory")
    if args.driver_lookup_mib < 0:
        p.error("--driver-lookup-mib must not be negative")
    args.driver_lookup_bytes = int(args.driver_lookup_mib * (1 << 20))
    args.operator_users = frozenset(u.strip() for u in args.operator_users.split(",") if u.strip())
    try:
        Stores.of(args.store)  # checked here too so a bad --store is a usage error, not a traceback
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)

    def make_service(unit: Unit) -> SparkBridge:
        def build() -> SparkSession:
            log.info("starting Spark session", master=args.master)
            return build_session(args.master, "qbroker-spark-bridge", conf, ui=args.spark_ui)

        return SparkBridge(unit, build, args.state_dir, max_jobs=args.max_jobs,
                           progress_interval=args.progress_interval, input_roots=args.input_root,
                           limits=args.limits, stores=args.store, driver_lookup_bytes=args.driver_lookup_bytes,
                           operator_users=args.operator_users,
                           metrics=service_metrics(NAMESPACE, args.metrics_port, args.metrics_host))

    serve(args.app, make_service)


if __name__ == "__main__":
    main()
