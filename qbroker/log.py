"""structlog set-up: qbroker logs with the unit's app and uuid bound, and each message's ids.

Log lines go to stderr through ``DroppingLogger``: a write that fails (the pipe's reader exited, a log
collector restarting, a full disk) drops that line and counts it (``dropped_log_lines``), and never raises
into the code that logged. Logging sits on every path that acks, replies and stops; a dying log pipe must
not cost a message or a SIGTERM. A pipe whose reader stops reading without going away (a stalled
collector) would block each write once its buffer is full, and with it the event loop: lines for a pipe
are written by a thread of their own from a bounded queue, and when that is full they are dropped and
counted too. Console lines show control characters escaped: values from the bus reach an operator's
terminal as text, never as terminal commands.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import stat
import sys
import threading
import time
from typing import Any, NoReturn, TextIO, cast

import structlog
from structlog.typing import EventDict, FilteringBoundLogger

from qbroker.printable import printable

_configured = False
_dropped = 0
_write_lock = threading.Lock()
_silenced: set[int] = set()  # descriptors whose reader is gone: pointed at /dev/null, lines counted as dropped
_QUEUED_LINES = 10_000  # lines waiting for a slow pipe's reader before later ones are dropped
_EXIT_FLUSH_SECONDS = 2.0  # at exit, how long waiting lines may take to reach a pipe (a stalled one: never)


def dropped_log_lines() -> int:
    """Log lines this process could not write (their stream failed) and dropped."""
    return _dropped


def _descriptor(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError):  # an in-memory stream (tests capture output), or a closed one
        return None


def _silence(fd: int | None) -> None:
    """Point a broken pipe's descriptor at /dev/null: every later write of anyone (stdlib logging, the
    interpreter's flush at exit) then succeeds quietly instead of raising or printing about it. A pipe
    whose reader is gone never comes back, so nothing is lost that could have been written."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        _silenced.add(fd)


def _count_dropped() -> None:
    global _dropped
    with _write_lock:
        _dropped += 1


class _PipeWriter:
    """Writes the lines for one pipe from a daemon thread: a reader that stalls blocks that thread only."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lines: queue.Queue[bytes] = queue.Queue(maxsize=_QUEUED_LINES)
        threading.Thread(target=self._run, name=f"qbroker-log-{fd}", daemon=True).start()

    def put(self, line: str) -> bool:
        """Queue one line; False when the queue is full (the caller counts it as dropped)."""
        try:
            self.lines.put_nowait(line.encode("utf-8", "replace"))
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while True:
            data = self.lines.get()
            try:
                if self.fd not in _silenced:
                    while data:
                        data = data[os.write(self.fd, data):]
                else:
                    _count_dropped()
            except BrokenPipeError:
                _count_dropped()
                _silence(self.fd)
            except OSError:
                _count_dropped()
            finally:
                self.lines.task_done()

    def flush(self, deadline: float) -> None:
        while self.lines.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)


_pipe_writers: dict[int, _PipeWriter] = {}


def _pipe_writer(fd: int) -> _PipeWriter | None:
    """The writer thread for ``fd`` if it is a pipe or socket (files and terminals are written directly)."""
    writer = _pipe_writers.get(fd)
    if writer is None:
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return None
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return None
        writer = _pipe_writers[fd] = _PipeWriter(fd)
    return writer


@atexit.register
def _flush_pipes() -> None:
    deadline = time.monotonic() + _EXIT_FLUSH_SECONDS
    for writer in list(_pipe_writers.values()):
        writer.flush(deadline)


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads (and maybe a lock one of them held): it starts
    writers of its own."""
    global _write_lock
    _write_lock = threading.Lock()
    _pipe_writers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
            fd = _descriptor(stream)
            if fd in _silenced:
                _dropped += 1
                return
            writer = _pipe_writer(fd) if fd is not None else None
            if writer is not None:
                if not writer.put(message + "\n"):
                    _dropped += 1
                return
            try:
                stream.write(message + "\n")
                stream.flush()
            except BrokenPipeError:
                _dropped += 1
                _silence(_descriptor(stream))
            except (OSError, ValueError):  # EIO, ENOSPC (may pass later: keep trying), a closed stream
                _dropped += 1

    log = debug = info = warn = warning = error = critical = exception = fatal = failure = err = msg


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
    use_json = json if json is not None else (
        os.environ.get("QBROKER_LOG_FORMAT", "").lower() == "json"
        or os.environ.get("QBROKER_LOG_JSON", "") not in ("", "0"))
    _json_lines = use_json
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _add_process_fields,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    rendering: list[Any] = [
        structlog.processors.format_exc_info,
        *(() if use_json else (_escape_controls,)),
        renderer,
    ]
    _rendering_chain[:] = [*shared, *rendering]
    structlog.configure(
        processors=_rendering_chain,
        wrapper_class=structlog.make_filtering_bound_logger(level_number),
        logger_factory=_dropping_logger_factory,
        cache_logger_on_first_use=True,
    )
    handler = _StderrHandler()
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *rendering],
    ))
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
        "uncaught exception in a thread", thread=args.thread.name if args.thread else None,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def operator_line(message: str, level: str = "error", **fields: Any) -> bool:
    """Write a program's own message for its operator (a console script's one-line result or error) as a log
    line of the configured format, whatever the level filter; False (nothing written) before
    ``configure_logging``, where the caller prints it its own way."""
    if not _rendering_chain:
        return False
    writer = structlog.wrap_logger(DroppingLogger(), processors=_rendering_chain,
                                   wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET))
    getattr(writer, level)(message, **fields)
    return True


def exit_fatal(message: str, code: int = 1, **fields: Any) -> NoReturn:
    """End the program with ``message`` as one logged line (JSON in JSON mode), not a bare ``SystemExit``
    text; without configured logging, as that text."""
    if not operator_line(message, "critical", **fields):
        raise SystemExit(message)
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
                **self._bound)
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
    pairs = " ".join(f"{key}={printable(value) if isinstance(value, str) else repr(value)}"
                     for key, value in event.items())
    return f"{message} {pairs}" if pairs else message


def _stdlib_logger() -> Any:
    return structlog.wrap_logger(
        logging.getLogger(LIBRARY_LOGGER),
        processors=[structlog.stdlib.filter_by_level, structlog.contextvars.merge_contextvars,
                    structlog.processors.format_exc_info, _render_for_stdlib],
        wrapper_class=structlog.stdlib.BoundLogger,
    )


def get_logger(**bound: Any) -> FilteringBoundLogger:
    """The library's logger with ``bound`` values (a unit's app and uuid): see ``LibraryLogger``."""
    return cast(FilteringBoundLogger, LibraryLogger(bound))
