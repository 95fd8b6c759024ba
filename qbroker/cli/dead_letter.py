"""``qbroker-dead-letter``: a process that only collects dead letters, for buses where no unit does.

Every ``Unit`` with ``Config(dead_letters=True)`` collects them too; run this when none does, so a call
to a name nobody serves fails at once with ``no_server`` instead of at its deadline.
"""

from __future__ import annotations

from qbroker.config import Config
from qbroker.runner import serve
from qbroker.unit import Unit

APP = "qbroker.dead_letter"


class DeadLetterProcess:
    """The unit's own collector does the work; the process only has to live until it is told to stop."""

    def __init__(self, unit: Unit) -> None:
        self.unit = unit

    async def start(self) -> None:
        self.unit.log.info("collecting dead letters", queue=self.unit.config.dead_queue_name)

    async def stop(self) -> None:
        if self.unit.dead_letters is not None:
            self.unit.log.info("dead letters collected", **self.unit.dead_letters.stats())


def main() -> None:
    serve(APP, DeadLetterProcess, config=Config(dead_letters=True))


if __name__ == "__main__":
    main()
