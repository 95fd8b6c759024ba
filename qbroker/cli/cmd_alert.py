"""``qbroker alert NAME [key=value ...] [--gather]``: publish a broadcast, optionally collect replies."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qbroker.cli.exit_codes import UsageProblem
from qbroker.cli.output import print_json_line, print_result, say, to_json
from qbroker.cli.session import GlobalOptions, run_with_unit, usage_guard
from qbroker.cli.values import build_body

if TYPE_CHECKING:
    from qbroker import Unit

EXAMPLES = """
[bold]Examples[/]

  qbroker alert toposm.render.done tile=15/17600/10750

  qbroker alert expire_toposm --text '14/1/2;14/1/3'       [dim]# text/plain body[/]

  qbroker alert qbroker.ping --gather --timeout 2 --max 5

With --gather each reply is printed as it arrives (one JSON line each when piped, pretty on a
terminal); error replies go to stderr. Exit code 0 once published.
"""


def alert(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Alert name (the routing key on the alert exchange).")],
    words: Annotated[
        list[str] | None,
        typer.Argument(metavar="[KEY=VALUE]...", help="Body parameters.", show_default=False),
    ] = None,
    json_body: Annotated[
        str | None, typer.Option("--json", "-j", help="The whole body as JSON; '-' reads it from stdin.")
    ] = None,
    text: Annotated[
        str | None, typer.Option("--text", help="Send this text as a text/plain body instead of JSON.")
    ] = None,
    gather: Annotated[bool, typer.Option("--gather", "-g", help="Ask for replies and print them.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", "-t", help="With --gather: seconds to wait.")] = 2.0,
    max_replies: Annotated[
        int | None, typer.Option("--max", "-n", min=1, help="With --gather: stop after N replies.")
    ] = None,
    gap: Annotated[
        float | None,
        typer.Option("--gap", help="With --gather: stop after this many seconds of silence after a reply."),
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", "-r", help="Replies as compact JSON lines, strings unquoted.")
    ] = False,
) -> None:
    """Publish an alert (a broadcast); with --gather print each reply as it arrives."""
    options: GlobalOptions = ctx.obj
    holder: dict[str, Any] = {}

    def parse() -> int:
        if text is not None:
            if words or json_body is not None:
                raise UsageProblem("--text is the whole body; drop the key=value pairs and --json")
            if gather:
                raise UsageProblem("--gather sends a JSON body; --text cannot be combined with it")
            holder["body"] = text
        else:
            holder["body"] = build_body(json_body, words or [], allow_command=False)
        return 0

    code = usage_guard(parse)
    if code:
        raise typer.Exit(code)

    async def action(unit: Unit) -> int:
        if not gather:
            if text is not None:
                await unit.alert(name, holder["body"], content_type="text/plain")
            else:
                await unit.alert(name, holder["body"])
            return 0
        count = 0
        async for reply in unit.gather(
            name, holder["body"], timeout=timeout, max_replies=max_replies, gap=gap
        ):
            count += 1
            error = getattr(reply, "error", None)
            if error is not None and getattr(error, "status", "ok") in ("error", "fail"):
                say(
                    f"qbroker: reply {count}: {getattr(error, 'status', 'error')}: {to_json(error)}",
                    style="red",
                )
                continue
            if raw or sys.stdout.isatty():
                print_result(reply.body, raw=raw)
            else:
                print_json_line(reply.body)  # a stream of replies piped: JSON lines
        say(f"qbroker: {count} repl{'y' if count == 1 else 'ies'}", style="dim")
        return 0

    raise typer.Exit(run_with_unit(options, action))
