"""``qbroker-spark-bridge``: serve spark.expire / spark.stats / spark.job on the bus (QBROKER_URL)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import structlog
from pydantic import BeforeValidator, model_validator
from pydantic_settings import NoDecode
from pyspark.sql import SparkSession

from qbroker import Unit, serve
from qbroker.settings import option
from services.spark_bridge.limits import BridgeLimits
from services.spark_bridge.metrics import NAMESPACE
from services.spark_bridge.service import SparkBridge
from services.spark_bridge.spark_session import DEFAULT_MASTER, build_session
from services.spark_bridge.store_lookup import DRIVER_LOOKUP_BYTES
from services.spark_bridge.stores import Stores
from services.toposm.contract import SPARK_BRIDGE
from services.toposm.metrics_port import service_metrics
from services.toposm.settings import StackSettings, UserList, stack_option

log = structlog.get_logger("spark_bridge")


def _path_list(value: object) -> object:
    return [Path(r) for r in value.split(os.pathsep) if r] if isinstance(value, str) else value


PathList = Annotated[list[Path], NoDecode, BeforeValidator(_path_list)]
_LIMITS = BridgeLimits()


class BridgeSettings(StackSettings):
    prog = "qbroker-spark-bridge"
    description = __doc__

    master: str = option(
        DEFAULT_MASTER,
        "local[*], spark://host:7077 (standalone) or sc://host:15002 (Spark Connect)",
        env=("TOPOSM_SPARK_MASTER", "SPARK_MASTER"),
        metavar="URL",
    )
    max_jobs: int = option(2, "jobs running at once; more wait queued", ge=1)
    state_dir: Path = option(
        Path("spark-bridge-state"), "job records, logs and stats outputs (survive restarts)", metavar="DIR"
    )
    input_root: PathList = option(
        [],
        "directory requests may read inputs from (repeatable; in the environment "
        "os.pathsep-separated). Nothing outside these is ever read",
        metavar="DIR",
        repeat=True,
        env=("TOPOSM_INPUT_ROOTS", "SPARK_BRIDGE_INPUT_ROOTS"),
        default_text="<state-dir>/inputs",
    )
    max_pending: int = option(
        _LIMITS.max_pending_jobs, "jobs queued or running at once; past it requests are answered `busy`"
    )
    max_tiles_ceiling: int = option(
        _LIMITS.max_tiles, "no expire job may expire more tiles than this, whatever it asks"
    )
    max_tiles_per_geometry_ceiling: int = option(
        _LIMITS.max_tiles_per_geometry, "no geometry of an expire job may expire more tiles than this"
    )
    max_input_bytes: int = option(
        _LIMITS.max_input_bytes, "osmChange bytes (decompressed) one job may read; more fails the job naming the limit"
    )
    max_input_objects: int = option(
        _LIMITS.max_input_objects, "osmChange objects (and expire-list lines) one job may read"
    )
    keep_jobs: int = option(_LIMITS.keep_jobs, "finished job records kept")
    keep_days: float = option(_LIMITS.keep_seconds / 86_400, "finished job records older than this are deleted")
    spark_ui: bool = option(
        False, "serve the Spark web UI (off by default: it shows job details to anyone who can connect)"
    )
    store: list[Path] = option(
        [],
        "an OSM store (toposm-import) that expire requests may name to resolve and "
        "apply diffs against (repeatable); requests name it by its directory name",
        metavar="DIR",
        repeat=True,
    )
    driver_lookup_mib: float = option(
        DRIVER_LOOKUP_BYTES / (1 << 20),
        "rows a diff's store lookups may fetch on "
        "the bridge itself (estimated MiB per lookup step); bigger lookups run in "
        "Spark tasks; 0: always in Spark",
        metavar="MIB",
        ge=0,
    )
    operator_users: UserList = stack_option(
        "operator_users",
        help="broker accounts that see and cancel every job "
        "(comma-separated); every other account sees and cancels only the "
        "jobs it submitted",
    )
    app: str = option(SPARK_BRIDGE, "qbroker app name of this unit", metavar="NAME")
    progress_interval: float = option(1.0, "seconds between progress alerts", gt=0)
    conf: list[str] = option(
        [], "extra Spark configuration (repeatable), e.g. spark.driver.memory=2g", metavar="KEY=VALUE", repeat=True
    )

    @model_validator(mode="after")
    def _consistent(self) -> BridgeSettings:
        for item in self.conf:
            if "=" not in item:
                raise ValueError(f"--conf {item!r}: expected KEY=VALUE")
        self.limits()  # ValueError naming the limit
        for root in self.input_root:
            if not root.is_dir():
                raise ValueError(f"--input-root {root}: not a directory")
        Stores.of(self.store)  # checked here too so a bad --store is a usage error, not a traceback
        return self

    def limits(self) -> BridgeLimits:
        return BridgeLimits(
            max_tiles=self.max_tiles_ceiling,
            max_tiles_per_geometry=self.max_tiles_per_geometry_ceiling,
            max_pending_jobs=self.max_pending,
            keep_jobs=self.keep_jobs,
            keep_seconds=self.keep_days * 86_400,
            max_input_bytes=self.max_input_bytes,
            max_input_objects=self.max_input_objects,
        )

    @property
    def driver_lookup_bytes(self) -> int:
        return int(self.driver_lookup_mib * (1 << 20))


def parse_args(argv: list[str] | None = None) -> BridgeSettings:
    return BridgeSettings.parse(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)

    def make_service(unit: Unit) -> SparkBridge:
        def build() -> SparkSession:
            log.info("starting Spark session", master=args.master)
            return build_session(args.master, "qbroker-spark-bridge", conf, ui=args.spark_ui)

        return SparkBridge(
            unit,
            build,
            args.state_dir,
            max_jobs=args.max_jobs,
            progress_interval=args.progress_interval,
            input_roots=args.input_root,
            limits=args.limits(),
            stores=args.store,
            driver_lookup_bytes=args.driver_lookup_bytes,
            operator_users=args.operator_users,
            metrics=service_metrics(NAMESPACE, args.metrics_port, args.metrics_host),
        )

    serve(args.app, make_service, settings=args)


if __name__ == "__main__":
    main()
