"""The exit codes of every console script, the library's and the TopOSM stack's (the table: docs/cli.md).

One table, so that a shell script or a systemd unit reads the same number the same way whatever program
exited: 2 is always a remote ``fail`` (never a typo), 3 always "the broker did not let us in" (so a retry
later may work), 64 always a mistake on the command line, in the environment or in the settings file.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # done (a ``warn`` reply included)
    ERROR = 1  # the work failed: an ``error`` reply, failed renders, a failed import, killed by a second signal
    FAIL = 2  # a ``fail`` reply: the request itself was refused (bad input, forbidden, unknown job)
    UNREACHABLE = 3  # no broker reachable, or it refused the account; timed out; stopped before the end
    USAGE = 64  # EX_USAGE (sysexits.h): a bad flag, environment variable or settings file
    INTERRUPTED = 130  # Ctrl-C before the program could stop gracefully
