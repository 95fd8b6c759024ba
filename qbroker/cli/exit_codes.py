"""Exit codes of ``qbroker`` and the mapping from core exceptions to them.

0 ok (also ok with a warning), 1 error, 2 fail, 3 timeout or no broker reachable,
64 usage problem (bad option or argument; EX_USAGE from sysexits.h, so that a typo is never mistaken
for a remote ``fail``), 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    FAIL = 2
    UNREACHABLE = 3
    USAGE = 64
    INTERRUPTED = 130


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
