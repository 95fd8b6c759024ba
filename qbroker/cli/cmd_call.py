"""``qbroker call NAME [COMMAND] [key=value ...]``: one RPC request, print the reply."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from qbroker.cli.output import print_result, say
from qbroker.cli.progress import ProgressView
from qbroker.cli.session import GlobalOptions, run_with_unit, usage_guard
from qbroker.cli.values import build_body

if TYPE_CHECKING:
    from qbroker import Unit

EXAMPLES = """
[bold]Examples[/]

  qbroker call toposm.queuemaster stats            [dim]# body {"command": "stats"}[/]

  qbroker call toposm.queuemaster render tile=15/17600/10750 zoom=15

  qbroker call example.echo --json '{"text": "hi"}'

  jq -n '{text: "hi"}' | qbroker call example.echo --json - --raw

  qbroker call spark.expire paths='["changes.osc.gz"]' wait=true   [dim]# progress bar while it runs[/]

Values parse as JSON when they can (zoom=15, tiles='["1/0/0"]', ok=true), else as strings.
Exit codes: 0 ok (a warning goes to stderr), 1 error, 2 fail, 3 timeout or no broker, 64 usage.
"""


def call(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Endpoint name (the routing key on the rpc exchange).")],
    words: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[COMMAND] [KEY=VALUE]...",
            help="Optional command (sent as body['command']) then key=value parameters.",
            show_default=False,
        ),
    ] = None,
    json_body: Annotated[
        str | None, typer.Option("--json", "-j", help="The whole body as JSON; '-' reads it from stdin.")
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", "-t", min=0.001, help="Seconds to wait for the reply (default: QBROKER_CALL_TIMEOUT, else 10)."
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="Set the request's debug header; show tracebacks (local and remote).")
    ] = False,
    raw: Annotated[
        bool, typer.Option("--raw", "-r", help="Body only for pipes: strings unquoted, else one JSON line.")
    ] = False,
    progress: Annotated[
        bool,
        typer.Option(
            "--progress/--no-progress",
            help="Show <service>.progress.* alerts while waiting (a bar on a terminal, else lines).",
        ),
    ] = True,
    notify: Annotated[
        bool, typer.Option("--notify", help="Say on stderr when a server picks the request up (RQ DELIVERED).")
    ] = False,
    guarantee: Annotated[
        bool, typer.Option("--guarantee", help="A persistent request that survives a broker restart.")
    ] = False,
) -> None:
    """Send an RPC request and print the reply body."""
    options: GlobalOptions = ctx.obj
    holder: dict[str, Any] = {}

    def parse() -> int:
        holder["body"] = build_body(json_body, words or [], allow_command=True)
        return 0

    code = usage_guard(parse)
    if code:
        raise typer.Exit(code)

    view = ProgressView() if progress else None

    async def action(unit: Unit) -> int:
        kwargs: dict[str, Any] = {"debug": debug, "guarantee": guarantee}
        if timeout is not None:
            kwargs["timeout"] = timeout
        if notify:
            kwargs["on_delivered"] = lambda notice: say(
                f"qbroker: delivered to {notice.header.app or '?'} {notice.header.app_id or ''}", style="dim"
            )
        reply = await unit.call_reply(name, holder["body"], **kwargs)
        if view is not None:
            view.close()  # the bar ends before the result is printed
        print_result(reply.body, raw=raw)
        warning = getattr(reply, "warning", None)
        if warning is not None:
            say(f"qbroker: warning: {describe_warning(warning)}", style="yellow")
        cleared = getattr(reply, "cleared", None)
        if cleared is not None:  # status ok with an id: an error state reported earlier is over
            say(f"qbroker: ok: clears {describe_warning(cleared)}", style="green")
        return 0

    try:
        code = run_with_unit(
            options, action, show_traceback=debug, prepare=(lambda unit: view.attach(unit, name)) if view else None
        )
    finally:
        if view is not None:
            view.close()
    raise typer.Exit(code)


def describe_warning(warning: Any) -> str:
    """The warning as 'id: message' whatever shape the core hands back (object, dict or text)."""
    if isinstance(warning, dict):
        error_id, message = warning.get("id"), warning.get("message")
    else:
        error_id = getattr(warning, "error_id", None) or getattr(warning, "id", None)
        message = getattr(warning, "message", None)
    if error_id or message:
        return f"{error_id}: {message}" if error_id and message else str(error_id or message)
    return str(warning)
