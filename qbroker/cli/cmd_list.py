"""``qbroker list``: who is on the bus, from the ``qbroker.ping`` replies."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qbroker.cli.output import json_renderable, print_result, printable
from qbroker.cli.session import GlobalOptions, run_with_unit

if TYPE_CHECKING:
    from qbroker import Unit

EXAMPLES = """
[bold]Examples[/]

  qbroker list

  qbroker list --schemas                 [dim]# each endpoint's parameter schema[/]

  qbroker list --json | jq '.[].app'
"""


def list_units(
    ctx: typer.Context,
    schemas: Annotated[bool, typer.Option("--schemas", "-s", help="Show each endpoint's parameter schema.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the ping replies as a JSON array.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", "-t", min=0.001, help="Seconds to wait for replies.")] = 1.5,
    gap: Annotated[
        float | None,
        typer.Option("--gap", help="Stop after this many seconds without a new reply (default: wait --timeout)."),
    ] = None,
) -> None:
    """Send qbroker.ping and print a table of the running units: app, uuid, host, endpoints."""
    options: GlobalOptions = ctx.obj

    async def action(unit: Unit) -> int:
        from qbroker.discovery import complete_original, unit_summary

        units: list[dict[str, Any]] = []
        async for reply in unit.gather("qbroker.ping", {}, timeout=timeout, gap=gap):
            summary = unit_summary(reply.body, reply.header.content_type)
            # The CLI's own unit answers the ping too; it is not what the user asked about.
            if summary is not None and summary.get("uuid") != unit.uuid:
                units.append(summary)
        # The original QBroker's units say their endpoints only when asked one by one (docs/interop.md).
        await complete_original(unit.bus, units, timeout)
        units.sort(key=lambda u: (str(u.get("app")), str(u.get("uuid"))))
        if as_json:
            print_result(units)
        else:
            render_units(units, schemas=schemas)
        return 0

    raise typer.Exit(run_with_unit(options, action))


def endpoint_label(name: str, info: Any) -> str:
    commands = info.get("commands") if isinstance(info, dict) else None
    return f"{name} [{', '.join(sorted(commands))}]" if commands else name


def _cell(value: Any) -> str:
    """A table cell from a ping reply (the wire): control characters escaped, then rich markup."""
    from rich.markup import escape

    return escape(printable(str(value)))


def render_units(units: list[dict[str, Any]], *, schemas: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    from qbroker.discovery import ORIGINAL

    # Piped: wide enough that a uuid is never folded (people grep for it).
    console = Console() if sys.stdout.isatty() else Console(width=200)
    table = Table(title=f"{len(units)} unit{'s' if len(units) != 1 else ''} on the bus", title_justify="left")
    for column in ("app", "uuid", "host", "pid", "uptime", "endpoints"):
        table.add_column(column, overflow="fold", no_wrap=column == "uuid")
    for info in units:
        endpoints = info.get("endpoints") or {}
        names = endpoints if isinstance(endpoints, dict) else {name: {} for name in endpoints}
        uptime = info.get("uptime")
        table.add_row(
            _cell(info.get("app", "?")) + (" [dim](original)[/]" if info.get("dialect") == ORIGINAL else ""),
            _cell(info.get("uuid", "?")),
            _cell(info.get("host", "?")),
            _cell(info.get("pid", "")),
            f"{uptime:.0f}s" if isinstance(uptime, int | float) else "",
            "\n".join(_cell(endpoint_label(str(name), names[name])) for name in sorted(names)) or "-",
        )
    console.print(table)
    if schemas:
        render_schemas(console, units)


def render_schemas(console: Any, units: list[dict[str, Any]]) -> None:
    from rich.tree import Tree

    for info in units:
        endpoints = info.get("endpoints") or {}
        if not isinstance(endpoints, dict) or not endpoints:
            continue
        tree = Tree(f"[bold]{_cell(info.get('app'))}[/] {_cell(info.get('uuid'))}")
        for name in sorted(endpoints):
            entry = endpoints[name] if isinstance(endpoints[name], dict) else {}
            branch = tree.add(f"[cyan]{_cell(name)}[/]")
            commands = entry.get("commands")
            if commands:
                for command in sorted(commands):
                    branch.add(f"[green]{_cell(command)}[/]").add(json_renderable(commands[command]))
            elif entry.get("schema") is not None:
                branch.add(json_renderable(entry["schema"]))
        console.print(tree)
