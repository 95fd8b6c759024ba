"""``qbroker dead list|show|replay``: the kept copies of dead messages (the ``dead.kept`` queue).

Listing and showing consume nothing (docs/semantics.md, "Dead letters"). Replaying publishes a message
again where it was first published and drops its kept copy.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

import typer

from qbroker.cli.exit_codes import ExitCode
from qbroker.cli.output import print_json_line, print_result
from qbroker.cli.session import GlobalOptions, run_with_unit

if TYPE_CHECKING:
    from qbroker import Unit
    from qbroker.dead_kept import KeptMessage, KeptReader

    Use = Callable[[KeptReader, list[KeptMessage]], Awaitable[int]]

EXAMPLES = """
[bold]Examples[/]

  qbroker dead list                         [dim]# oldest first: position, id, kind, reason, name[/]

  qbroker dead show 7f3c...                 [dim]# one kept message: headers and body (by id or position)[/]

  qbroker dead replay 7f3c... 9a01...       [dim]# publish again where first published; drop the copies[/]
"""

LimitOption = Annotated[int, typer.Option("--limit", "-n", min=1, max=100_000, help="Read at most this many.")]

app = typer.Typer(
    help="List, show and replay the kept copies of dead messages.",
    no_args_is_help=True,
    epilog=EXAMPLES,
    rich_markup_mode="rich",
)


def _pick(kept: list[KeptMessage], wanted: list[str]) -> tuple[list[KeptMessage], list[str]]:
    """The kept messages named by id or position, and the names that matched none."""
    found, missing = [], []
    for name in wanted:
        match = next((m for m in kept if m.message_id == name or str(m.position) == name), None)
        if match is None:
            missing.append(name)
        elif match not in found:
            found.append(match)
    return found, missing


def _with_reader(ctx: typer.Context, limit: int, use: Use) -> None:
    options: GlobalOptions = ctx.obj

    async def action(unit: Unit) -> int:
        from qbroker.dead_kept import KeptReader

        connection = unit.bus.connection
        if connection is None:
            from qbroker import ConnectionLost

            raise ConnectionLost("not connected to a broker")
        reader = KeptReader(connection, unit.config)
        try:
            kept = await reader.read(limit)
            return await use(reader, kept)
        finally:
            await reader.close()

    raise typer.Exit(run_with_unit(options, action))


@app.command("list")
def list_kept(ctx: typer.Context, limit: LimitOption = 1000) -> None:
    """The kept dead messages, oldest first, as JSON lines (nothing is consumed)."""

    async def use(reader: KeptReader, kept: list[KeptMessage]) -> int:
        for message in kept:
            print_json_line(message.summary())
        if not kept:
            sys.stderr.write("no kept dead messages\n")
        return 0

    _with_reader(ctx, limit, use)


@app.command("show")
def show(
    ctx: typer.Context,
    which: Annotated[str, typer.Argument(help="Message id or position.")],
    limit: LimitOption = 100_000,
) -> None:
    """One kept message in full: where it was published, why it died, headers and body."""

    async def use(reader: KeptReader, kept: list[KeptMessage]) -> int:
        found, missing = _pick(kept, [which])
        if missing:
            sys.stderr.write(f"qbroker: no kept dead message {which}\n")
            return int(ExitCode.FAIL)
        print_result(found[0].describe())
        return 0

    _with_reader(ctx, limit, use)


@app.command("replay")
def replay(
    ctx: typer.Context,
    which: Annotated[list[str], typer.Argument(help="Message ids or positions.")],
    limit: LimitOption = 100_000,
) -> None:
    """Publish kept messages again where they were first published; their kept copies are dropped."""

    async def use(reader: KeptReader, kept: list[KeptMessage]) -> int:
        found, missing = _pick(kept, which)
        for message in found:
            await reader.replay(message)
            print_json_line({"replayed": message.message_id, "exchange": message.exchange, "name": message.routing_key})
        for name in missing:
            sys.stderr.write(f"qbroker: no kept dead message {name}\n")
        return 2 if missing else 0

    _with_reader(ctx, limit, use)
