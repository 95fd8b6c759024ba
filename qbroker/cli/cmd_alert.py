"""``qbroker alert NAME [key=value ...] [--gather]``: publish a broadcast, optionally collect replies."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from qbroker.cli.exit_codes import UsageProblem
from qbroker.cli.output import print_json_line, print_result, say
from qbroker.cli.session import GlobalOptions, run_with_unit, usage_guard
from qbroker.cli.values import build_body

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from qbroker import Reply, Unit

EXAMPLES = """
[bold]Examples[/]

  qbroker alert toposm.render.done tile=15/17600/10750

  qbroker alert expire_toposm --text '14/1/2;14/1/3'       [dim]# text/plain body[/]

  qbroker alert qbroker.ping --gather --timeout 2 --max 5

  qbroker alert orders.health --status error --error-id db_down --part orders --message 'database unavailable'

  qbroker alert orders.health --status ok --error-id db_down --part orders   [dim]# the error state is over[/]

With --gather each reply is printed as it arrives (one JSON line each when piped, pretty on a
terminal); error replies go to stderr. Exit code 0 once published.
"""


def alert(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Alert name (the routing key on the alert exchange).")],
    words: Annotated[
        list[str] | None, typer.Argument(metavar="[KEY=VALUE]...", help="Body parameters.", show_default=False)
    ] = None,
    json_body: Annotated[
        str | None, typer.Option("--json", "-j", help="The whole body as JSON; '-' reads it from stdin.")
    ] = None,
    text: Annotated[
        str | None, typer.Option("--text", help="Send this text as a text/plain body instead of JSON.")
    ] = None,
    gather: Annotated[bool, typer.Option("--gather", "-g", help="Ask for replies and print them.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", "-t", min=0.001, help="With --gather: seconds to wait.")] = 2.0,
    max_replies: Annotated[
        int | None, typer.Option("--max", "-n", min=1, help="With --gather: stop after N replies.")
    ] = None,
    gap: Annotated[
        float | None,
        typer.Option("--gap", help="With --gather: stop after this many seconds of silence after a reply."),
    ] = None,
    raw: Annotated[bool, typer.Option("--raw", "-r", help="Replies as compact JSON lines, strings unquoted.")] = False,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            help="Attach an error element: ok (an error state is over), warn, error or fail; needs --error-id.",
        ),
    ] = None,
    error_id: Annotated[str | None, typer.Option("--error-id", help="The error element's id.")] = None,
    part: Annotated[str, typer.Option("--part", help="The error element's part (subsystem).")] = "",
    message: Annotated[str, typer.Option("--message", help="The error element's message.")] = "",
) -> None:
    """Publish an alert (a broadcast); with --gather print each reply as it arrives."""
    options: GlobalOptions = ctx.obj
    holder: dict[str, Any] = {}

    def parse() -> int:
        if (status is None) != (error_id is None):
            raise UsageProblem("--status and --error-id go together")
        if status is not None and gather:
            raise UsageProblem("--status attaches an error element to a one-way alert; drop --gather")
        if status is not None:
            from pydantic import ValidationError

            from qbroker import ErrorInfo

            try:
                holder["error"] = ErrorInfo(status=status, id=error_id, part=part, message=message)  # type: ignore[arg-type]
            except ValidationError:
                raise UsageProblem("--status is one of ok, warn, error, fail") from None
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
            content_type = "text/plain" if text is not None else "application/json"
            await unit.alert(name, holder["body"], content_type=content_type, error=holder.get("error"))
            return 0
        count = 0
        # max_replies is counted here, not by gather(): the CLI's own reply must not use up --max.
        # gather() is an async generator (typed as an iterator): close it at once when we stop early.
        stream = cast("AsyncGenerator[Reply, None]", unit.gather(name, holder["body"], timeout=timeout, gap=gap))
        async with contextlib.aclosing(stream) as replies:
            async for reply in replies:
                if reply.header.app_id == unit.uuid:
                    continue  # the CLI's own unit answers qbroker.ping too; that is not news
                count += 1
                if reply.error is not None and reply.error.status in ("error", "fail"):
                    info = reply.error
                    say(f"qbroker: reply {count}: {info.status}: {info.id}: {info.message}", style="red")
                elif raw or sys.stdout.isatty():
                    print_result(reply.body, raw=raw)
                else:
                    print_json_line(reply.body)  # a stream of replies piped: JSON lines
                if max_replies is not None and count >= max_replies:
                    break
        say(f"qbroker: {count} repl{'y' if count == 1 else 'ies'}", style="dim")
        return 0

    raise typer.Exit(run_with_unit(options, action))
