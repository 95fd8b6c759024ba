"""structlog set-up: qbroker logs with the unit's app and uuid bound, and each message's ids.

A program's log is one pipeline (docs/logging.md): ``configure_logging`` renders structlog's lines and the
standard library's (aio-pika, aiormq, aiohttp, warnings, uncaught exceptions) with the same processors, as
console text or one JSON object a line; the library alone configures nothing (``LibraryLogger``).

Lines are written by ``qbroker.log_output.DroppingLogger``: never blocking, never raising. Console lines
show control characters escaped: values from the bus reach an operator's terminal as text, never as
terminal commands.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, NoReturn, cast

import structlog
from structlog.typing import EventDict, FilteringBoundLogger

from qbroker.log_output import DroppingLogger, dropped_log_lines
from qbroker.printable import printable

__all__ = [
    "DroppingLogger",
    "LibraryLogger",
    "bind_process",
    "configure_logging",
    "dropped_log_lines",
    "exit_fatal",
    "get_logger",
    "json_lines",
    "operator_line",
    "process_fields",
]

_configured = False


def _escape_controls(_logger: Any, _method: str, event: EventDict) -> EventDict:
    """Console lines: text values with their control characters escaped (a traceback keeps its lines).
    Other values are shown by their repr, which escapes them already; JSON lines escape everything."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = printable(value, lines=key == "exception")
    return event


def _dropping_logger_factory(*_args: Any) -> DroppingLogger:
    return DroppingLogger()


class _StderrHandler(logging.Handler):
    """The stdlib's lines (aio-pika, aiormq, aiohttp, asyncio, py4j, warnings) to stderr by the same writer as
    structlog's own: formatted by the same processors, never blocking, never raising."""

    def __init__(self) -> None:
        super().__init__()
        self.out = DroppingLogger()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a library's bad format arguments: the stdlib's own report, not a crash
            self.handleError(record)
            return
        self.out.msg(line)


_process_fields: dict[str, Any] = {}
_json_lines = False
_rendering_chain: list[Any] = []  # what configure_logging renders lines with (for ``operator_line``)


def bind_process(**values: Any) -> None:
    """Fields on every line the process logs from now on, whichever thread, task or library logged it: the
    runner binds the served unit's ``app`` and ``uuid`` once it exists (a line's own values win)."""
    _process_fields.update(values)


def process_fields() -> dict[str, Any]:
    """What ``bind_process`` bound (a copy): for a program's other log writers (the Spark bridge's JVM)."""
    return dict(_process_fields)


def _add_process_fields(_logger: Any, _method: str, event: EventDict) -> EventDict:
    for key, value in _process_fields.items():
        event.setdefault(key, value)
    return event


def json_lines() -> bool:
    """True when ``configure_logging`` chose JSON lines (a program's other log writers follow it: the Spark
    bridge's JVM)."""
    return _json_lines


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure logging once for a qbroker *program*: console or JSON lines, to stderr (docs/logging.md).

    structlog's lines and the standard library's (``logging``: aio-pika, aiormq, aiohttp, asyncio, warnings)
    go through the same processors, so in JSON mode every line is one JSON object with the same fields.
    Uncaught exceptions are logged lines too. The first call in a process decides; later calls (``serve``
    calls it again for a program that configured its logging from its own settings) change nothing. The
    runner and the console scripts call it; the library itself never does (``LibraryLogger``).
    """
    global _configured, _json_lines
    if _configured:
        return
    _configured = True
    level_name = (level or os.environ.get("QBROKER_LOG_LEVEL", "INFO")).upper()
    level_number = getattr(logging, level_name, logging.INFO)
    use_json = (
        json
        if json is not None
        else (
            os.environ.get("QBROKER_LOG_FORMAT", "").lower() == "json"
            or os.environ.get("QBROKER_LOG_JSON", "") not in ("", "0")
        )
    )
    _json_lines = use_json
    renderer: Any = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _add_process_fields,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    rendering: list[Any] = [structlog.processors.format_exc_info, *(() if use_json else (_escape_controls,)), renderer]
    _rendering_chain[:] = [*shared, *rendering]
    structlog.configure(
        processors=_rendering_chain,
        wrapper_class=structlog.make_filtering_bound_logger(level_number),
        logger_factory=_dropping_logger_factory,
        cache_logger_on_first_use=True,
    )
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *rendering],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    # Other libraries' INFO is their chatter (py4j notes every connection it closes): their warnings and
    # errors always show, the rest at DEBUG.
    root.setLevel(level_number if level_number <= logging.DEBUG else max(level_number, logging.WARNING))
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], error: BaseException, trace: Any) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, trace)
        return
    structlog.get_logger(LIBRARY_LOGGER).critical("uncaught exception", exc_info=(kind, error, trace))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or isinstance(args.exc_value, SystemExit):
        return
    structlog.get_logger(LIBRARY_LOGGER).critical(
        "uncaught exception in a thread",
        thread=args.thread.name if args.thread else None,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def operator_line(message: str, level: str = "error", **fields: Any) -> bool:
    """Write a program's own message for its operator (a console script's one-line result or error) as a log
    line of the configured format, whatever the level filter; False (nothing written) before
    ``configure_logging``, where the caller prints it its own way."""
    if not _rendering_chain:
        return False
    writer = structlog.wrap_logger(
        DroppingLogger(),
        processors=_rendering_chain,
        wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),
    )
    getattr(writer, level)(message, **fields)
    return True


def exit_fatal(message: str, code: int = 1, **fields: Any) -> NoReturn:
    """End the program with ``message``: in JSON mode one ``critical`` JSON line (with ``fields``), not a
    bare ``SystemExit`` text; on the console the one plain line an operator and scripts read."""
    if not (_json_lines and operator_line(message, "critical", **fields)):
        DroppingLogger().msg(printable(message))
    raise SystemExit(code)


class LibraryLogger:
    """The library's logger: the host program's logging decides where its lines go.

    Importing or using qbroker configures nothing global. A program that configured structlog (qbroker's
    own runner and console scripts do, with ``configure_logging``) gets qbroker's lines through that set-up;
    otherwise they go to the standard library's ``logging.getLogger("qbroker")``, so an application that
    set up ``logging`` sees them there, and one that did nothing sees only warnings and errors (Python's
    last-resort handler), never unasked INFO lines. The choice is made when a line is logged, not when the
    unit is built: a unit made before the program configured its logging follows it all the same.
    """

    __slots__ = ("_bound", "_target", "_structlog")

    def __init__(self, bound: dict[str, Any]) -> None:
        self._bound = bound
        self._target: Any = None
        self._structlog = False

    def _resolve(self) -> Any:
        configured = structlog.is_configured()
        if self._target is None or configured != self._structlog:
            self._structlog = configured
            self._target = (structlog.get_logger(LIBRARY_LOGGER) if configured else _stdlib_logger()).bind(
                **self._bound
            )
        return self._target

    def bind(self, **values: Any) -> LibraryLogger:
        return LibraryLogger({**self._bound, **values})

    def debug(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._resolve().debug(event, *args, **kw)

    def info(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._resolve().info(event, *args, **kw)

    def warning(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._resolve().warning(event, *args, **kw)

    def error(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._resolve().error(event, *args, **kw)

    def exception(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._resolve().exception(event, *args, **kw)


LIBRARY_LOGGER = "qbroker"


def _render_for_stdlib(_logger: Any, _method: str, event: EventDict) -> str:
    """One text line for a stdlib handler: the event, then ``key=value`` pairs (values escaped as on the
    console: they may come off the wire)."""
    message = printable(str(event.pop("event", "")))
    pairs = " ".join(
        f"{key}={printable(value) if isinstance(value, str) else repr(value)}" for key, value in event.items()
    )
    return f"{message} {pairs}" if pairs else message


def _stdlib_logger() -> Any:
    return structlog.wrap_logger(
        logging.getLogger(LIBRARY_LOGGER),
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            structlog.processors.format_exc_info,
            _render_for_stdlib,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
    )


def get_logger(**bound: Any) -> FilteringBoundLogger:
    """The library's logger with ``bound`` values (a unit's app and uuid): see ``LibraryLogger``."""
    return cast(FilteringBoundLogger, LibraryLogger(bound))
