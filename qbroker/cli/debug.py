"""``qbroker-debug``: print the bus's traffic, one line per message, without disturbing it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from qbroker.cli.exit_codes import ExitCode, UsageProblem
from qbroker.cli.main import QBrokerApp
from qbroker.cli.options import (
    AlertExchangeOption,
    AppOption,
    DeadExchangeOption,
    ExchangePrefixOption,
    ReplyExchangeOption,
    RpcExchangeOption,
    UrlOption,
    VerboseOption,
    VersionOption,
    make_global_options,
)
from qbroker.cli.output import say
from qbroker.cli.session import GlobalOptions, configure_logging, describe, exit_code_for

EXAMPLES = """
[bold]Examples[/]

  qbroker-debug                       [dim]# one line per message[/]

  qbroker-debug --name 'toposm.*' --body

  qbroker-debug --kind reply --status error,fail

  qbroker-debug --json | jq 'select(.latency_ms > 100)'

  rabbitmqctl trace_on -p / && qbroker-debug --firehose

Columns: time, kind, name, from app/uuid (-> caller for replies), correlation id, status, size,
latency (replies, since the request was seen).

Exit codes (every console script's, docs/cli.md): 0 done, 3 no broker, 64 usage.
"""

app = QBrokerApp(
    name="qbroker-debug",
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.command(epilog=EXAMPLES)
def snoop(
    names: Annotated[list[str], typer.Option("--name", "-n", help="Only names matching this glob (repeatable).")] = [],  # noqa: B006
    apps: Annotated[
        list[str], typer.Option("--from-app", "-a", help="Only messages from/to apps matching this glob (repeatable).")
    ] = [],  # noqa: B006
    uuids: Annotated[
        list[str], typer.Option("--uuid", "-u", help="Only messages from/to units with this uuid prefix.")
    ] = [],  # noqa: B006
    kinds: Annotated[
        list[str], typer.Option("--kind", "-k", help="alert, request, reply, dead (comma-separated or repeated).")
    ] = [],  # noqa: B006
    statuses: Annotated[
        list[str], typer.Option("--status", "-s", help="Replies with status ok, warn, error, fail.")
    ] = [],  # noqa: B006
    body: Annotated[bool, typer.Option("--body", "-b", help="Show message bodies.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line, for tools.")] = False,
    firehose: Annotated[
        bool,
        typer.Option(
            "--firehose",
            help="Read RabbitMQ's amq.rabbitmq.trace instead of binding queues "
            "(needs `rabbitmqctl trace_on -p VHOST`).",
        ),
    ] = False,
    everything: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Bind '#' on rpc and alert to see requests to unknown names too. Changes routing while "
            "running: unroutable requests reach this debugger instead of dead (no no_server replies).",
        ),
    ] = False,
    show_own: Annotated[bool, typer.Option("--show-own", help="Also show the debugger's own ping traffic.")] = False,
    discover_timeout: Annotated[
        float, typer.Option("--discover-timeout", min=0.0, help="Seconds to collect qbroker.ping replies at start-up.")
    ] = 1.0,
    recheck: Annotated[
        float,
        typer.Option(
            "--recheck",
            min=0.0,
            help="Seconds between roll calls (qbroker.ping); a unit missing two is forgotten and its "
            "endpoint names unbound, so a dead server's names answer no_server again. 0: never.",
        ),
    ] = 10.0,
    count: Annotated[int | None, typer.Option("--count", "-c", min=1, help="Exit after showing N messages.")] = None,
    duration: Annotated[float | None, typer.Option("--duration", min=0.0, help="Exit after S seconds.")] = None,
    url: UrlOption = None,
    exchange_prefix: ExchangePrefixOption = None,
    rpc_exchange: RpcExchangeOption = None,
    reply_exchange: ReplyExchangeOption = None,
    alert_exchange: AlertExchangeOption = None,
    dead_exchange: DeadExchangeOption = None,
    app_name: AppOption = None,
    verbose: VerboseOption = False,
    version: VersionOption = False,
) -> None:
    """Watch a QBroker bus: alerts, requests, replies (paired, with latency) and dead messages."""
    from qbroker.cli.snoop.filters import EventFilter
    from qbroker.cli.snoop.render import Renderer
    from qbroker.cli.snoop.runner import DebugSettings

    if firehose and everything:
        _usage("--firehose sees everything already; --all only applies to bound queues")
    try:
        event_filter = EventFilter.build(names, apps, uuids, kinds, statuses)
    except UsageProblem as exc:
        _usage(str(exc))
    options = make_global_options(
        url, exchange_prefix, rpc_exchange, reply_exchange, alert_exchange, dead_exchange, app_name, verbose
    )
    settings = DebugSettings(
        renderer=Renderer(as_json=as_json, with_body=body),
        event_filter=event_filter,
        firehose=firehose,
        everything=everything,
        show_own=show_own,
        max_events=count,
        duration=duration,
        discover_timeout=discover_timeout,
        recheck_interval=recheck,
    )
    raise typer.Exit(_run(options, settings, verbose))


def _usage(message: str) -> None:
    say(f"qbroker-debug: usage: {message}", style="bold red")
    raise typer.Exit(int(ExitCode.USAGE))


def _run(options: GlobalOptions, settings: Any, verbose: bool) -> int:
    import sys
    import traceback

    from qbroker import Unit, run
    from qbroker.cli.snoop.runner import run_debugger

    configure_logging(verbose)
    config = options.config()
    unit = Unit(options.app_name(config, "qbroker.debug"), config=config)
    try:
        return run(run_debugger(unit, config, settings))
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        return int(ExitCode.INTERRUPTED)
    except Exception as exc:
        if verbose:
            traceback.print_exc(file=sys.stderr)
        say(f"qbroker-debug: {describe(exc)}", style="bold red")
        return int(exit_code_for(exc))


def main() -> None:
    app()
