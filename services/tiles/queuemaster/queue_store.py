"""SQLite persistence of the render queue, so a killed queuemaster loses no queued metatile.

WAL journal with ``synchronous=NORMAL``: a committed transaction survives the process being SIGKILLed
(only an OS crash or power loss could drop the last commits). Every queue mutation is committed before the
queuemaster acts on it; bulk expirations are committed as one transaction per message.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..tilemath import Metatile

SCHEMA = """
CREATE TABLE IF NOT EXISTS metatiles (
    z INTEGER NOT NULL,
    mx INTEGER NOT NULL,
    my INTEGER NOT NULL,
    cls TEXT NOT NULL,          -- missing | important | background
    seq INTEGER NOT NULL,       -- order within its queue (negative = put back at the front)
    rendering INTEGER NOT NULL, -- 1 while a renderer has it
    dirty INTEGER NOT NULL,     -- expired again while rendering: render once more afterwards
    PRIMARY KEY (z, mx, my)
) WITHOUT ROWID;
"""


@dataclass(slots=True)
class StoredMetatile:
    metatile: Metatile
    cls: str
    seq: int
    rendering: bool
    dirty: bool


class QueueStore:
    """One SQLite file holding every queued or in-flight metatile."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode; batch() opens explicit transactions so one expiry message is one commit.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._depth = 0

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group writes into one transaction (nestable; the outermost commits)."""
        if self._depth == 0:
            self._db.execute("BEGIN")
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self._db.execute("ROLLBACK")
            raise
        self._depth -= 1
        if self._depth == 0:
            self._db.execute("COMMIT")

    def save(self, entries: Iterable[StoredMetatile]) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO metatiles (z, mx, my, cls, seq, rendering, dirty) VALUES (?,?,?,?,?,?,?)",
            [
                (e.metatile.z, e.metatile.mx, e.metatile.my, e.cls, e.seq, int(e.rendering), int(e.dirty))
                for e in entries
            ],
        )

    def delete(self, metatile: Metatile) -> None:
        self._db.execute(
            "DELETE FROM metatiles WHERE z=? AND mx=? AND my=?", (metatile.z, metatile.mx, metatile.my)
        )

    def load(self) -> list[StoredMetatile]:
        rows = self._db.execute("SELECT z, mx, my, cls, seq, rendering, dirty FROM metatiles ORDER BY seq")
        return [
            StoredMetatile(Metatile(z, mx, my), cls, seq, bool(rendering), bool(dirty))
            for z, mx, my, cls, seq, rendering, dirty in rows
        ]
