"""The bridge confined to its data (docs/security.md): each attack a caller can make with a path or a number, over
the real broker, answered ``fail`` with a stable id and a message that leaks nothing."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness import eventually
from qbroker import QBrokerError, RequestError, RequestFailed
from services.spark_bridge.limits import BridgeLimits
from services.spark_bridge.main import parse_args
from services.spark_bridge.service import SparkBridge
from services.spark_bridge.spark_session import classic_conf

CALL = 120.0
SECRET = "TOPSECRET-d41d8cd98f00"


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """(input root, a sibling directory outside it holding a secret file)."""
    root = tmp_path / "inputs"
    outside = tmp_path / "private"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.list").write_text(f"{SECRET}\n")
    return root, outside


@pytest.fixture
async def tight(make_unit, spark, tmp_path, dirs):
    root, _ = dirs
    unit = await make_unit("spark.bridge")
    limits = BridgeLimits(max_tiles=5_000, max_tiles_per_geometry=2_000, max_pending_jobs=1, keep_jobs=2)
    service = SparkBridge(
        unit, spark, tmp_path / "state", max_jobs=1, progress_interval=0.3, input_roots=[root], limits=limits
    )
    await unit.start()
    yield service
    await service.close()


async def finished(client, job_id: str) -> dict:
    async def status() -> dict:
        return await client.call("spark.job", {"command": "status", "job_id": job_id})

    async def ended() -> dict | None:
        record = await status()
        return None if record["state"] in ("queued", "running") else record

    result: dict = await eventually(ended, CALL, 0.2)  # a hang-only ceiling
    return result


async def refused(client, name: str, body: dict) -> RequestFailed:
    with pytest.raises(RequestFailed) as info:
        await client.call(name, body, timeout=CALL)
    assert info.value.status == "fail"
    assert SECRET not in str(info.value)
    return info.value


async def test_paths_outside_the_roots_are_refused_alike(tight, client, dirs) -> None:
    root, outside = dirs
    os.symlink(outside / "secret.list", root / "link.list")
    os.symlink(outside / "no-such.list", root / "dangling.list")  # a link to a missing file outside
    (root / "sub").mkdir()
    existing = await refused(client, "spark.expire", {"paths": ["/etc/passwd"]})
    missing = await refused(client, "spark.expire", {"paths": ["/etc/no-such-file-here"]})
    # Whether a path outside exists is not revealed: same id, same words around the caller's own string.
    assert existing.id == missing.id == "input_not_allowed"
    assert existing.detail.replace("/etc/passwd", "P") == missing.detail.replace("/etc/no-such-file-here", "P")
    assert "root:" not in str(existing)
    for path in (
        str(root / ".." / "private" / "secret.list"),
        str(root / "sub" / ".." / ".." / "private"),
        str(root / "link.list"),
        "dangling.list",
        "../private/secret.list",
        "/",
        "/dev/zero",
        str(outside),
    ):
        err = await refused(client, "spark.expire", {"paths": [path]})
        assert err.id == "input_not_allowed", (path, err.message)


async def test_only_regular_files_and_parquet_directories(tight, client, dirs) -> None:
    root, _ = dirs
    os.mkfifo(root / "pipe.list")
    os.symlink("/dev/zero", root / "zero.list")
    (root / "plain").mkdir()
    table = pa.table({"lon": [2.35], "lat": [48.85]})
    good = root / "points.parquet"
    good.mkdir()
    pq.write_table(table, good / "part-0.parquet")
    sneaky = root / "sneaky.parquet"
    sneaky.mkdir()
    pq.write_table(table, sneaky / "part-0.parquet")
    os.symlink("/etc", sneaky / "etc")
    cases = {
        "pipe.list": "bad_input_type",
        "zero.list": "input_not_allowed",
        "plain": "bad_input_type",
        "sneaky.parquet": "bad_input_type",
        str(root): "bad_input_type",
        "missing.osc": "no_such_input",
    }
    for name, error_id in cases.items():
        err = await refused(client, "spark.expire", {"paths": [name]})  # relative: from the first root
        assert err.id == error_id, (name, err.message)
    # the FIFO was never opened (it would have blocked a worker thread forever): the bridge still answers
    ok = await client.call(
        "spark.expire",
        {"paths": ["points.parquet"], "min_zoom": 12, "max_zoom": 13, "publish": False, "wait": True},
        timeout=CALL,
    )
    assert ok["state"] == "succeeded" and ok["result"]["total_tiles"] > 0


async def test_a_character_device_inside_a_root_is_no_input(tight, client, dirs) -> None:
    """A character device (/dev/zero's numbers) inside a root, where a reader would block or read forever.
    Making one needs CAP_MKNOD: without it the case is skipped, and says so."""
    root, _ = dirs
    try:
        os.mknod(root / "dev.list", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("mknod of a character device needs CAP_MKNOD, which this process lacks")
    err = await refused(client, "spark.expire", {"paths": ["dev.list"]})
    assert err.id == "bad_input_type", err.message


async def test_errors_never_quote_file_contents(tight, client, dirs) -> None:
    root, _ = dirs
    (root / "head.list").write_text(f"{SECRET}\n")
    (root / "later.list").write_text(f"12/1/1\n12/{SECRET}/2\n")
    (root / "head.csv").write_text(f"{SECRET},x\n1,2\n")
    for name in ("head.list", "head.csv"):
        err = await refused(client, "spark.expire", {"paths": [name]})
        assert err.id == "bad_input" and name in err.detail
    with pytest.raises(RequestFailed) as info:  # found by the job, not at submit time
        await client.call("spark.expire", {"paths": ["later.list"], "wait": True}, timeout=CALL)
    assert info.value.id == "job_failed" and "later.list" in info.value.detail
    assert SECRET not in str(info.value)


async def test_stats_output_is_a_name_under_the_state_dir(tight, client, dirs, tmp_path) -> None:
    root, outside = dirs
    log = root / "render.log"
    log.write_text(
        '{"metatile": "9/0/0", "zoom": 9, "renderer": "toposm.render.h.1.1", "start": 1000.0, '
        '"duration": 1.0, "status": "ok"}\n'
    )
    for bad in (str(outside), "../x", "a/b", "..", ".hidden", ""):
        err = await refused(client, "spark.stats", {"paths": ["render.log"], "output_dir": bad})
        assert err.id == "bad_output_name", (bad, err.message)
    (tight.state_dir / "outputs").mkdir(parents=True, exist_ok=True)
    os.symlink(outside, tight.state_dir / "outputs" / "linked")
    err = await refused(client, "spark.stats", {"paths": ["render.log"], "output_dir": "linked"})
    assert err.id == "bad_output_name"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.list"]  # nothing written outside
    reply = await client.call(
        "spark.stats", {"paths": ["render.log"], "output_dir": "daily", "wait": True}, timeout=CALL
    )
    assert Path(reply["result"]["outputs"]["json"]) == tight.state_dir / "outputs" / "daily" / "stats.json"
    err = await refused(client, "spark.stats", {"paths": ["/etc/passwd"]})
    assert err.id == "input_not_allowed"


async def test_guards_have_ceilings_checked_before_the_expensive_stages(tight, client, dirs) -> None:
    root, _ = dirs
    err = await refused(client, "spark.expire", {"paths": ["x.list"], "max_tiles": 10**9})
    assert err.id == "over_limit" and "5000" in err.detail
    err = await refused(client, "spark.expire", {"paths": ["x.list"], "max_tiles_per_geometry": 10**9})
    assert err.id == "over_limit"
    # 20 000 distinct tiles at max zoom: over the ceiling of 5 000 without any propagation.
    (root / "many.list").write_text("".join(f"14/{x}/{y}\n" for x in range(200) for y in range(100)))
    submitted = await client.call("spark.expire", {"paths": ["many.list"], "min_zoom": 4, "max_zoom": 14})
    record = await finished(client, submitted["job_id"])
    assert record["state"] == "failed" and "estimated before propagation" in record["error"]
    # It stopped at the estimate: the propagation and metatile stages never ran.
    assert record["phase"] == "estimating"
    assert record["counters"]["estimated_tiles"] == 20_000 and "metatiles" not in record["counters"]
    # One z0 tile at min_zoom 8 is 65 536 tiles: refused before the explosion is planned.
    (root / "low.list").write_text("0/0/0\n")
    with pytest.raises(RequestFailed) as info:
        await client.call(
            "spark.expire",
            {"paths": ["low.list"], "min_zoom": 8, "max_zoom": 8, "max_tiles_per_geometry": 2_000, "wait": True},
            timeout=CALL,
        )
    assert "max_tiles_per_geometry" in info.value.detail
    # 128 z5 tiles at min_zoom 8: 64 tiles each (within the per-geometry guard), 8 192 in all (over max_tiles).
    (root / "lows.list").write_text("".join(f"5/{x}/{y}\n" for x in range(32) for y in range(4)))
    submitted = await client.call("spark.expire", {"paths": ["lows.list"], "min_zoom": 8, "max_zoom": 8})
    record = await finished(client, submitted["job_id"])
    assert record["state"] == "failed" and "estimated before expanding" in record["error"]
    assert record["phase"] == "reading" and "estimated_tiles" not in record["counters"]


async def test_too_many_jobs_is_busy_and_old_records_are_pruned(tight, client, dirs) -> None:
    root, _ = dirs
    (root / "x.list").write_text("12/1/1\n")
    release = threading.Event()

    def blocked(job) -> dict:
        release.wait(timeout=120)  # a hang-only ceiling: the test releases it
        return {}

    holder = tight.manager.submit("test", {}, blocked)
    try:
        with pytest.raises(RequestError) as info:
            await client.call("spark.expire", {"paths": ["x.list"]}, timeout=CALL)
        assert info.value.id == "busy" and info.value.status == "error"
    finally:
        release.set()
    await tight.manager.wait(holder.job_id, 120)
    done = [holder.job_id]
    for _ in range(3):
        reply = await client.call("spark.expire", {"paths": ["x.list"], "publish": False, "wait": True}, timeout=CALL)
        done.append(reply["job_id"])
    tight.manager.prune()
    kept = {j["job_id"] for j in (await client.call("spark.job", {"command": "list"}))["jobs"]}
    assert kept == set(done[-2:])  # keep_jobs=2: the two newest finished ones
    on_disk = {p.stem for p in (tight.state_dir / "jobs").glob("*.json")}
    assert on_disk == kept and not (tight.state_dir / "jobs" / f"{done[0]}.log").exists()
    # and by age: a week and a bit later nothing finished is left
    assert set(tight.manager.prune(now=time.time() + 8 * 86_400)) == kept
    with pytest.raises(QBrokerError) as gone:
        await client.call("spark.job", {"command": "status", "job_id": done[-1]})
    assert gone.value.id == "unknown_job"


def test_spark_ui_is_off_unless_asked(tmp_path: Path) -> None:
    assert classic_conf()["spark.ui.enabled"] == "false"
    assert classic_conf(ui=True)["spark.ui.enabled"] == "true"
    assert classic_conf({"spark.ui.enabled": "true"})["spark.ui.enabled"] == "true"  # an explicit --conf wins
    args = parse_args(["--state-dir", str(tmp_path)])
    assert args.spark_ui is False and args.input_root == []
    assert parse_args(["--state-dir", str(tmp_path), "--spark-ui"]).spark_ui is True
