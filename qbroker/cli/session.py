"""Global options, the short-lived CLI unit, and turning outcomes into exit codes."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qbroker.cli.exit_codes import ExitCode, UsageProblem, exit_code_for, is_unreachable
from qbroker.cli.output import printable, say

if TYPE_CHECKING:
    from qbroker import Config, Unit

DEFAULT_APP = "qbroker.cli"


@dataclass
class GlobalOptions:
    """What the global options/environment say; None means "let Config read QBROKER_* / defaults"."""

    url: str | None = None
    exchange_prefix: str | None = None
    exchanges: dict[str, str] = field(default_factory=dict)  # kind ("rpc", ...) -> name
    app: str | None = None
    verbose: bool = False

    def config(self, *, client: bool = True) -> Config:
        """``client``: the CLI's own short-lived unit (``qbroker serve`` runs a service: ``client=False``)."""
        from qbroker import Config

        # A CLI unit is a client: it must not join the dead-letter collectors (that would consume from
        # the shared `dead` queue, i.e. take messages away from the bus's real collector).
        overrides: dict[str, Any] = {"dead_letters": False} if client else {}
        if self.url:
            overrides["url"] = self.url
        if self.exchange_prefix is not None:
            overrides["exchange_prefix"] = self.exchange_prefix
        for kind, name in self.exchanges.items():
            overrides[f"{kind}_exchange"] = name
        if self.app:
            overrides["app"] = self.app
        return Config(**overrides)

    def app_name(self, config: Config, default: str = DEFAULT_APP) -> str:
        """--app, else QBROKER_APP (Config.app), else the tool's own name."""
        if self.app:
            return self.app
        # Config.app has a library default ("qbroker.unit"); only an explicit QBROKER_APP counts here.
        return config.app if "app" in config.model_fields_set else default


def configure_logging(verbose: bool) -> None:
    """Library logs go to stderr (stdout carries results) and stay quiet unless asked for.

    Without --verbose (or an explicit QBROKER_LOG_LEVEL) the CLI's own one-line messages say
    everything; the library would otherwise repeat e.g. a warn reply or each unreachable URL.
    """
    import logging
    import os

    from qbroker.log import configure_logging as configure_core_logging

    level = "DEBUG" if verbose else os.environ.get("QBROKER_LOG_LEVEL", "CRITICAL").upper()
    configure_core_logging(level)
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level, logging.CRITICAL))


def describe(exc: BaseException) -> str:
    """One line naming the problem, without a traceback."""
    from qbroker import errors

    if isinstance(exc, UsageProblem):
        return f"usage: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, errors.BrokerUnavailable):
        return exc.message  # says why, in one line: refused login or vhost, DNS, refused connection, TLS
    if is_unreachable(exc):
        return f"no broker reachable: {str(exc) or type(exc).__name__}"
    if isinstance(exc, errors.RequestFailed | errors.RequestError):
        status = "fail" if isinstance(exc, errors.RequestFailed) else "error"
        text = f"{status}: {exc.id}: {exc.message}" if exc.message else f"{status}: {exc.id}"
        detail = getattr(exc, "detail", None)
        return f"{text} ({detail})" if detail else text
    return f"error: {type(exc).__name__}: {exc}"


def remote_traceback(exc: BaseException) -> str | None:
    """The server-side traceback a debug request brings back, when the core exposes it."""
    value = getattr(exc, "trace", None)
    return value if isinstance(value, str) and value else None


def run_with_unit(
    options: GlobalOptions,
    action: Callable[[Unit], Awaitable[int]],
    *,
    show_traceback: bool = False,
    prepare: Callable[[Unit], None] | None = None,
) -> int:
    """Start a short-lived unit, run ``action`` with it, stop it; return the exit code.

    Every failure becomes one line on stderr and the matching exit code; ``show_traceback`` (the
    ``--debug`` flag) adds the local traceback and, when the reply carried one, the remote one.
    ``prepare(unit)`` runs before the unit starts (to add listeners, e.g. progress alerts).
    """
    configure_logging(options.verbose)

    async def main() -> int:
        from qbroker import Unit

        config = options.config()
        unit = Unit(options.app_name(config), config=config)
        if prepare is not None:  # listeners must be registered before start()
            prepare(unit)
        await unit.start()
        try:
            return await action(unit)
        finally:
            await unit.stop()

    from qbroker.runner import run  # here, not at the top: `qbroker --help` must not load the library

    try:
        return run(main())
    except (Exception, KeyboardInterrupt) as exc:
        if show_traceback and not isinstance(exc, UsageProblem | KeyboardInterrupt):
            traceback.print_exc(file=sys.stderr)
            remote = remote_traceback(exc)
            if remote:
                sys.stderr.write("remote traceback:\n" + printable(remote.rstrip(), lines=True) + "\n")
        say(f"qbroker: {describe(exc)}", style="bold red")
        return int(exit_code_for(exc))


def usage_guard(action: Callable[[], int]) -> int:
    """Run a command body that may raise UsageProblem before any connection is made."""
    try:
        return action()
    except UsageProblem as exc:
        say(f"qbroker: usage: {exc}", style="bold red")
        return int(ExitCode.USAGE)
