"""``qbroker serve MODULE:NAME``: run a library user's service with the runner's signals, drain and logging.

What ``if __name__ == "__main__": qbroker.serve(app, Service)`` does in a script, from the command line, so
a service module holds only its service (as ``faststream run app:app`` or ``uvicorn app:app``).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qbroker.cli.app_code import SPEC_HELP, load_app_object
from qbroker.cli.exit_codes import UsageProblem
from qbroker.cli.session import GlobalOptions, usage_guard

if TYPE_CHECKING:
    from qbroker import Unit

EXAMPLES = """
[bold]Examples[/]

  qbroker serve greeter:Greeter --app tutorial.greeter

  qbroker --url amqp://mq/prod serve myapp.service:make_service --drain-timeout 30

  qbroker serve myapp.bus:unit            [dim]# a Unit the module builds (its own Config)[/]

The first SIGTERM/SIGINT stops the service, then drains the running handlers (up to the drain timeout) and
exits 0; a second one kills at once (exit 1). Exit 3 when no broker is reachable, 64 for a module or name
that does not exist. The module is imported from the current directory or the Python path: give only code
you trust, as with python -m.
"""


class _StartStop:
    """What the service object offers of ``start()``/``stop()`` (either may be missing, or not async): a
    class that only registers endpoints needs neither."""

    def __init__(self, service: object) -> None:
        self.service = service

    async def _call(self, name: str) -> None:
        method = getattr(self.service, name, None)
        if callable(method):
            result = method()
            if inspect.isawaitable(result):
                await result

    async def start(self) -> None:
        await self._call("start")

    async def stop(self) -> None:
        await self._call("stop")


def serve(
    ctx: typer.Context,
    app_spec: Annotated[str, typer.Argument(metavar="MODULE:NAME", help=SPEC_HELP + ".")],
    app: Annotated[
        str | None,
        typer.Option(
            "--app", help="App name of the service's unit (default: the global --app, else QBROKER_APP, else MODULE)."
        ),
    ] = None,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            "--drain-timeout",
            min=0,
            metavar="SECONDS",
            help="On SIGTERM, seconds to let running handlers finish (default QBROKER_DRAIN_TIMEOUT, else 10).",
        ),
    ] = None,
) -> None:
    """Run a service from your code until SIGTERM/SIGINT: qbroker serve greeter:Greeter."""
    options: GlobalOptions = ctx.obj
    given = _given_on_command_line(ctx) + (["--app"] if app else [])
    raise typer.Exit(usage_guard(lambda: _serve(options, app_spec, app, drain_timeout, given)))


def _given_on_command_line(ctx: typer.Context) -> list[str]:
    """The global options typed on the command line (QBROKER_URL from the environment is what a Unit the
    module built reads itself; a typed --url would be silently ignored by it)."""
    parent = ctx.parent
    if parent is None:
        return []
    return [
        flag
        for name, flag in GLOBAL_UNIT_OPTIONS.items()
        if (source := parent.get_parameter_source(name)) is not None and source.name == "COMMANDLINE"
    ]


# The global options (qbroker.cli.main) that configure a unit, by parameter name.
GLOBAL_UNIT_OPTIONS = {
    "url": "--url",
    "exchange_prefix": "--exchange-prefix",
    "rpc_exchange": "--rpc-exchange",
    "reply_exchange": "--reply-exchange",
    "alert_exchange": "--alert-exchange",
    "dead_exchange": "--dead-exchange",
    "app_name": "--app",
}


def _serve(options: GlobalOptions, spec: str, app: str | None, drain_timeout: float | None, given: list[str]) -> int:
    from qbroker import Unit
    from qbroker.runner import serve as serve_service
    from qbroker.runner import serve_unit

    module_name, target = load_app_object(spec)
    if isinstance(target, Unit):
        if given:
            raise UsageProblem(
                f"{spec} is a Unit with its own Config: {', '.join(given)} cannot change it "
                "(set QBROKER_* in its environment instead)"
            )
        serve_unit(target, _StartStop(None), drain_timeout=drain_timeout)
        return 0
    if not callable(target):
        raise UsageProblem(
            f"{spec} is a {type(target).__name__}: expected a Unit, or a callable taking one "
            "(a service class or a factory function)"
        )
    config = options.config(client=False)
    name = app or options.app_name(config, module_name)

    def make_service(unit: Unit) -> Any:
        return _StartStop(target(unit))

    serve_service(name, make_service, config=config, drain_timeout=drain_timeout)
    return 0
