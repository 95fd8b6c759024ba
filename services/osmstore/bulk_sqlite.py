"""Bulk loading into SQLite from columns: the settings for a load and many rows per INSERT statement.

``executemany`` with one row per statement costs about 2 microseconds a row in the sqlite3 module (binding,
stepping and resetting the statement per row), several times what SQLite spends storing the row; a
statement with 500 rows of placeholders, bound from one flat list, costs under half of that (measured in
docs/performance.md). The stores are built in a directory that is thrown away on failure, so the load
runs without a journal and without syncs (``bulk_load_settings``); indexes are built after the load.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

ROWS_PER_STATEMENT = 500  # x up to 8 columns: within SQLite's default 32,766 host parameters


def bulk_load_settings(conn: sqlite3.Connection, cache_mib: int = 32) -> None:
    """No journal, no syncs, a small fixed page cache: for a database built in a throwaway directory.

    The rows go in in key order (appends: little cache needed), and SQLite's sorter (CREATE INDEX, ORDER BY)
    keeps up to the cache size in memory per sorting thread before it spills to a temporary file: with a
    128 MiB cache and ``PRAGMA threads = 2`` the index builds took more memory and longer than with 32 MiB
    and one thread (docs/performance.md, "Import at scale: toposm-import against osm2pgsql"). The import
    already has its two processes on the two cores."""
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute(f"PRAGMA cache_size = {-1024 * cache_mib}")
    conn.execute("PRAGMA temp_store = FILE")  # sorts spill to disk instead of growing the heap


def insert_columns(conn: sqlite3.Connection, sql_head: str, columns: Sequence[Sequence[Any]]) -> int:
    """``sql_head`` ("INSERT INTO t (a, b)") with the rows made of ``columns`` (equal-length sequences of
    Python values); returns the row count."""
    width = len(columns)
    count = len(columns[0]) if columns else 0
    if count == 0:
        return 0
    row = "(" + ", ".join("?" * width) + ")"
    full = count - count % ROWS_PER_STATEMENT
    if full:
        flat: list[Any] = [None] * (full * width)
        for j, column in enumerate(columns):
            flat[j::width] = column[:full] if len(column) != full else column
        step = ROWS_PER_STATEMENT * width
        conn.executemany(
            f"{sql_head} VALUES {', '.join([row] * ROWS_PER_STATEMENT)}",
            (flat[i : i + step] for i in range(0, len(flat), step)),
        )
    if count > full:
        conn.executemany(f"{sql_head} VALUES {row}", zip(*(column[full:] for column in columns), strict=True))
    return count


def analyze(conn: sqlite3.Connection) -> None:
    """Planner statistics from a sample (a full ANALYZE reads every index of a country-sized store)."""
    conn.execute("PRAGMA analysis_limit = 1000")
    conn.execute("ANALYZE main")  # not an attached database (the rendering store attaches the geometry store)
