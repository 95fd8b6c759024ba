"""Console scripts' entry points: ``--version`` answered before anything else is imported, and one line
naming the extra to install (exit 64, usage) instead of a traceback when a script's extra is missing.

The library's own scripts are below; the TopOSM stack's (services/toposm/programs.py) use ``launch`` too.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence

from qbroker import __version__
from qbroker.cli.exit_codes import ExitCode

CLI_EXTRA = ("cli", "qbroker-amqp[cli]", ("typer", "rich"))


def _missing(modules: Sequence[str]) -> bool:
    return any(importlib.util.find_spec(m) is None for m in modules)


def launch(prog: str, version: str, target: str, *, extra: tuple[str, str, Sequence[str]] | None = None) -> None:
    """Run ``target`` (``module:function``) as the console script ``prog``. ``extra``: (its name, the
    requirement that installs it, the top-level modules it brings) when the script needs one."""
    if sys.argv[1:2] == ["--version"]:
        print(f"{prog} {version}")
        sys.exit(int(ExitCode.OK))
    if extra is not None and _missing(extra[2]):
        _needs(prog, extra)
    module, _, function = target.partition(":")
    try:
        main = getattr(importlib.import_module(module), function)
    except ModuleNotFoundError as exc:
        # A dependency of the extra that is imported at start but not in its list: the same one line.
        top = (exc.name or "").split(".")[0]
        if extra is None or top in ("qbroker", "services", ""):
            raise
        _needs(prog, extra)
    sys.exit(main())


def _needs(prog: str, extra: tuple[str, str, Sequence[str]]) -> None:
    name, requirement, _ = extra
    print(f"{prog}: this command needs the {name} extra: pip install '{requirement}'", file=sys.stderr)
    sys.exit(int(ExitCode.USAGE))


def qbroker() -> None:
    launch("qbroker", __version__, "qbroker.cli.main:app", extra=CLI_EXTRA)


def debug() -> None:
    launch("qbroker-debug", __version__, "qbroker.cli.debug:main", extra=CLI_EXTRA)


def dead_letter() -> None:
    launch("qbroker-dead-letter", __version__, "qbroker.cli.dead_letter:main")
