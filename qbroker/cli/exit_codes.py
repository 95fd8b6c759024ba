"""Mapping the core's exceptions to the exit codes of every console script (qbroker.exit_codes)."""

from __future__ import annotations

from qbroker.exit_codes import ExitCode

__all__ = ["ExitCode", "UsageProblem", "exit_code_for", "is_unreachable"]


class UsageProblem(Exception):
    """The command line itself is wrong; reported as one line and exit code 64."""


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code for an exception raised by the core API (imports the core lazily)."""
    from qbroker import errors

    if isinstance(exc, UsageProblem):
        return ExitCode.USAGE
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    # Timeouts and a missing/lost broker first: CallTimeout and ConnectionLost are also RequestErrors.
    if isinstance(exc, errors.CallTimeout | errors.TimedOutInQueue | errors.ConnectionLost):
        return ExitCode.UNREACHABLE
    if is_unreachable(exc):
        return ExitCode.UNREACHABLE
    if isinstance(exc, errors.RequestFailed):
        return ExitCode.FAIL
    if isinstance(exc, errors.RequestError):
        return ExitCode.ERROR
    return ExitCode.ERROR


def is_unreachable(exc: BaseException) -> bool:
    """True when ``exc`` means no broker answered (connection refused, DNS, auth, ...)."""
    from qbroker import errors

    return isinstance(exc, errors.BrokerUnavailable | ConnectionError | OSError | TimeoutError)
