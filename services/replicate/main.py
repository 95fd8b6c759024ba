"""``toposm-replicate --source DIR --store DIR``: follow OSM replication diffs into a store (QBROKER_URL).

The Spark bridge must run with ``--store DIR`` for the same store (it applies the diffs and publishes the
expirations) and with the replication directory under one of its ``--input-root`` directories.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from qbroker import Unit
from qbroker.runner import serve
from services.replicate.follower import Follower, FollowSettings

APP = "toposm.replicate"


def parse_args(argv: list[str] | None = None) -> FollowSettings:
    p = argparse.ArgumentParser(prog="toposm-replicate", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, required=True,
                   help="replication directory (state.txt, 000/000/001.osc.gz, 000/000/001.state.txt)")
    p.add_argument("--store", type=Path, required=True, help="the store (toposm-import --store) to keep current")
    p.add_argument("--store-name", help="the store's name on the bridge (default: the directory's name)")
    p.add_argument("--start", type=int, help="first sequence to apply when the store has none yet")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between looks at state.txt")
    p.add_argument("--once", action="store_true", help="apply what is published, then exit")
    p.add_argument("--min-zoom", type=int, default=10)
    p.add_argument("--max-zoom", type=int, default=18)
    p.add_argument("--call-timeout", type=float, default=3600.0, help="seconds to wait for one diff's job")
    a = p.parse_args(argv)
    if not (a.source / "state.txt").is_file():
        p.error(f"--source {a.source}: no state.txt (not a replication directory)")
    if not (a.store / "geometry").is_dir():
        p.error(f"--store {a.store}: no geometry store (import the extract with toposm-import)")
    if a.interval <= 0 or a.call_timeout <= 0 or (a.start is not None and a.start < 0):
        p.error("--interval and --call-timeout must be positive, --start not negative")
    if not 0 <= a.min_zoom <= a.max_zoom <= 22:
        p.error("zooms must satisfy 0 <= --min-zoom <= --max-zoom <= 22")
    return FollowSettings(source=a.source.resolve(), store=a.store.resolve(),
                          store_name=a.store_name or a.store.resolve().name, start=a.start, interval=a.interval,
                          once=a.once, min_zoom=a.min_zoom, max_zoom=a.max_zoom, call_timeout=a.call_timeout)


class _Process(Follower):
    """Ends the process when the follower ends (``--once``, or an error): the runner's own graceful stop."""

    async def start(self) -> None:
        await super().start()
        assert self._task is not None
        # serve() stops on the first SIGTERM; raising it is how a service ends its own process through it.
        self._task.add_done_callback(self._finished)

    def _finished(self, _task: object) -> None:
        if not self._stopping.is_set():  # not already stopping: a second signal would kill the process
            signal.raise_signal(signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    follower: list[_Process] = []

    def make(unit: Unit) -> _Process:
        follower.append(_Process(unit, settings))
        return follower[0]

    serve(APP, make)
    if follower and follower[0].error:
        raise SystemExit(f"toposm-replicate: {follower[0].error}")


if __name__ == "__main__":
    main()
