"""``qbroker-dead-letter``: a process that only collects dead letters, for buses where no unit does.

Every ``Unit`` with ``Config(dead_letters=True)`` collects them too; run this when none does, so a call
to a name nobody serves fails at once with ``no_server`` instead of at its deadline.

It is the library's program, not an application's: it knows no application's names. A deployment whose
programs all listen on an alert name (TopOSM's ``toposm``: "all running programs listen for commands" there)
names it with ``--hear``; what is heard there is logged and counted, never answered (docs/cli.md).
``--metrics-port`` serves the library's metrics of its unit, dead letters included (docs/metrics.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import field_validator

from qbroker.context import RequestContext
from qbroker.metrics_port import MetricsServer
from qbroker.runner import serve
from qbroker.settings import ProgramSettings, option
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


class DeadLetterSettings(ProgramSettings):
    prog = "qbroker-dead-letter"
    description = __doc__.split("\n\n")[0]

    hear: list[str] = option(
        [],
        "also listen to alerts named NAME (a topic pattern; repeatable), where a "
        "deployment's running programs all listen, e.g. TopOSM's `toposm`: logged and counted, "
        "never answered",
        metavar="NAME",
        repeat=True,
    )

    @field_validator("hear")
    @classmethod
    def _alert_names(cls, names: list[str]) -> list[str]:
        if any(not name or len(name) > 255 for name in names):
            raise ValueError("--hear takes an alert name of 1 to 255 characters")
        return names


def parse_args(argv: list[str] | None = None) -> DeadLetterSettings:
    """The command line, read before anything touches the broker (``--help`` and mistakes end here)."""
    return DeadLetterSettings.parse(argv)


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)

    def make_service(unit: Unit) -> DeadLetterProcess:
        metrics = (
            MetricsServer(NAMESPACE, settings.metrics_port, settings.metrics_host)
            if settings.metrics_port is not None
            else None
        )
        return DeadLetterProcess(unit, settings.hear, metrics)

    serve(APP, make_service, config=settings.unit_config(dead_letters=True), settings=settings)


if __name__ == "__main__":
    main()
