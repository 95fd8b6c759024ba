"""An application's code named on the command line as ``MODULE:NAME`` (``qbroker serve``, ``qbroker asyncapi``).

The operator names code of their own, as with ``python -m``: the module is imported from the current
directory or the path. Nothing here comes from the wire.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from qbroker.cli.exit_codes import UsageProblem

SPEC_HELP = (
    "MODULE:NAME, where NAME is a Unit, or a callable that takes the Unit and registers endpoints on "
    "it (a service class, or a factory function: what qbroker.serve takes)"
)


def load_app_object(spec: str) -> tuple[str, Any]:
    """(module name, the object ``spec`` names); a missing module or name is a UsageProblem (one line, exit 64).

    An error inside the module (a syntax error, an import of its own that fails) is the code's, not the
    command line's: it is raised as it is, with its traceback."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageProblem(f"{spec!r}: expected MODULE:NAME (e.g. greeter:Greeter)")
    sys.path.insert(0, str(Path.cwd()))  # as python -m does: the app's own modules, from where it runs
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise  # the module exists; something it imports does not
        raise UsageProblem(f"no module named {module_name!r} (from {Path.cwd()} or the Python path)") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageProblem(f"module {module_name!r} has no attribute {attr!r}") from None
    return module_name, target
