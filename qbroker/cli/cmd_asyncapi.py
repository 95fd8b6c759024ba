"""``qbroker asyncapi``: an AsyncAPI 3.0 document of the units on the bus, or of an app's code."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qbroker.cli.app_code import load_app_object
from qbroker.cli.exit_codes import ExitCode, UsageProblem
from qbroker.cli.output import say
from qbroker.cli.session import GlobalOptions, run_with_unit, usage_guard

if TYPE_CHECKING:
    from qbroker import Unit

EXAMPLES = """
[bold]Examples[/]

  qbroker asyncapi > bus.json                      [dim]# the units running now (qbroker.ping)[/]

  qbroker asyncapi myapp.service:make_service -o api.json   [dim]# from code: no broker needed[/]

APP is MODULE:NAME, where NAME is a Unit, or a callable that registers endpoints on the Unit it is given
(what qbroker.serve takes). The module is imported: give only code you trust, as with python -m.
"""


def _unit_of_code(spec: str, app: str | None) -> Unit:
    from qbroker import Unit

    module_name, target = load_app_object(spec)
    if isinstance(target, Unit):
        return target
    if not callable(target):
        raise UsageProblem(f"{spec!r} is neither a Unit nor a callable taking one")
    unit = Unit(app or module_name)
    target(unit)  # registers the endpoints and listeners; nothing connects
    return unit


def asyncapi(
    ctx: typer.Context,
    app_spec: Annotated[
        str | None,
        typer.Argument(metavar="[APP]", help="MODULE:NAME of an app's code; without it, the units on the bus"),
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    title: Annotated[str, typer.Option("--title", help="info.title of the document.")] = "qbroker bus",
    version: Annotated[str, typer.Option("--version", help="info.version of the document.")] = "1.0.0",
    timeout: Annotated[
        float, typer.Option("--timeout", "-t", min=0.001, help="Seconds to wait for ping replies (bus only).")
    ] = 1.5,
) -> None:
    """Write an AsyncAPI 3.0 document: a channel per endpoint and alert, pydantic schemas, AMQP bindings."""
    from qbroker.asyncapi import describe_code, document

    options: GlobalOptions = ctx.obj
    config = options.config()

    def write(units: list[dict[str, Any]]) -> int:
        text = json.dumps(document(units, config=config, title=title, version=version), indent=2, sort_keys=False)
        if output is None:
            sys.stdout.write(text + "\n")
        else:
            output.write_text(text + "\n", encoding="utf-8")
            say(f"wrote {output} ({len(units)} unit{'s' if len(units) != 1 else ''})")
        return int(ExitCode.OK)

    if app_spec is not None:
        spec = app_spec
        raise typer.Exit(usage_guard(lambda: write([describe_code(_unit_of_code(spec, options.app))])))

    async def action(unit: Unit) -> int:
        from qbroker.asyncapi import description_problem

        units = []
        async for reply in unit.gather("qbroker.ping", {}, timeout=timeout):
            if not isinstance(reply.body, dict) or reply.body.get("uuid") == unit.uuid:
                continue
            # Any unit on the bus answers the ping, in its own words: one that cannot be documented is left
            # out and named, and the others are still written.
            problem = description_problem(reply.body)
            if problem is None:
                units.append(reply.body)
            else:
                say(f"left out unit {str(reply.body.get('app'))[:100]}: {problem}", style="yellow")
        return write(units)

    raise typer.Exit(run_with_unit(options, action))
