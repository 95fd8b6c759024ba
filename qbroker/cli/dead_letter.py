"""``qbroker-dead-letter``: a process that only collects dead letters, for buses where no unit does.

Every ``Unit`` with ``Config(dead_letters=True)`` collects them too; run this when none does, so a call
to a name nobody serves fails at once with ``no_server`` instead of at its deadline.

It is the library's program, not an application's: it knows no application's names. A deployment whose
programs all listen on an alert name (TopOSM's ``toposm``: "all running programs listen for commands" there)
names it with ``--hear``; what is heard there is logged and counted, never answered (docs/cli.md).
``--metrics-port`` serves the library's metrics of its unit, dead letters included (docs/metrics.md).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from qbroker.config import Config
from qbroker.context import RequestContext
from qbroker.metrics_port import MetricsServer, add_metrics_options, check_metrics_options
from qbroker.runner import serve
from qbroker.unit import Unit

APP = "qbroker.dead_letter"
NAMESPACE = "qbroker_dead_letter"  # its build info: qbroker_dead_letter_build_info


class DeadLetterProcess:
    """The unit's own collector does the work; the process only has to live until it is told to stop, and
    listens to the alert names it was given (``heard``: alerts heard, by the pattern that took them) and
    serves its metrics when given a server."""

    def __init__(self, unit: Unit, hear: Sequence[str] = (), metrics: MetricsServer | None = None) -> None:
        self.unit = unit
        self.hear = list(dict.fromkeys(hear))
        self.heard: Counter[str] = Counter()
        self.metrics = metrics
        if metrics is not None:
            metrics.instrument(unit)
        for pattern in self.hear:
            unit.on_alert(pattern)(self._listener(pattern))

    def _listener(self, pattern: str) -> Callable[[Any, RequestContext], Awaitable[None]]:
        async def heard(body: Any, ctx: RequestContext) -> None:
            # Whatever it says is an application's: noted, not read (nothing here acts on it).
            self.heard[pattern] += 1
            ctx.log.info("alert heard", pattern=pattern)

        return heard

    async def start(self) -> None:
        self.unit.log.info("collecting dead letters", queue=self.unit.config.dead_queue_name, hears=self.hear)
        if self.metrics is not None:
            self.metrics.start()

    async def stop(self) -> None:
        if self.metrics is not None:
            await self.metrics.stop()
        if self.unit.dead_letters is not None:
            self.unit.log.info("dead letters collected", **self.unit.dead_letters.stats())
        if self.heard:
            self.unit.log.info("alerts heard", counts=dict(self.heard))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, read before anything touches the broker (``--help`` and mistakes end here)."""
    p = argparse.ArgumentParser(
        prog="qbroker-dead-letter", description=__doc__.split("\n\n")[0],
        epilog="The broker and exchanges come from the environment: QBROKER_URL, QBROKER_EXCHANGE_PREFIX, "
        "QBROKER_USERNAME, QBROKER_PASSWORD_FILE (see qbroker.config).")
    p.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                   help="on SIGTERM, seconds to finish the dead letters in hand (default QBROKER_DRAIN_TIMEOUT, "
                   "else 10)")
    p.add_argument("--hear", action="append", default=[], metavar="NAME",
                   help="also listen to alerts named NAME (a topic pattern; repeatable), where a deployment's "
                   "running programs all listen, e.g. TopOSM's `toposm`: logged and counted, never answered")
    add_metrics_options(p)
    args = p.parse_args(argv)
    check_metrics_options(p, args)
    if args.drain_timeout is not None and args.drain_timeout < 0:
        p.error("--drain-timeout must not be negative")
    if any(not name or len(name) > 255 for name in args.hear):
        p.error("--hear takes an alert name of 1 to 255 characters")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    def make_service(unit: Unit) -> DeadLetterProcess:
        metrics = MetricsServer(NAMESPACE, args.metrics_port, args.metrics_host) if args.metrics_port is not None \
            else None
        return DeadLetterProcess(unit, args.hear, metrics)

    serve(APP, make_service, config=Config(dead_letters=True), drain_timeout=args.drain_timeout)


if __name__ == "__main__":
    main()
