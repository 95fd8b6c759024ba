"""The render queue: merging, priorities, O(log n) picks and SQLite persistence."""

from harness.queues import fill_half_raised
from services.tiles.queuemaster.queue_store import QueueStore
from services.tiles.queuemaster.render_queue import RenderQueue
from services.toposm.strategy import IMPORTANT, MISSING
from services.toposm.tilemath import Metatile


def make(tmp_path, name="q.sqlite"):
    return RenderQueue(QueueStore(tmp_path / name))


def test_fifo_per_zoom_and_merge(tmp_path):
    q = make(tmp_path)
    a, b, c = Metatile(10, 1, 1), Metatile(10, 2, 2), Metatile(11, 0, 0)
    assert q.add(a, "background") == "queued"
    assert q.add(b, "background") == "queued"
    assert q.add(c, "background") == "queued"
    assert q.add(a, "background") == "merged"
    assert q.background_by_zoom() == {10: 2, 11: 1}
    assert q.pop(10) == a and q.pop(10) == b and q.pop(10) is None
    assert q.state_of(a) == "rendering"


def test_request_raises_priority(tmp_path):
    q = make(tmp_path)
    a, b = Metatile(10, 1, 1), Metatile(10, 2, 2)
    q.add(a, "background")
    q.add(b, "background")
    assert q.add(b, "important") == "raised"
    assert q.add(b, "background") == "merged"  # never lowered
    assert (q.important, q.background_by_zoom()) == (1, {10: 1})
    assert q.pop(IMPORTANT) == b
    assert q.pop(10) == a  # b's stale heap item is skipped
    assert q.pop(10) is None
    assert q.add(Metatile(3, 0, 0), "missing") == "queued" and q.missing == 1


def test_expiry_while_rendering_renders_again(tmp_path):
    q = make(tmp_path)
    a = Metatile(12, 5, 5)
    q.add(a, "missing")
    assert q.pop(MISSING) == a
    assert q.add(a, "background") == "marked_dirty"
    assert q.add(a, "background") == "rendering"
    assert q.finish(a) is True
    assert q.background_by_zoom() == {12: 1}
    assert q.pop(12) == a
    assert q.finish(a) is False
    assert q.state_of(a) is None and q.queued_count() == 0


def test_put_back_goes_to_front(tmp_path):
    q = make(tmp_path)
    ms = [Metatile(9, i, 0) for i in range(5)]
    for m in ms:
        q.add(m, "background")
    first = q.pop(9)
    q.put_back(first)
    assert q.pop(9) == first
    assert q.pop(9) == ms[1]


def test_survives_restart(tmp_path):
    q = make(tmp_path)
    ms = [Metatile(9, i, 0) for i in range(6)]
    for m in ms:
        q.add(m, "background")
    q.add(ms[4], "important")
    q.add(Metatile(4, 1, 1), "missing")
    rendering = q.pop(9)  # ms[0], in flight when the "process dies"
    q.pop(9)
    q.finish(ms[1])  # done: must not come back
    # No close(): as after SIGKILL, only what was committed is on disk.
    q2 = make(tmp_path)
    assert q2.missing == 1 and q2.important == 1
    assert q2.background_by_zoom() == {9: 4}  # ms[0] (in flight) back, ms[1] gone, ms[4] important
    assert q2.pop(9) == rendering  # in-flight work comes back at the front
    assert [q2.pop(9) for _ in range(3)] == [ms[2], ms[3], ms[5]]
    assert q2.pop(IMPORTANT) == ms[4]


def test_claim_marks_in_flight(tmp_path):
    q = make(tmp_path)
    a = Metatile(7, 1, 1)
    q.add(a, "background")
    q.claim(a)
    assert q.state_of(a) == "rendering" and q.background_by_zoom() == {}
    assert q.pop(7) is None
    assert q.finish(a) is False


def test_picks_skip_raised_items_left_in_the_heap(tmp_path):
    """Raising half the queue leaves stale heap entries behind: background picks must skip them, each
    metatile comes out once, in queue order (the pick speed itself is measured by bench/queuemaster.py)."""
    q = make(tmp_path)
    n = 2000
    metatiles = fill_half_raised(q, n)
    assert q.background_by_zoom() == {14: n // 2} and q.important == n // 2
    picked = [q.pop(14) for _ in range(n // 2)]
    assert picked == metatiles[1::2]
    assert q.pop(14) is None
    assert [q.pop(IMPORTANT) for _ in range(n // 2)] == metatiles[::2]


def test_add_expired_counts_each_outcome_and_keeps_fifo(tmp_path):
    q = make(tmp_path)
    a, b, c, d, e = (Metatile(12, i, 0) for i in range(5))
    q.add(a, "background")
    q.add(b, "missing")
    assert q.pop(MISSING) == b  # b in flight
    q.add(c, "missing")
    assert q.pop(MISSING) == c
    q.add(c, "background")  # c in flight and dirty already
    outcome = q.add_expired([a, b, c, d, e, d], keep_unknown=lambda m: m != e)
    assert outcome == {"merged": 2, "marked_dirty": 1, "rendering": 1, "queued": 1, "not_rendered_yet": 1}
    assert q.background_by_zoom() == {12: 2}
    assert [q.pop(12), q.pop(12), q.pop(12)] == [a, d, None]
    assert q.finish(b) is True and q.pop(12) == b  # expired while rendering: queued again, at the back


def test_state_file_of_the_old_layout_is_migrated(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE metatiles (z INTEGER NOT NULL, mx INTEGER NOT NULL, my INTEGER NOT NULL, cls TEXT NOT NULL,
            seq INTEGER NOT NULL, rendering INTEGER NOT NULL, dirty INTEGER NOT NULL, PRIMARY KEY (z, mx, my))
            WITHOUT ROWID;
        INSERT INTO metatiles VALUES (9, 1, 0, 'background', 1, 0, 0), (9, 2, 0, 'background', 2, 1, 0),
            (4, 1, 1, 'missing', 3, 0, 0), (9, 3, 0, 'important', 4, 0, 0);
    """)
    db.commit()
    db.close()
    q = make(tmp_path, "old.sqlite")
    assert (q.missing, q.important, q.background_by_zoom()) == (1, 1, {9: 2})
    assert q.pop(9) == Metatile(9, 2, 0)  # in flight when the old queuemaster stopped: back at the front
    assert q.pop(9) == Metatile(9, 1, 0)
    assert q.pop(MISSING) == Metatile(4, 1, 1) and q.pop(IMPORTANT) == Metatile(9, 3, 0)
