"""structlog set-up: qbroker logs with the unit's app and uuid bound, and each message's ids.

Log lines go to stderr through ``DroppingLogger``: a write that fails (the pipe's reader exited, a log
collector restarting, a full disk) drops that line and counts it (``dropped_log_lines``), and never raises
into the code that logged. Logging sits on every path that acks, replies and stops; a dying log pipe must
not cost a message or a SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import Any, TextIO

import structlog
from structlog.typing import FilteringBoundLogger

_configured = False
_dropped = 0
_write_lock = threading.Lock()
_silenced: set[int] = set()  # descriptors whose reader is gone: pointed at /dev/null, lines counted as dropped


def dropped_log_lines() -> int:
    """Log lines this process could not write (their stream failed) and dropped."""
    return _dropped


def _descriptor(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError):  # an in-memory stream (tests capture output), or a closed one
        return None


def _silence(stream: TextIO) -> None:
    """Point a broken pipe's descriptor at /dev/null: every later write of anyone (stdlib logging, the
    interpreter's flush at exit) then succeeds quietly instead of raising or printing about it. A pipe
    whose reader is gone never comes back, so nothing is lost that could have been written."""
    fd = _descriptor(stream)
    if fd is None:
        return
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        _silenced.add(fd)


class DroppingLogger:
    """A structlog logger that writes each line to a stream and drops (and counts) what it cannot write."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr  # sys.stderr may be replaced later

    def msg(self, message: str) -> None:
        global _dropped
        with _write_lock:
            stream = self.stream
            if _descriptor(stream) in _silenced:
                _dropped += 1
                return
            try:
                stream.write(message + "\n")
                stream.flush()
            except BrokenPipeError:
                _dropped += 1
                _silence(stream)
            except (OSError, ValueError):  # EIO, ENOSPC (may pass later: keep trying), a closed stream
                _dropped += 1

    log = debug = info = warn = warning = error = critical = exception = fatal = failure = err = msg


def _dropping_logger_factory(*_args: Any) -> DroppingLogger:
    return DroppingLogger()


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure structlog once for a qbroker process (console or JSON lines, to stderr)."""
    global _configured
    if _configured:
        return
    _configured = True
    level_name = (level or os.environ.get("QBROKER_LOG_LEVEL", "INFO")).upper()
    use_json = json if json is not None else (
        os.environ.get("QBROKER_LOG_FORMAT", "").lower() == "json"
        or os.environ.get("QBROKER_LOG_JSON", "") not in ("", "0"))
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level_name, logging.INFO)),
        logger_factory=_dropping_logger_factory,
        cache_logger_on_first_use=True,
    )


def get_logger(**bound: Any) -> FilteringBoundLogger:
    # An application that configured structlog keeps its set-up; otherwise structlog's default would
    # print every debug line to stdout, so qbroker applies its own (INFO, stderr, QBROKER_LOG_LEVEL).
    if not structlog.is_configured():
        configure_logging()
    logger: FilteringBoundLogger = structlog.get_logger("qbroker").bind(**bound)
    return logger
