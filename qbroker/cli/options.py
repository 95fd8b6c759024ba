"""Options both commands share (broker URL, exchange names, verbosity), declared once."""

from __future__ import annotations

from typing import Annotated

import typer

from qbroker.cli.session import GlobalOptions

UrlOption = Annotated[
    str | None,
    typer.Option("--url", envvar="QBROKER_URL", show_envvar=True,
                 help="Broker URL, or several comma-separated for failover (tried in order)."),
]
ExchangePrefixOption = Annotated[
    str | None,
    typer.Option("--exchange-prefix", help="Prefix of all exchange names [env: QBROKER_EXCHANGE_PREFIX]"),
]
RpcExchangeOption = Annotated[str | None, typer.Option("--rpc-exchange", help="Name of the rpc exchange.")]
ReplyExchangeOption = Annotated[str | None, typer.Option("--reply-exchange", help="Name of the reply exchange.")]
AlertExchangeOption = Annotated[str | None, typer.Option("--alert-exchange", help="Name of the alert exchange.")]
DeadExchangeOption = Annotated[str | None, typer.Option("--dead-exchange", help="Name of the dead exchange.")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Show the library's logs on stderr.")]


def make_global_options(url: str | None, exchange_prefix: str | None, rpc: str | None, reply: str | None,
                   alert: str | None, dead: str | None, app: str | None, verbose: bool) -> GlobalOptions:
    named = (("rpc", rpc), ("reply", reply), ("alert", alert), ("dead", dead))
    return GlobalOptions(url=url, exchange_prefix=exchange_prefix,
                         exchanges={kind: name for kind, name in named if name}, app=app, verbose=verbose)
