"""``bin/demo``'s command line, in the standard library only: ``bin/demo`` runs this module with the system's
Python before any set-up (no venv, no broker, nothing installed yet), so ``--help``, ``--version`` and a
mistyped option are answered at once; ``python -m demo`` parses its arguments with the same parser.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PROG = "bin/demo"
ROOT = Path(__file__).resolve().parents[1]

DESCRIPTION = """\
The main job: import the real Helsinki extract, start the TopOSM queuemaster, Mapnik renderers
and the Spark bridge on the local broker, request map tiles, publish a real-looking OSM edit as a
replication diff and let toposm-replicate apply it (Spark expires the tiles it touches, the
renderers redraw them: before/after pictures), and compute render stats with Spark.
Map data © OpenStreetMap contributors (ODbL).

The live status page and the slippy map (toposm-web) run beside the services from the start;
their URLs are printed first. The first run sets up what is missing (.venv, RabbitMQ, Java, the
OSM extract).

The demo's exchanges and queues go under the prefix demo. (QBROKER_EXCHANGE_PREFIX) on the broker
QBROKER_URL names; they are removed when it ends, with its broker accounts. The services log at
QBROKER_LOG_LEVEL (INFO) to WORKDIR/service-*.log and WORKDIR/spark-bridge.log; the console shows
only what the demo prints."""

EPILOG = """\
examples:
  bin/demo                      run it once, end to end (about a minute once set up)
  bin/demo --keep-running       ... and leave the services, the status page and the map up until Ctrl-C
  bin/demo --clean              remove what a killed run left: its processes, accounts, exchanges and queues
"""


def version() -> str:
    """The library's version, read from qbroker/__init__.py's ``__version__`` line (nothing installed yet, so
    nothing imported: the package needs Python 3.11, this runs on the system's)."""
    try:
        text = (ROOT / "qbroker" / "__init__.py").read_text()
    except OSError:
        return "unknown"
    found = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    return found.group(1) if found else "unknown"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"{PROG} (qbroker {version()})")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path("var/demo"),
        help="where the data, tiles, logs and pictures go (default: %(default)s)",
    )
    parser.add_argument("--renderers", type=int, default=2, help="renderer processes (default: %(default)s)")
    parser.add_argument(
        "--web-port", type=int, default=8080, help="toposm-web's port (default: %(default)s; another if taken)"
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the services up until Ctrl-C (or SIGTERM, SIGHUP); a service that ends "
        "meanwhile is reported at once",
    )
    parser.add_argument(
        "--accounts",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one broker account per program, made with `qbroker provision` (needs rabbitmqctl "
        "on this host) and deleted afterwards; see docs/security.md. Default: on when the "
        "broker is local and rabbitmqctl can be run here",
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="only remove what earlier runs in WORKDIR left (processes, broker accounts) and the "
        "demo's exchanges and queues on the broker, then exit",
    )
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


GO_ON = 10  # bin/demo's signal that nothing was answered here: set up and run the demo


if __name__ == "__main__":  # bin/demo, before any set-up: --help, --version or a usage error end here (0, 0, 2)
    if sys.version_info >= (3, 9):  # noqa: UP036 - the system's Python, before bin/bootstrap says what is needed
        parse()
    sys.exit(GO_ON)
