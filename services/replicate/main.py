"""``toposm-replicate --source DIR|URL --store DIR``: follow OSM replication diffs into a store (QBROKER_URL).

The Spark bridge must run with ``--store DIR`` for the same store (it applies the diffs and publishes the
expirations), with the spool (default ``STORE/replication-spool``, where the merged diffs are written)
under one of its ``--input-root`` directories. With ``--postgis DSN`` a PostGIS store imported with
``toposm-import --postgis`` is kept current too, with osm2pgsql. With ``--postgis DSN --spool DIR`` and no
``--store``, the PostGIS store is followed alone, as osm2pgsql/renderd operators do: osm2pgsql's own expiry
(``--min-zoom``..``--max-zoom``) is published as ``expire_toposm`` on both wires; no bridge is needed.
"""

from __future__ import annotations

import signal
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import model_validator

from qbroker import Unit
from qbroker.exit_codes import ExitCode
from qbroker.log import exit_fatal
from qbroker.metrics_port import MetricsServer
from qbroker.runner import serve
from qbroker.settings import option
from services.replicate.follower import Follower, FollowSettings
from services.replicate.metrics import NAMESPACE
from services.replicate.source import DOWNLOAD_DEADLINE, is_url
from services.toposm.metrics_port import service_metrics
from services.toposm.seed_wire import AllProgramsTopic
from services.toposm.settings import StackSettings, check_zooms, stack_option

APP = "toposm.replicate"


class ReplicateSettings(StackSettings):
    prog = "toposm-replicate"
    description = __doc__.split("\n\n")[0]

    source: str = option(
        help="replication directory or its http(s):// URL, e.g. "
        "https://planet.openstreetmap.org/replication/minute/ (state.txt, 000/000/001.osc.gz, ...)",
        metavar="DIR|URL",
    )
    store: Path | None = stack_option(
        "store",
        help="the embedded store (toposm-import --store) to keep current; without it, --postgis and --spool are needed",
    )
    store_name: str | None = option(None, "the store's name on the bridge", default_text="the directory's name")
    start: int | None = option(None, "first sequence to apply when a store has none yet", ge=0)
    interval: float = option(60.0, "seconds between looks at state.txt", gt=0)
    once: bool = option(False, "apply what is published, then exit")
    min_zoom: int = stack_option("min_zoom", 10)
    max_zoom: int = stack_option("max_zoom", 18)
    call_timeout: float = option(3600.0, "seconds to wait for one job of the bridge", gt=0)
    batch: int = option(10, "diffs merged into one job at most when behind", ge=1)
    max_backoff: float = option(900.0, "longest wait, in seconds, when the source or the bridge keeps failing", gt=0)
    spool: Path | None = option(
        None,
        "where merged diffs are written for the bridge (under one of its "
        "--input-root); without --store, also osm2pgsql's pending expiry and "
        "replication.json",
        metavar="DIR",
        default_text="STORE/replication-spool",
    )
    http_timeout: float = option(60.0, "seconds to connect to the replication server and for each read from it", gt=0)
    http_deadline: float = option(
        DOWNLOAD_DEADLINE,
        "seconds for one download in all (a state file or a diff); "
        "a server that takes longer is backed off like one that does not answer",
        gt=0,
    )
    postgis: str | None = stack_option(
        "postgis",
        help="keep this PostGIS store current (osm2pgsql --append); alone (no --store), publish osm2pgsql's expiry too",
    )
    flat_nodes: Path | None = stack_option("flat_nodes")
    expire_output: Path | None = option(
        None, "with --postgis: append osm2pgsql's expired tiles (--min-zoom..--max-zoom) to FILE", metavar="FILE"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ReplicateSettings:
        if is_url(self.source):
            if urlsplit(self.source).username is not None:  # it would be in every log line and replication.json
                raise ValueError("--source: credentials in the URL are not supported (they would be logged)")
        elif "://" in self.source:
            raise ValueError(f"--source {self.source}: only http:// and https:// URLs, or a directory")
        elif not (Path(self.source) / "state.txt").is_file():
            raise ValueError(f"--source {self.source}: no state.txt (not a replication directory)")
        if self.store is None and not (self.postgis and self.spool):
            raise ValueError("--store, or --postgis with --spool (a PostGIS store followed alone) is needed")
        if self.store is not None and not (self.store / "geometry").is_dir():
            raise ValueError(f"--store {self.store}: no geometry store (import the extract with toposm-import)")
        check_zooms(self.min_zoom, self.max_zoom)
        if self.max_zoom > 22:
            raise ValueError("--max-zoom goes up to 22 here (osm2pgsql's expiry)")
        if (self.flat_nodes or self.expire_output) and not self.postgis:
            raise ValueError("--flat-nodes and --expire-output go with --postgis")
        return self

    def follow_settings(self) -> FollowSettings:
        source: Path | str = Path(self.source).resolve()
        if is_url(self.source):
            source = self.source if self.source.endswith("/") else self.source + "/"
        store = self.store.resolve() if self.store is not None else None
        name = self.store_name or (store.name if store is not None else "postgis")
        return FollowSettings(
            source=source,
            store=store,
            store_name=name,
            start=self.start,
            interval=self.interval,
            once=self.once,
            min_zoom=self.min_zoom,
            max_zoom=self.max_zoom,
            call_timeout=self.call_timeout,
            batch=self.batch,
            max_backoff=self.max_backoff,
            spool=self.spool.resolve() if self.spool else None,
            http_timeout=self.http_timeout,
            http_deadline=self.http_deadline,
            postgis=self.postgis,
            flat_nodes=self.flat_nodes.resolve() if self.flat_nodes else None,
            expire_output=self.expire_output.resolve() if self.expire_output else None,
        )


def parse_args(argv: list[str] | None = None) -> FollowSettings:
    return ReplicateSettings.parse(argv).follow_settings()


class _Process(Follower):
    """Ends the process when the follower ends (``--once``, or an error): the runner's own graceful stop.
    Listens on ``toposm`` as every running program does (docs/tiles.md); nothing said there concerns it."""

    def __init__(self, unit: Unit, settings: FollowSettings, metrics: MetricsServer) -> None:
        super().__init__(unit, settings, metrics)
        self.all_programs = AllProgramsTopic(unit, registry=self.metrics_server.registry)

    async def start(self) -> None:
        await super().start()
        assert self._task is not None
        # serve() stops on the first SIGTERM; raising it is how a service ends its own process through it.
        self._task.add_done_callback(self._finished)

    def _finished(self, _task: object) -> None:
        if not self._stopping.is_set():  # not already stopping: a second signal would kill the process
            signal.raise_signal(signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    options = ReplicateSettings.parse(argv)
    settings = options.follow_settings()
    metrics = service_metrics(NAMESPACE, options.metrics_port, options.metrics_host)
    follower: list[_Process] = []

    def make(unit: Unit) -> _Process:
        follower.append(_Process(unit, settings, metrics))
        return follower[0]

    serve(APP, make, settings=options)
    if follower and follower[0].error:
        exit_fatal(f"toposm-replicate: {follower[0].error}", int(ExitCode.ERROR))


if __name__ == "__main__":
    main()
