"""Group commits and the key-based expiry parser: faster, with the same answers and the same durability."""

import asyncio
import os
import random
import sqlite3

import pytest

from harness import eventually
from qbroker import Config, Unit
from services.tiles.queuemaster.commands import COMMANDS
from services.tiles.queuemaster.expiry_keys import ancestor_keys, expiry_keys
from services.tiles.queuemaster.queue_store import pack
from services.tiles.queuemaster.state_machine import Queuemaster, QueuemasterSettings
from services.tiles.queuemaster.waiter_store import WaiterStore
from services.toposm.messages import RegisterRequest, RenderedRequest
from services.toposm.tilemath import Metatile, ZoomRange, parse_tile_list

from .conftest import stats


def keys_the_slow_way(text, zooms):
    tiles, problems = parse_tile_list(text, zooms)
    return [pack(t.metatile) for t in tiles], problems


@pytest.mark.parametrize(
    "text",
    [
        "14/5672/3452;14/5673/3452; 14/5672/3453;;bad;3/9/9\n2/0/0",
        "16/0/0;16/65535/65535\n;\n 1/1/1 ;0/0/0;;",
        "12/99999/0;19/0/0;5/1/1",  # outside its zoom, outside the range
        "5/1/1 5/2/2",  # no separator
        "5/\u0661/1;5/+1/1;5/1/-1;5/1/1/1;5/1",  # non-ASCII digit, sign, negative, too many and too few parts
        "5/1/1;" + "9" * 5000 + "/1/1",  # a number longer than int() takes
        "5/1/1\x0b;\u20035/2/2\u2003",  # whitespace the general parser strips
        "",
        ";;",
        "3/7/7",
        "007/0/0",
    ],
)
def test_expiry_keys_match_the_general_parser(text):
    zooms = ZoomRange(0, 18)
    assert expiry_keys(text, zooms) == keys_the_slow_way(text, zooms)


def test_expiry_keys_match_the_general_parser_on_random_lists():
    rng = random.Random(14)
    alphabet = "0123456789/;\n \t\rx-"
    for _ in range(2000):
        if rng.random() < 0.5:  # mostly well formed, some out of range
            items = [
                f"{z}/{rng.randrange(1 << z) + rng.choice([0, 0, 0, 1 << z])}/{rng.randrange(1 << z)}"
                for z in (rng.randrange(0, 21) for _ in range(rng.randrange(1, 30)))
            ]
            text = rng.choice([";", "\n", " ;", ";;"]).join(items)
        else:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        zooms = ZoomRange(rng.randrange(0, 5), rng.randrange(10, 19))
        assert expiry_keys(text, zooms) == keys_the_slow_way(text, zooms), text


def test_ancestor_keys_are_metatile_ancestors_nearest_first():
    metatiles = [Metatile(14, 2000, 1500), Metatile(14, 2001, 1500), Metatile(9, 3, 4)]
    keys = dict.fromkeys(pack(m) for m in metatiles)
    ancestor_keys(keys, 8)
    expected = dict.fromkeys(pack(m) for m in metatiles)
    for m in metatiles:
        for a in m.ancestors(8):
            if pack(a) in expected:
                break
            expected[pack(a)] = None
    assert list(keys) == list(expected)


def make_qm(tmp_path):
    return Queuemaster(
        QueuemasterSettings(
            tile_root=tmp_path / "tiles",
            state_file=tmp_path / "q.sqlite",
            render_log=tmp_path / "render.log",
            render_missing_expired=True,
            zooms=ZoomRange(0, 16),
            seed=1,
        )
    )


def rows_on_disk(state_file):
    """What another process (a restarted queuemaster) would read: committed rows only."""
    db = sqlite3.connect(state_file)
    try:
        return {key: state for key, state in db.execute("SELECT key, state FROM queue")}
    finally:
        db.close()


async def test_rendered_is_answered_only_once_its_finish_is_committed(tmp_path):
    qm = make_qm(tmp_path)
    qm.commits.start()
    qm.register(RegisterRequest(hostname="h", pid=1, threadid=0), "r")
    qm.expire("10/0/0;10/8/0", strict=False)
    [(_, m)] = qm.next_assignments()
    await qm.commits.durable()
    assert rows_on_disk(tmp_path / "q.sqlite")[pack(m)] == 1  # in flight, on disk
    answer = await COMMANDS["rendered"].run(qm, RenderedRequest(metatile=str(m)), "r")
    assert answer["expected"] is True
    # The answer went out after the commit: a restart would know the render happened, and its line is there.
    assert pack(m) not in rows_on_disk(tmp_path / "q.sqlite")
    assert str(m) in (tmp_path / "render.log").read_text()
    qm.close()


async def test_writes_share_one_commit_until_an_answer_or_a_short_while(tmp_path):
    qm = make_qm(tmp_path)
    qm.commits.start()
    qm.expire("10/0/0", strict=False)
    qm.expire("10/8/0", strict=False)
    assert qm.commits.uncommitted and rows_on_disk(tmp_path / "q.sqlite") == {}  # not yet: one commit for both
    await qm.commits.durable()
    assert not qm.commits.uncommitted and len(rows_on_disk(tmp_path / "q.sqlite")) == 2
    commits = qm.commits.commits
    # A dispatch round answers nobody: its picks are committed a moment later by themselves.
    qm.register(RegisterRequest(hostname="h", pid=1, threadid=0), "r")
    [(_, m)] = qm.next_assignments()

    async def committed():
        while qm.commits.uncommitted:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(committed(), 10)
    assert rows_on_disk(tmp_path / "q.sqlite")[pack(m)] == 1 and qm.commits.commits == commits + 1
    qm.close()


async def test_waiter_rows_do_not_wait_for_the_queue_transaction(tmp_path):
    """The waiter store has its own connection to the same file; SQLite has one write lock, which the
    queue's open group transaction holds: the queue commits first instead of deadlocking the loop."""
    qm = make_qm(tmp_path)
    qm.commits.start()
    waiters = WaiterStore(tmp_path / "q.sqlite", before_write=qm.commits.flush)
    waiters._db.execute("PRAGMA busy_timeout = 100")  # fail fast if the lock were still held
    qm.expire("10/0/0", strict=False)
    assert qm.commits.uncommitted
    waiters.add("render", "{}", "reply-queue", "id-1", None, None)
    assert waiters.count() == 1 and len(rows_on_disk(tmp_path / "q.sqlite")) == 1
    waiters.close()
    qm.close()


async def test_group_commits_survive_a_sigkill_without_losing_an_acknowledged_render(bus):
    """Null render threads report as fast as the queuemaster dispatches, so commits are grouped; the
    queuemaster is SIGKILLed mid-stream. Every `rendered` it acknowledged is on disk (its row gone, its
    render-log line written), and after the restart the rest renders: nothing lost, nothing acked twice."""
    qm = bus.queuemaster("--render-missing-expired")
    unit = Unit("test.null-renderer", config=Config(url=bus.url))
    acked: list[str] = []
    enough = asyncio.Event()
    threads = 4

    def null_thread(i):
        endpoint = unit.commands(f"toposm.render.nullhost.{os.getpid()}.{i}", exclusive=True)

        async def report(metatile):
            while True:  # as real renderers do: retried until the queuemaster acknowledges it
                try:
                    answer = await unit.call(
                        "toposm.queuemaster", {"command": "rendered", "metatile": metatile}, timeout=5
                    )
                    break
                except Exception:
                    await asyncio.sleep(0.2)
            if answer["expected"]:
                acked.append(metatile)
            if len(acked) >= 100:
                enough.set()

        @endpoint.command("render")
        async def render(metatile: str) -> dict:
            asyncio.ensure_future(report(metatile))
            return {"command": "accepted"}

        @endpoint.command("ping")
        async def ping() -> dict:
            return {"command": "pong", "state": "idle"}

    for i in range(threads):
        null_thread(i)
    await unit.start()
    bus.units.append(unit)

    async def register_all():
        for i in range(threads):
            await unit.call(
                "toposm.queuemaster", {"command": "register", "hostname": "nullhost", "pid": os.getpid(), "threadid": i}
            )
        return True

    await eventually(register_all)
    expired = [f"12/{x * 8}/{y * 8}" for x in range(20) for y in range(20)]  # 400 metatiles
    await unit.call("toposm.queuemaster", {"command": "expire", "tiles": ";".join(expired)}, timeout=30)
    await asyncio.wait_for(enough.wait(), 60)
    qm.kill()
    acked_at_kill = list(acked)
    on_disk = await asyncio.to_thread(rows_on_disk, bus.state_file)
    logged = {line["metatile"] for line in bus.render_log_lines()}
    for metatile in acked_at_kill:
        z, mx, my = map(int, metatile.split("/"))
        assert pack(Metatile(z, mx, my)) not in on_disk, f"{metatile} was acked but is not finished on disk"
        assert metatile in logged, f"{metatile} was acked but has no render-log line"
    bus.queuemaster("--render-missing-expired")
    await eventually(register_all)

    async def all_rendered():
        done = {line["metatile"] for line in bus.render_log_lines()}
        return done >= {f"12/{x}/{y}" for x in range(20) for y in range(20)} or None

    await eventually(all_rendered, timeout=60)
    s = await stats(unit)
    assert s["queues"]["total"] == 0 and s["queues"]["rendering"] == 0
    assert len(acked) == len(set(acked))  # no render acknowledged as expected twice


async def test_broadcasts_handled_in_one_loop_turn_share_a_commit(tmp_path):
    from services.tiles.queuemaster.commands import expire_broadcast

    qm = make_qm(tmp_path)
    qm.commits.start()
    before = qm.commits.commits
    outcomes = await asyncio.gather(expire_broadcast(qm, "10/0/0;10/8/8"), expire_broadcast(qm, b"10/16/16"))
    assert [o["queued"] for o in outcomes] == [2, 1]
    assert qm.commits.commits == before + 1 and len(rows_on_disk(tmp_path / "q.sqlite")) == 3  # acked: on disk
    qm.close()
