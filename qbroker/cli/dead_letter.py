"""``qbroker-dead-letter``: a process that only collects dead letters, for buses where no unit does.

Every ``Unit`` with ``Config(dead_letters=True)`` collects them too; run this when none does, so a call
to a name nobody serves fails at once with ``no_server`` instead of at its deadline.
"""

from __future__ import annotations

import argparse

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, read before anything touches the broker (``--help`` and mistakes end here)."""
    p = argparse.ArgumentParser(
        prog="qbroker-dead-letter", description=__doc__,
        epilog="The broker and exchanges come from the environment: QBROKER_URL, QBROKER_EXCHANGE_PREFIX, "
        "QBROKER_USERNAME, QBROKER_PASSWORD_FILE (see qbroker.config).")
    p.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                   help="on SIGTERM, seconds to finish the dead letters in hand (default QBROKER_DRAIN_TIMEOUT, "
                   "else 10)")
    args = p.parse_args(argv)
    if args.drain_timeout is not None and args.drain_timeout < 0:
        p.error("--drain-timeout must not be negative")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    serve(APP, DeadLetterProcess, config=Config(dead_letters=True), drain_timeout=args.drain_timeout)


if __name__ == "__main__":
    main()
