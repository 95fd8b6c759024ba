"""Job manager without the bus: persistence across restarts, failures, batching."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.spark_bridge.job_state import RESTARTED_REASON, JobRecord, JobState, JobStore
from services.spark_bridge.jobs import JobManager
from services.toposm.expiry_wires import ExpirationBatcher


async def test_finished_jobs_survive_restart_and_running_ones_fail(spark, tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = JobManager(spark, state, max_jobs=1)
    ok = first.submit("expire", {"n": 1}, lambda ctx: {"rows": ctx.spark.range(10).count()})
    bad = first.submit("stats", {}, lambda ctx: (_ for _ in ()).throw(ValueError("no usable render records")))
    await first.wait(ok.job_id, timeout=60)
    await first.wait(bad.job_id, timeout=60)
    assert ok.state is JobState.SUCCEEDED and ok.result == {"rows": 10}
    assert bad.state is JobState.FAILED and bad.error == "no usable render records"
    # A record left "running" by a crash.
    JobStore(state).save(
        JobRecord(job_id="crashed1", kind="expire", params={}, submitted_at=time.time(), state=JobState.RUNNING)
    )
    second = JobManager(spark, state, max_jobs=1)
    assert second.get(ok.job_id).result == {"rows": 10}
    assert second.get(bad.job_id).state is JobState.FAILED
    crashed = second.get("crashed1")
    assert crashed.state is JobState.FAILED and crashed.error == RESTARTED_REASON
    assert [r.job_id for r in second.list_jobs(state=JobState.FAILED, kind="expire")] == ["crashed1"]
    assert second.log_tail(ok.job_id, 1)[0].endswith("succeeded")
    # and it is persisted as failed, not re-failed on every start
    assert JobManager(spark, state).get("crashed1").finished_at == crashed.finished_at


def test_batcher_caps() -> None:
    sent: list[str] = []
    batcher = ExpirationBatcher(sent.append, max_bytes=40, max_tiles=3)
    for i in range(10):
        batcher.add(f"18/{1000 + i}/2000")
    batcher.flush()
    assert all(len(m) <= 40 and m.count(";") <= 2 for m in sent)
    assert ";".join(sent).split(";") == [f"18/{1000 + i}/2000" for i in range(10)]
    assert batcher.messages_sent == len(sent) and batcher.tiles_sent == 10
    with pytest.raises(ValueError):
        ExpirationBatcher(sent.append, max_bytes=10)
