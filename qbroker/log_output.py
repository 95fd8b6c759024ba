"""Writing log lines to a stream without ever blocking or raising into the code that logged.

Log lines go to stderr through ``DroppingLogger``: a write that fails (the pipe's reader exited, a log
collector restarting, a full disk) drops that line and counts it (``dropped_log_lines``), and never raises
into the code that logged. Logging sits on every path that acks, replies and stops; a dying log pipe must
not cost a message or a SIGTERM. A pipe whose reader stops reading without going away (a stalled
collector) would block each write once its buffer is full, and with it the event loop: lines for a pipe
are written by a thread of their own from a bounded queue, and when that is full they are dropped and
counted too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import stat
import sys
import threading
import time
from typing import TextIO

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
                        data = data[os.write(self.fd, data) :]
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
