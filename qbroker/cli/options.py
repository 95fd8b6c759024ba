"""Options both commands share (broker URL, exchange names, verbosity), declared once.

The broker's options say what every program's say (qbroker.settings.ProgramSettings: same help, same
environment variable); ``--app`` names the tool's own unit in both commands, as in every program.
"""

from __future__ import annotations

from typing import Annotated

import typer

from qbroker import __version__
from qbroker.cli.session import GlobalOptions
from qbroker.settings import ProgramSettings


def _shared_help(name: str) -> str:
    field = ProgramSettings.model_fields[name]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    default = extra.get("default_text")
    return f"{field.description} [default: {default}]" if default else str(field.description)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"qbroker {__version__}")
        raise typer.Exit(0)


UrlOption = Annotated[
    str | None,
    typer.Option("--url", envvar="QBROKER_URL", show_envvar=True, show_default=False, help=_shared_help("url")),
]
ExchangePrefixOption = Annotated[
    str | None,
    typer.Option(
        "--exchange-prefix", envvar="QBROKER_EXCHANGE_PREFIX", show_envvar=True, help=_shared_help("exchange_prefix")
    ),
]
AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        "--app-name",
        envvar="QBROKER_APP",
        show_envvar=True,
        help="App name of the tool's own unit [default: the tool's name]",
    ),
]
VersionOption = Annotated[
    bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
]
RpcExchangeOption = Annotated[str | None, typer.Option("--rpc-exchange", help="Name of the rpc exchange.")]
ReplyExchangeOption = Annotated[str | None, typer.Option("--reply-exchange", help="Name of the reply exchange.")]
AlertExchangeOption = Annotated[str | None, typer.Option("--alert-exchange", help="Name of the alert exchange.")]
DeadExchangeOption = Annotated[str | None, typer.Option("--dead-exchange", help="Name of the dead exchange.")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Show the library's logs on stderr.")]


def make_global_options(
    url: str | None,
    exchange_prefix: str | None,
    rpc: str | None,
    reply: str | None,
    alert: str | None,
    dead: str | None,
    app: str | None,
    verbose: bool,
) -> GlobalOptions:
    named = (("rpc", rpc), ("reply", reply), ("alert", alert), ("dead", dead))
    return GlobalOptions(
        url=url,
        exchange_prefix=exchange_prefix,
        exchanges={kind: name for kind, name in named if name},
        app=app,
        verbose=verbose,
    )
