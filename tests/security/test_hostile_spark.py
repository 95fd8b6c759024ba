"""The issue's Spark bridge attacks, by a client account against a bridge running as its own account.

tests/spark_bridge/test_spark_confinement.py covers each rule in detail; this is the attack list of
issue 10 as a hostile client would try it, with the provisioned accounts.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from qbroker import RequestFailed
from services.spark_bridge.service import SparkBridge
from tests.spark_bridge.conftest import spark  # noqa: F401 - the Spark suite's shared session

HANG = 120.0


@pytest.fixture
async def bridge(as_role, provisioned, spark, tmp_path) -> AsyncIterator[SparkBridge]:  # noqa: F811 - fixture use
    unit = await as_role("spark_bridge", app="spark.bridge", start=False)
    root = tmp_path / "inputs"
    root.mkdir()
    service = SparkBridge(unit, spark, tmp_path / "state", max_jobs=1, input_roots=[root],
                          operator_users=frozenset({provisioned.names["operator"]}))
    await unit.start()
    yield service
    await service.close()


async def test_client_cannot_read_probe_or_exhaust_the_bridge_host(bridge, as_role, tmp_path) -> None:
    client = await as_role("client")
    root = bridge.input_roots.roots[0]
    os.mkfifo(root / "fifo.list")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    answers: dict[str, RequestFailed] = {}
    for label, body in {
        "passwd": {"paths": ["/etc/passwd"]},
        "missing": {"paths": ["/etc/does-not-exist"]},
        "dev_zero": {"paths": ["/dev/zero"]},
        "fifo": {"paths": ["fifo.list"]},
        "slash": {"paths": ["/"]},
        "dotdot": {"paths": ["../../../../etc/passwd"]},
        "huge_guard": {"paths": ["x.list"], "max_tiles": 10**12},
    }.items():
        with pytest.raises(RequestFailed) as info:
            await client.call("spark.expire", body, timeout=HANG)
        answers[label] = info.value
    for label, error_id in {"passwd": "input_not_allowed", "missing": "input_not_allowed",
                            "dev_zero": "input_not_allowed", "fifo": "bad_input_type", "slash": "input_not_allowed",
                            "dotdot": "input_not_allowed", "huge_guard": "over_limit"}.items():
        assert answers[label].id == error_id and answers[label].status == "fail", (label, answers[label])
    assert "root:" not in str(answers["passwd"])
    # existing vs missing outside the roots: indistinguishable
    assert answers["passwd"].detail.replace("/etc/passwd", "") == \
        answers["missing"].detail.replace("/etc/does-not-exist", "")
    (root / "render.log").write_text('{"metatile": "9/0/0", "zoom": 9, "renderer": "r", "start": 1.0, '
                                     '"duration": 1.0, "status": "ok"}\n')
    with pytest.raises(RequestFailed) as info:
        await client.call("spark.stats", {"paths": ["render.log"], "output_dir": str(outside)}, timeout=HANG)
    assert info.value.id == "bad_output_name"
    assert list(outside.iterdir()) == [] and not Path("/anywhere").exists()


async def test_jobs_belong_to_the_account_that_submitted_them(bridge, as_role, provisioned) -> None:
    """Issue 20 item 6: a client sees and cancels only its own jobs; an operator sees and cancels all."""
    client, operator = await as_role("client"), await as_role("operator")
    root = bridge.input_roots.roots[0]
    (root / "mine.list").write_text("10/0/0\n")
    (root / "ops-secret-name.list").write_text("10/1/1\n")
    body = {"publish": False, "wait": True}
    theirs = await operator.call("spark.expire", {**body, "paths": ["ops-secret-name.list"]}, timeout=HANG)
    mine = await client.call("spark.expire", {**body, "paths": ["mine.list"]}, timeout=HANG)
    assert theirs["owner"] == provisioned.names["operator"] and mine["owner"] == provisioned.names["client"]

    listed = await client.call("spark.job", {"command": "list"}, timeout=HANG)
    assert [job["job_id"] for job in listed["jobs"]] == [mine["job_id"]]
    for command in ("status", "progress", "result", "log", "cancel"):
        with pytest.raises(RequestFailed) as info:
            await client.call("spark.job", {"command": command, "job_id": theirs["job_id"]}, timeout=HANG)
        # the same answer as for a job that does not exist: nothing about it, not even that it exists
        assert info.value.id == "unknown_job", (command, info.value)
        assert "ops-secret-name" not in str(info.value)
    status = await client.call("spark.job", {"command": "status", "job_id": mine["job_id"]}, timeout=HANG)
    assert status["params"]["paths"] == ["mine.list"]

    everything = await operator.call("spark.job", {"command": "list"}, timeout=HANG)
    assert {job["job_id"] for job in everything["jobs"]} == {mine["job_id"], theirs["job_id"]}
    for command in ("status", "log", "cancel"):
        await operator.call("spark.job", {"command": command, "job_id": mine["job_id"]}, timeout=HANG)
    # the ids survive a restart of the bridge: ownership is persisted with the record
    assert bridge.manager.store.load_all()[0].owner in set(provisioned.names.values())
