"""A store job's rendering store update, in a process of its own while Spark computes the expiry.

``apply_osc`` is Python and SQLite (docs/performance.md, "The Spark bridge"); run after the Spark part, it added up
with it. In a thread beside the job it fought the job's own Python (py4j calls, the resolution's
dictionaries) for the GIL, and the two were barely faster than one after the other. So it runs in a
child interpreter (``python -m services.spark_bridge.render_apply``, importing only the rendering store)
and the two really overlap. The child builds the whole transaction, says ``prepared`` and waits; the job
answers ``commit`` once the expiry succeeded and no guard tripped, ``rollback`` on anything else, so a
failed, refused or cancelled job leaves the rendering store as it was, and the commits keep their order
(rendering store, then publishing, then the geometry store).

The child is a worker kept for the bridge's life, one job after the other: its interpreter start (libosmium
and the rendering store's code, docs/decisions.md) is paid once, and its connection to each store stays open,
so SQLite's cache keeps the upper levels of the store's B-trees and R*Trees from one diff to the next (a fresh
connection read them again every diff, which at scale was a large share of the update's CPU:
docs/decisions.md, "A store diff's path end to end"). Concurrent jobs take a worker each; a worker that breaks
the protocol is ended and replaced. A worker exits when the bridge does (its stdin closes).

Protocol, one JSON document per line: the parent writes the job's arguments (``[store_dir, osc_path,
sequence or null, sha256]``); the child writes ``{"prepared": true}`` (only when it has a transaction to
commit), then ``{"done": {...what changed}}`` or ``{"error": "message"}``, after the parent's ``"commit"``
or ``"rollback"``; then it waits for the next job.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from services.osmstore.geometry import MMAP_BYTES
from services.osmstore.render_db import RENDER_DB, connect
from services.osmstore.render_store import RenderStoreError, apply_osc
from services.osmstore.wal import WAL_SIZE_LIMIT, Checkpointer

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding services/
CACHE_KIB = 256 * 1024  # SQLite's page cache per kept connection
KEPT_STORES = 4  # connections a worker keeps (a bridge serves a few stores)


_idle_lock = threading.Lock()
_idle: list[subprocess.Popen[str]] = []  # workers waiting for a job


def _spawn() -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    )


def _take() -> subprocess.Popen[str]:
    with _idle_lock:
        while _idle:
            worker = _idle.pop()
            if worker.poll() is None:
                return worker
            _end(worker)
    return _spawn()


def _end(worker: subprocess.Popen[str]) -> None:
    assert worker.stdin is not None and worker.stdout is not None
    try:
        worker.stdin.close()
    except OSError:
        pass
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:  # busy with a job nobody will finish
        worker.kill()
        worker.wait()
    worker.stdout.close()


def end_workers() -> None:
    """End the idle workers (the bridge closing, after its jobs)."""
    with _idle_lock:
        workers = list(_idle)
        _idle.clear()
    for worker in workers:
        _end(worker)


class RenderApply:
    """Hands the job to a worker at once; ``commit()`` or ``abandon()`` ends it (exactly one of them, once)."""

    def __init__(self, store_dir: Path, osc_path: Path, sequence: int | None, sha256: str) -> None:
        self._worker = _take()
        assert self._worker.stdin is not None
        try:
            self._worker.stdin.write(json.dumps([str(store_dir), str(osc_path), sequence, sha256]) + "\n")
            self._worker.stdin.flush()
        except OSError:
            pass  # the worker is gone: _finish reports it

    def _read(self) -> dict[str, Any]:
        assert self._worker.stdout is not None
        line = self._worker.stdout.readline()
        if not line:
            raise EOFError
        word = json.loads(line)
        if not isinstance(word, dict):
            raise ValueError(line[:100])
        return word

    def _finish(self, verdict: str) -> dict[str, Any]:
        assert self._worker.stdin is not None
        try:
            word = self._read()
            if word.get("prepared"):
                self._worker.stdin.write(verdict + "\n")
                self._worker.stdin.flush()
                word = self._read()
        except (OSError, ValueError, EOFError) as exc:
            _end(self._worker)  # it broke the protocol: no further job for it
            return {"error": f"the rendering store update failed ({type(exc).__name__})"}
        with _idle_lock:
            _idle.append(self._worker)
        return word

    def commit(self) -> dict[str, Any]:
        word = self._finish("commit")
        if "error" in word:
            raise RenderStoreError(str(word["error"]))
        return dict(word["done"])

    def abandon(self) -> None:
        self._finish("rollback")


class _Connections:
    """The worker's connection to each store it updated, kept while the store's file is the same one
    (a store imported again with --replace is a new file: a new connection).

    A kept store is switched to WAL mode: a commit appends the diff's pages to the log and syncs that
    (in the default rollback journal it also rewrote them in place and synced twice, and waited for every
    renderer reading the file), renderers keep reading the previous state while a diff commits, and the
    log is checkpointed in the background after each job (osmstore.wal). Mapnik's sqlite plugin reads WAL
    files as it reads the others."""

    def __init__(self) -> None:
        self._open: dict[Path, tuple[int, sqlite3.Connection, Checkpointer | None]] = {}

    def get(self, store_dir: Path) -> sqlite3.Connection | None:
        db = store_dir / RENDER_DB
        try:
            inode = db.stat().st_ino
        except OSError:
            return None  # apply_osc says what is missing
        known = self._open.get(db)
        if known is not None and known[0] == inode:
            return known[1]
        self.drop(store_dir)
        conn = connect(db)
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
        conn.execute("PRAGMA busy_timeout = 30000")
        checkpointer = None
        # Not while a renderer has the file open in the rollback journal (busy): then next time.
        if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal":
            conn.executescript(f"PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = {WAL_SIZE_LIMIT};")
            checkpointer = Checkpointer(db)
        self._open[db] = (inode, conn, checkpointer)
        while len(self._open) > KEPT_STORES:  # the least recently opened goes (dicts keep their order)
            self._close(self._open.pop(next(iter(self._open))))
        return conn

    def done(self, store_dir: Path) -> None:
        """A job ended: checkpoint what it committed, beside the next one."""
        known = self._open.get(store_dir / RENDER_DB)
        if known is not None and known[2] is not None:
            known[2].poke()

    def drop(self, store_dir: Path) -> None:
        """After a failure: the next job of the store starts from a new connection."""
        known = self._open.pop(store_dir / RENDER_DB, None)
        if known is not None:
            self._close(known)

    @staticmethod
    def _close(known: tuple[int, sqlite3.Connection, Checkpointer | None]) -> None:
        if known[2] is not None:
            known[2].close()
        known[1].close()


def _serve(args: list[Any], proto: IO[str], connections: _Connections) -> None:
    store_dir, osc_path, sequence, sha256 = args
    started, cpu = time.perf_counter(), time.process_time()
    spent: dict[str, float] = {}

    def commit_if() -> bool:
        # What building the transaction took (the job's result shows it: the longest part of a store job).
        spent.update(
            prepare_seconds=round(time.perf_counter() - started, 3),
            prepare_cpu_seconds=round(time.process_time() - cpu, 3),
        )
        proto.write(json.dumps({"prepared": True}) + "\n")
        proto.flush()
        return sys.stdin.readline().strip() == "commit"

    try:
        done = apply_osc(
            Path(store_dir),
            Path(osc_path),
            sequence=sequence,
            sha256=sha256,
            commit_if=commit_if,
            connection=connections.get(Path(store_dir)),
        )
    except Exception as exc:  # noqa: BLE001 - every failure is the parent's to report
        connections.drop(Path(store_dir))
        message = str(exc) if isinstance(exc, RenderStoreError) else f"{type(exc).__name__}: {exc}"
        proto.write(json.dumps({"error": message}) + "\n")
    else:
        proto.write(json.dumps({"done": {**done, **spent}}) + "\n")
        connections.done(Path(store_dir))
    proto.flush()


if __name__ == "__main__":
    # The protocol keeps the real stdout; anything else printed goes to stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    kept = _Connections()
    while job := sys.stdin.readline():  # EOF: the bridge is gone or closing
        _serve(json.loads(job), protocol, kept)
