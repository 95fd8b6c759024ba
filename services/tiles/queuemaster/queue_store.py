"""SQLite storage of the render queue: every queued or in-flight metatile, and the pick order.

The database *is* the queue (the queuemaster keeps only per-queue counts and the few metatiles in flight
in memory), so 10 million queued metatiles cost disk and SQLite's bounded page cache, not Python objects.
One row per metatile, keyed by its packed address; a partial index on ``(src, seq)`` over the queued rows
makes "first of a queue" a B-tree descent: O(log n), with no stale entries to skip.

WAL journal with ``synchronous=NORMAL``: a committed transaction survives the process being SIGKILLed
(only an OS crash or power loss could drop the last commits). By default each write outside ``batch()``
commits on its own and ``batch()`` groups writes into one transaction. With ``defer_commits`` (the running
queuemaster) nothing commits by itself: the first write opens a transaction and tells the owner, which
commits once for everything written meanwhile (group commit); ``batch()`` is then a savepoint.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from services.toposm.contract import KEY_SQL, metatile_key, unpack_key
from services.toposm.tilemath import Metatile

# src: which queue a row is in: a background row's zoom (0-30), or one of these.
SRC_MISSING = -1
SRC_IMPORTANT = -2
SRC_BULK = -3  # toposm-render-list's pre-rendering, below every other queue
# state
QUEUED, RENDERING, RENDERING_DIRTY = 0, 1, 2  # dirty: expired again while rendering: render once more

SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    key INTEGER PRIMARY KEY,  -- z << 56 | mx << 28 | my (contract.metatile_key)
    src INTEGER NOT NULL,
    seq INTEGER NOT NULL,     -- order within its queue (negative = put back at the front)
    state INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_order ON queue (src, seq) WHERE state = 0;
"""

# The layout before the queue lived in SQLite only (one TEXT class per row, no pick index): migrated once.
_OLD_TABLE_MIGRATION = f"""
INSERT OR REPLACE INTO queue (key, src, seq, state)
SELECT {KEY_SQL},
       CASE cls WHEN 'missing' THEN -1 WHEN 'important' THEN -2 ELSE z END,
       seq,
       CASE WHEN dirty THEN 2 WHEN rendering THEN 1 ELSE 0 END
FROM metatiles;
DROP TABLE metatiles;
"""  # noqa: S608 - KEY_SQL is a constant of ours


def pack(m: Metatile) -> int:
    return metatile_key(m.z, m.mx, m.my)


def unpack(key: int) -> Metatile:
    return Metatile(*unpack_key(key))


class QueueStore:
    """One SQLite file holding every queued or in-flight metatile."""

    def __init__(self, path: str | Path, *, cache_mb: int = 64) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode; batch() opens explicit transactions.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"PRAGMA cache_size=-{int(cache_mb) * 1024}")  # bounded, whatever the queue size
        self._db.executescript(SCHEMA)
        if self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='metatiles'").fetchone():
            self._db.executescript("BEGIN;" + _OLD_TABLE_MIGRATION + "COMMIT;")
        self._depth = 0
        self._on_open: Callable[[], None] | None = None

    def close(self) -> None:
        self.commit()
        self._db.close()

    def defer_commits(self, on_open: Callable[[], None] | None) -> None:
        """Group commits: from now on no write commits by itself; the first write after a commit opens a
        transaction and calls ``on_open``, whose owner must call ``commit()`` soon (and answer nothing that
        depends on the writes before it has). None: every write and batch commits at once again."""
        self.commit()
        self._on_open = on_open

    @property
    def uncommitted(self) -> bool:
        return self._db.in_transaction

    def commit(self) -> None:
        if self._db.in_transaction:
            self._db.execute("COMMIT")

    def _writing(self) -> None:
        """Called before every write: in group-commit mode, open the transaction the write joins."""
        if self._on_open is not None and not self._db.in_transaction:
            self._db.execute("BEGIN")
            self._on_open()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group writes into one transaction (nestable; the outermost commits). In group-commit mode a
        savepoint instead: a failure rolls back this batch's writes only, the group's others stay."""
        if self._on_open is not None:
            self._writing()
            name = f"batch{self._depth}"
            self._db.execute(f"SAVEPOINT {name}")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._db.execute(f"ROLLBACK TO {name}")
                raise
            finally:
                self._depth -= 1
                self._db.execute(f"RELEASE {name}")
            return
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

    # -- reads ----------------------------------------------------------------------------------------

    def summary(self) -> tuple[dict[int, int], int, int, list[tuple[int, int, int]]]:
        """Queued rows per src, the lowest and highest seq, and the rows in flight (key, src, seq)."""
        counts = dict(self._db.execute("SELECT src, count(*) FROM queue WHERE state = 0 GROUP BY src").fetchall())
        low, high = self._db.execute("SELECT min(seq), max(seq) FROM queue").fetchone()
        in_flight = self._db.execute("SELECT key, src, seq FROM queue WHERE state != 0").fetchall()
        return counts, low or 0, high or 0, in_flight

    def row(self, key: int) -> tuple[int, int] | None:
        """(src, state) of a metatile, or None if it is not known."""
        found: tuple[int, int] | None = self._db.execute(
            "SELECT src, state FROM queue WHERE key = ?", (key,)
        ).fetchone()
        return found

    def known(self, keys: list[int]) -> set[int]:
        """Which of ``keys`` are known (queued or in flight): one statement, however many keys."""
        rows = self._db.execute(
            "SELECT key FROM queue WHERE key IN (SELECT value FROM json_each(?))", (json.dumps(keys),)
        )
        return {key for (key,) in rows}

    def first(self, src: int) -> int | None:
        """The key of the first queued metatile of ``src`` (the partial index: O(log n))."""
        found = self._db.execute(
            "SELECT key FROM queue WHERE src = ? AND state = 0 ORDER BY seq LIMIT 1", (src,)
        ).fetchone()
        return None if found is None else int(found[0])

    def queued_in(self, keys: list[int], src: int) -> list[int]:
        """Which of ``keys`` are queued (not in flight) in ``src``, in ``keys``' order."""
        rows = self._db.execute(
            "SELECT key FROM queue WHERE src = ? AND state = 0 AND key IN (SELECT value FROM json_each(?))",
            (src, json.dumps(keys)),
        )
        found = {key for (key,) in rows}
        return [key for key in keys if key in found]

    def queued_keys(self) -> list[int]:
        return [key for (key,) in self._db.execute("SELECT key FROM queue WHERE state = 0 ORDER BY seq")]

    # -- writes ---------------------------------------------------------------------------------------

    def put(self, key: int, src: int, seq: int, state: int) -> None:
        self._writing()
        self._db.execute(
            "INSERT OR REPLACE INTO queue (key, src, seq, state) VALUES (?, ?, ?, ?)", (key, src, seq, state)
        )

    def put_many(self, rows: Iterable[tuple[int, int, int, int]]) -> None:
        self._writing()
        self._db.executemany("INSERT OR REPLACE INTO queue (key, src, seq, state) VALUES (?, ?, ?, ?)", rows)

    def insert_new(self, keys: list[int], src: int, first_seq: int) -> int:
        """Queue the ``keys`` that are not there yet in ``src``, with seqs ``first_seq, first_seq + 1, ...``
        in list order; returns how many were inserted. One statement: the keys travel as one JSON array,
        which costs less than binding a row at a time (this is the expiry ingestion's hot path)."""
        self._writing()
        before = self._db.total_changes
        self._db.execute(
            "INSERT OR IGNORE INTO queue (key, src, seq, state) SELECT j.value, ?, ? + j.key, 0 FROM json_each(?) AS j",
            (src, first_seq, json.dumps(keys)),
        )
        return self._db.total_changes - before

    def set_state(self, key: int, state: int) -> None:
        self._writing()
        self._db.execute("UPDATE queue SET state = ? WHERE key = ?", (state, key))

    def set_states(self, keys: Iterable[int], state: int) -> None:
        self._writing()
        self._db.executemany("UPDATE queue SET state = ? WHERE key = ?", ((state, key) for key in keys))

    def delete(self, key: int) -> None:
        self._writing()
        self._db.execute("DELETE FROM queue WHERE key = ?", (key,))

    def delete_many(self, keys: list[int]) -> None:
        self._writing()
        self._db.execute("DELETE FROM queue WHERE key IN (SELECT value FROM json_each(?))", (json.dumps(keys),))
