"""``toposm-replicate --source DIR|URL --store DIR``: follow OSM replication diffs into a store (QBROKER_URL).

The Spark bridge must run with ``--store DIR`` for the same store (it applies the diffs and publishes the
expirations), with the spool (default ``STORE/replication-spool``, where the merged diffs are written)
under one of its ``--input-root`` directories. With ``--postgis DSN`` a PostGIS store imported with
``toposm-import --postgis`` is kept current too, with osm2pgsql. With ``--postgis DSN --spool DIR`` and no
``--store``, the PostGIS store is followed alone, as osm2pgsql/renderd operators do: osm2pgsql's own expiry
(``--min-zoom``..``--max-zoom``) is published as ``expire_toposm`` on both wires; no bridge is needed.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from urllib.parse import urlsplit

from qbroker import Unit
from qbroker.log import exit_fatal
from qbroker.metrics_port import MetricsServer, add_metrics_options, check_metrics_options
from qbroker.runner import serve
from services.replicate.follower import Follower, FollowSettings
from services.replicate.metrics import NAMESPACE
from services.replicate.source import DOWNLOAD_DEADLINE, is_url
from services.toposm.metrics_port import service_metrics
from services.toposm.seed_wire import AllProgramsTopic

APP = "toposm.replicate"


def parse_args(argv: list[str] | None = None) -> FollowSettings:
    return parse_command(argv)[0]


def parse_command(argv: list[str] | None = None) -> tuple[FollowSettings, MetricsServer]:
    p = argparse.ArgumentParser(prog="toposm-replicate", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True,
                   help="replication directory or its http(s):// URL, e.g. "
                        "https://planet.openstreetmap.org/replication/minute/ (state.txt, 000/000/001.osc.gz, ...)")
    p.add_argument("--store", type=Path, help="the embedded store (toposm-import --store) to keep current; "
                                             "without it, --postgis and --spool are needed")
    p.add_argument("--store-name", help="the store's name on the bridge (default: the directory's name)")
    p.add_argument("--start", type=int, help="first sequence to apply when a store has none yet")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between looks at state.txt")
    p.add_argument("--once", action="store_true", help="apply what is published, then exit")
    p.add_argument("--min-zoom", type=int, default=10)
    p.add_argument("--max-zoom", type=int, default=18)
    p.add_argument("--call-timeout", type=float, default=3600.0, help="seconds to wait for one job of the bridge")
    p.add_argument("--batch", type=int, default=10, help="diffs merged into one job at most when behind")
    p.add_argument("--max-backoff", type=float, default=900.0,
                   help="longest wait, in seconds, when the source or the bridge keeps failing")
    p.add_argument("--spool", type=Path, help="where merged diffs are written for the bridge (under one of its "
                                              "--input-root; default STORE/replication-spool); without --store, "
                                              "also osm2pgsql's pending expiry and replication.json")
    p.add_argument("--http-timeout", type=float, default=60.0,
                   help="seconds to connect to the replication server and for each read from it")
    p.add_argument("--http-deadline", type=float, default=DOWNLOAD_DEADLINE,
                   help="seconds for one download in all (a state file or a diff); a server that takes longer "
                        "is backed off like one that does not answer")
    p.add_argument("--postgis", metavar="DSN", help="keep this PostGIS store current (osm2pgsql --append); "
                                                    "alone (no --store), publish osm2pgsql's expiry too")
    p.add_argument("--flat-nodes", type=Path, metavar="FILE", help="with --postgis: the import's flat-nodes file")
    p.add_argument("--expire-output", type=Path, metavar="FILE",
                   help="with --postgis: append osm2pgsql's expired tiles (--min-zoom..--max-zoom) to FILE")
    add_metrics_options(p)
    a = p.parse_args(argv)
    check_metrics_options(p, a)
    source: Path | str = a.source
    if is_url(a.source):
        if urlsplit(a.source).username is not None:  # it would be in every log line and replication.json
            p.error("--source: credentials in the URL are not supported (they would be logged)")
        source = a.source if a.source.endswith("/") else a.source + "/"
    elif "://" in a.source:
        p.error(f"--source {a.source}: only http:// and https:// URLs, or a directory")
    elif not (Path(a.source) / "state.txt").is_file():
        p.error(f"--source {a.source}: no state.txt (not a replication directory)")
    else:
        source = Path(a.source).resolve()
    if a.store is None and not (a.postgis and a.spool):
        p.error("--store, or --postgis with --spool (a PostGIS store followed alone) is needed")
    if a.store is not None and not (a.store / "geometry").is_dir():
        p.error(f"--store {a.store}: no geometry store (import the extract with toposm-import)")
    if min(a.interval, a.call_timeout, a.max_backoff, a.http_timeout, a.http_deadline) <= 0 or \
            (a.start is not None and a.start < 0):
        p.error("--interval, --call-timeout, --max-backoff, --http-timeout and --http-deadline must be positive, "
                "--start not negative")
    if a.batch < 1:
        p.error("--batch must be at least 1")
    if not 0 <= a.min_zoom <= a.max_zoom <= 22:
        p.error("zooms must satisfy 0 <= --min-zoom <= --max-zoom <= 22")
    if (a.flat_nodes or a.expire_output) and not a.postgis:
        p.error("--flat-nodes and --expire-output go with --postgis")
    store = a.store.resolve() if a.store is not None else None
    name = a.store_name or (store.name if store is not None else "postgis")
    settings = FollowSettings(source=source, store=store, store_name=name,
                          start=a.start, interval=a.interval, once=a.once, min_zoom=a.min_zoom, max_zoom=a.max_zoom,
                          call_timeout=a.call_timeout, batch=a.batch, max_backoff=a.max_backoff,
                          spool=a.spool.resolve() if a.spool else None, http_timeout=a.http_timeout,
                          http_deadline=a.http_deadline,
                          postgis=a.postgis, flat_nodes=a.flat_nodes.resolve() if a.flat_nodes else None,
                          expire_output=a.expire_output.resolve() if a.expire_output else None)
    return settings, service_metrics(NAMESPACE, a.metrics_port, a.metrics_host)


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
    settings, metrics = parse_command(argv)
    follower: list[_Process] = []

    def make(unit: Unit) -> _Process:
        follower.append(_Process(unit, settings, metrics))
        return follower[0]

    serve(APP, make)
    if follower and follower[0].error:
        exit_fatal(f"toposm-replicate: {follower[0].error}")


if __name__ == "__main__":
    main()
