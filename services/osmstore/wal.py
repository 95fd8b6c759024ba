"""Write-ahead-log upkeep for the stores' SQLite files, beside the diffs that write them.

A store applying a diff a minute keeps one writer connection open (the bridge's geometry writer, the
rendering-store worker) and turns SQLite's automatic checkpoints off on it: an automatic checkpoint runs
inside the commit that crosses the threshold, so now and then one diff would also copy the log of the
diffs before it into the database file and sync it. Here a thread of the writer's process does that
after each diff instead, on a connection of its own, without blocking the writer (maintenance never
blocks a diff: docs/decisions.md, "The geometry store at scale").
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path

WAL_SIZE_LIMIT = 64 << 20  # what the log file is truncated to after a checkpoint (bytes)


class Checkpointer:
    """Copies committed diffs from the WAL into the database file in a thread of its own, after each
    ``poke`` (PASSIVE checkpoints: they wait for no reader or writer, and a writer never waits for them),
    so the diffs' commits cost the pages they append to the log and nothing more."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self._wanted = threading.Event()
        self._stopping = False
        self.checkpoints = 0
        self._thread = threading.Thread(target=self._run, name=f"checkpoint {db}", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self._wanted.set()

    def _run(self) -> None:
        with closing(sqlite3.connect(self.db, isolation_level=None)) as conn:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                except sqlite3.Error:
                    pass  # busy or gone: the next poke (or the writer's close) checkpoints
                if self._stopping:
                    return

    def close(self) -> None:
        self._stopping = True
        self._wanted.set()
        self._thread.join()
