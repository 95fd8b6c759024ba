"""``qbroker``: operate a QBroker bus from the shell (call, alert, list), and run a service (serve)."""

from __future__ import annotations

import sys
from typing import Any

import typer

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

try:  # typer >= 0.20 vendors its own copy of click; its exceptions are not click's
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - older typer on real click
    from click.exceptions import ClickException, UsageError  # type: ignore[assignment]

from qbroker.cli import (
    cmd_alert,
    cmd_asyncapi,
    cmd_call,
    cmd_dead,
    cmd_jobs,
    cmd_list,
    cmd_provision,
    cmd_schedule,
    cmd_serve,
)
from qbroker.cli.exit_codes import ExitCode


class QBrokerApp(typer.Typer):
    """Typer app whose usage errors exit 64, not click's 2 (2 means a remote ``fail`` here)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().__call__(*args, **kwargs)
        except UsageError as exc:
            _show_click_error(exc)
            sys.exit(int(ExitCode.USAGE))
        except typer.Abort:
            sys.stderr.write("aborted\n")
            sys.exit(int(ExitCode.INTERRUPTED))
        except ClickException as exc:
            _show_click_error(exc)
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


def _show_click_error(exc: ClickException) -> None:
    try:
        from typer import rich_utils

        rich_utils.rich_format_error(exc)
    except Exception:  # rich formatting is cosmetic; never hide the actual message
        exc.show()


EXAMPLES = """
[bold]Examples[/]

  qbroker call toposm.queuemaster stats

  qbroker call example.echo text=hi times=2

  echo '{"text": "hi"}' | qbroker call example.echo --json -

  qbroker alert expire_toposm --text '14/1/2;14/1/3'

  qbroker alert qbroker.ping --gather --timeout 2

  qbroker list --schemas

  qbroker serve greeter:Greeter --app tutorial.greeter

Exit codes (every console script's, docs/cli.md): 0 ok (or warn), 1 error, 2 fail, 3 timeout or no broker,
64 usage, 130 interrupted.

Environment: QBROKER_URL, QBROKER_EXCHANGE_PREFIX, QBROKER_{RPC,REPLY,ALERT,DEAD}_EXCHANGE,
QBROKER_APP, QBROKER_CALL_TIMEOUT.
"""

app = QBrokerApp(
    name="qbroker",
    help="Operate a QBroker bus on RabbitMQ: call endpoints, publish alerts, list running units, serve your code.",
    epilog=EXAMPLES,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def global_options(
    ctx: typer.Context,
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
    """Global options go before the command: qbroker --url amqp://host/ call NAME ..."""
    ctx.obj = make_global_options(
        url, exchange_prefix, rpc_exchange, reply_exchange, alert_exchange, dead_exchange, app_name, verbose
    )


app.command("call", epilog=cmd_call.EXAMPLES, no_args_is_help=True)(cmd_call.call)
app.command("alert", epilog=cmd_alert.EXAMPLES, no_args_is_help=True)(cmd_alert.alert)
app.command("list", epilog=cmd_list.EXAMPLES)(cmd_list.list_units)
app.add_typer(cmd_jobs.app, name="jobs")
app.add_typer(cmd_dead.app, name="dead")
app.add_typer(cmd_schedule.app, name="schedule")
app.command("asyncapi", epilog=cmd_asyncapi.EXAMPLES)(cmd_asyncapi.asyncapi)
app.command("provision", epilog=cmd_provision.EXAMPLES, no_args_is_help=True)(cmd_provision.provision)
app.command("serve", epilog=cmd_serve.EXAMPLES, no_args_is_help=True)(cmd_serve.serve)
