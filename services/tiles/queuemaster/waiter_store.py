"""Long-running requests (``render``) kept on disk until answered, so a restart answers them.

A ``render`` request is acked at once (``ctx.detach()``: it may wait minutes and must not hold a
prefetch slot), so after a SIGKILL the broker has nothing to redeliver. Its reply-to and message-id
are all a reply needs, so they are written here before the ack and deleted once the reply is sent; the
queuemaster re-runs what is left when it starts and answers those callers itself.

Same SQLite file as the render queue (its own table and connection; WAL allows both), committed per
write: a committed row survives the process being SIGKILLed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("toposm.queuemaster")

SCHEMA = """
CREATE TABLE IF NOT EXISTS waiters (
    id INTEGER PRIMARY KEY,
    command TEXT NOT NULL,
    body TEXT NOT NULL,        -- the validated request, as JSON
    reply_to TEXT NOT NULL,
    message_id TEXT NOT NULL,
    user_id TEXT,
    deadline REAL,             -- epoch seconds, or NULL: the caller gave none
    wire TEXT NOT NULL DEFAULT 'qbroker'  -- how to answer: a qbroker reply, or raw JSON on the osm wire
);
"""


@dataclass(frozen=True)
class StoredWaiter:
    id: int
    command: str
    body: str
    reply_to: str
    message_id: str
    user_id: str | None
    deadline: float | None
    wire: str = "qbroker"


class WaiterStore:
    def __init__(self, path: str | Path, before_write: Callable[[], None] | None = None) -> None:
        # Called before each write: the queue's connection commits its group transaction first, or this
        # write would wait for SQLite's one write lock that the same thread holds.
        self._before_write = before_write or (lambda: None)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(waiters)")}
        self._removed: list[int] = []  # answered, deleted together at the end of the loop's turn (remove)
        if "wire" not in columns:  # a state file from before osm-wire waiters were kept
            self._db.execute("ALTER TABLE waiters ADD COLUMN wire TEXT NOT NULL DEFAULT 'qbroker'")

    def add(
        self,
        command: str,
        body: str,
        reply_to: str,
        message_id: str,
        user_id: str | None,
        deadline: float | None,
        wire: str = "qbroker",
    ) -> int:
        self._before_write()
        cursor = self._db.execute(
            "INSERT INTO waiters (command, body, reply_to, message_id, user_id, deadline, wire) VALUES (?,?,?,?,?,?,?)",
            (command, body, reply_to, message_id, user_id, deadline, wire),
        )
        return int(cursor.lastrowid or 0)

    def remove(self, waiter_id: int) -> None:
        """Forget an answered request: with the others answered in the same turn of the event loop, in one
        statement (thousands answered at a stop are one delete, not one commit each). Until then a SIGKILL
        has the next run answer it again, as it would a request answered just before the kill."""
        self._removed.append(waiter_id)
        if len(self._removed) == 1:
            try:
                asyncio.get_running_loop().call_soon(self._flush_soon)
            except RuntimeError:  # no loop (a tool, a test): at once
                self.flush()

    def _flush_soon(self) -> None:
        try:
            self.flush()
        except sqlite3.Error as exc:  # answered anyway; at worst answered again after a restart
            log.warning("waiter rows not removed", count=len(self._removed), error=str(exc))

    def replies(self, ids: list[int]) -> list[tuple[int, str, str]]:
        """(id, reply_to, message_id) of those of ``ids`` still kept, in id order."""
        self.flush()
        rows = self._db.execute(
            "SELECT id, reply_to, message_id FROM waiters WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id",
            (json.dumps(ids),),
        ).fetchall()
        return [(int(i), str(reply_to), str(message_id)) for i, reply_to, message_id in rows]

    def flush(self) -> None:
        """Delete the rows of the requests answered since the last flush."""
        if not self._removed:
            return
        self._before_write()
        removed, self._removed = self._removed, []
        self._db.execute("DELETE FROM waiters WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(removed),))

    def take_live(self, now: float | None = None) -> list[StoredWaiter]:
        """The waiters left by the last run whose callers still wait; the expired ones are dropped."""
        now = time.time() if now is None else now
        self._before_write()
        self._db.execute("DELETE FROM waiters WHERE deadline IS NOT NULL AND deadline < ?", (now,))
        rows = self._db.execute(
            "SELECT id, command, body, reply_to, message_id, user_id, deadline, wire FROM waiters ORDER BY id"
        ).fetchall()
        return [StoredWaiter(*row) for row in rows]

    def count(self) -> int:
        self.flush()
        return int(self._db.execute("SELECT count(*) FROM waiters").fetchone()[0])

    def close(self) -> None:
        self.flush()
        self._db.close()
