"""The Spark bridge attacks, by a client account against a bridge running as its own account.

tests/services/spark_bridge/test_spark_confinement.py covers each rule in detail; this is the attack list of
docs/security.md as a hostile client would try it, with the provisioned accounts.
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness import HANG, eventually
from qbroker import RequestFailed
from qbroker.cli.progress import progress_pattern
from services.spark_bridge.limits import BridgeLimits
from services.spark_bridge.service import SparkBridge
from services.toposm.contract import SPARK_EXPIRE
from services.web.collector import PROGRESS_PATTERN
from tests.services.spark_bridge.conftest import spark  # noqa: F401 - the Spark suite's shared session

JOB_HANG = 2 * HANG  # a Spark job through the bus


@pytest.fixture
async def bridge(as_role, provisioned, spark, tmp_path) -> AsyncIterator[SparkBridge]:  # noqa: F811 - fixture use
    unit = await as_role("spark_bridge", app="spark.bridge", start=False)
    root = tmp_path / "inputs"
    root.mkdir()
    service = SparkBridge(
        unit,
        spark,
        tmp_path / "state",
        max_jobs=1,
        input_roots=[root],
        operator_users=frozenset({provisioned.names["operator"]}),
    )
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
            await client.call("spark.expire", body, timeout=JOB_HANG)
        answers[label] = info.value
    for label, error_id in {
        "passwd": "input_not_allowed",
        "missing": "input_not_allowed",
        "dev_zero": "input_not_allowed",
        "fifo": "bad_input_type",
        "slash": "input_not_allowed",
        "dotdot": "input_not_allowed",
        "huge_guard": "over_limit",
    }.items():
        assert answers[label].id == error_id and answers[label].status == "fail", (label, answers[label])
    assert "root:" not in str(answers["passwd"])
    # existing vs missing outside the roots: indistinguishable
    assert answers["passwd"].detail.replace("/etc/passwd", "") == answers["missing"].detail.replace(
        "/etc/does-not-exist", ""
    )
    (root / "render.log").write_text(
        '{"metatile": "9/0/0", "zoom": 9, "renderer": "r", "start": 1.0, "duration": 1.0, "status": "ok"}\n'
    )
    with pytest.raises(RequestFailed) as info:
        await client.call("spark.stats", {"paths": ["render.log"], "output_dir": str(outside)}, timeout=JOB_HANG)
    assert info.value.id == "bad_output_name"
    assert list(outside.iterdir()) == [] and not Path("/anywhere").exists()


async def test_jobs_belong_to_the_account_that_submitted_them(bridge, as_role, provisioned) -> None:
    """A client sees and cancels only its own jobs; an operator sees and cancels all."""
    client, operator = await as_role("client"), await as_role("operator")
    root = bridge.input_roots.roots[0]
    (root / "mine.list").write_text("10/0/0\n")
    (root / "ops-secret-name.list").write_text("10/1/1\n")
    body = {"publish": False, "wait": True}
    theirs = await operator.call("spark.expire", {**body, "paths": ["ops-secret-name.list"]}, timeout=JOB_HANG)
    mine = await client.call("spark.expire", {**body, "paths": ["mine.list"]}, timeout=JOB_HANG)
    assert theirs["owner"] == provisioned.names["operator"] and mine["owner"] == provisioned.names["client"]

    listed = await client.call("spark.job", {"command": "list"}, timeout=JOB_HANG)
    assert [job["job_id"] for job in listed["jobs"]] == [mine["job_id"]]
    for command in ("status", "progress", "result", "log", "cancel"):
        with pytest.raises(RequestFailed) as info:
            await client.call("spark.job", {"command": command, "job_id": theirs["job_id"]}, timeout=JOB_HANG)
        # the same answer as for a job that does not exist: nothing about it, not even that it exists
        assert info.value.id == "unknown_job", (command, info.value)
        assert "ops-secret-name" not in str(info.value)
    status = await client.call("spark.job", {"command": "status", "job_id": mine["job_id"]}, timeout=JOB_HANG)
    assert status["params"]["paths"] == ["mine.list"]

    everything = await operator.call("spark.job", {"command": "list"}, timeout=JOB_HANG)
    assert {job["job_id"] for job in everything["jobs"]} == {mine["job_id"], theirs["job_id"]}
    for command in ("status", "log", "cancel"):
        await operator.call("spark.job", {"command": command, "job_id": mine["job_id"]}, timeout=JOB_HANG)
    # the ids survive a restart of the bridge: ownership is persisted with the record
    assert bridge.manager.store.load_all()[0].owner in set(provisioned.names.values())


SECRET = "SECRET-" + "x" * 2000
OSC_HEAD = b'<?xml version="1.0"?>\n<osmChange version="0.6" generator="test">\n<create>\n'
OSC_TAIL = b"</create>\n</osmChange>\n"


def _job_id(error: RequestFailed) -> str:
    found = re.search(r"job ([0-9a-f]{16})", str(error))
    assert found is not None, str(error)
    return found[1]


def _node(lat: str = "60.17") -> bytes:
    return f'<node id="1" version="1" lat="{lat}" lon="24.94"/>\n'.encode()


async def test_job_errors_name_the_file_and_problem_never_the_content(bridge, as_role) -> None:
    """A value of the input is never quoted back, in the reply, the record or the log."""
    client = await as_role("client")
    root = bridge.input_roots.roots[0]
    (root / "coord.osc").write_bytes(OSC_HEAD + _node() + _node(SECRET) + OSC_TAIL)
    (root / "xml.osc").write_bytes(OSC_HEAD + _node() + f'<node id="2" {SECRET} />\n'.encode() + OSC_TAIL)
    (root / "lines.list").write_text(f"10/0/0\n{SECRET}\n")
    expected = {
        "coord.osc": "coord.osc: unparsable osmChange: wrong format for coordinate",
        "xml.osc": "xml.osc: unparsable osmChange: not well-formed XML at line 5",
        "lines.list": "lines.list: a line is not z/x/y within the zoom limit (line 2)",
    }
    for name, wanted in expected.items():
        with pytest.raises(RequestFailed) as info:
            await client.call("spark.expire", {"paths": [name], "publish": False, "wait": True}, timeout=JOB_HANG)
        text = str(info.value)
        assert wanted in text and "SECRET" not in text, text
        job_id = _job_id(info.value)
        status = await client.call("spark.job", {"command": "status", "job_id": job_id}, timeout=JOB_HANG)
        log = await client.call("spark.job", {"command": "log", "job_id": job_id, "lines": 1000}, timeout=JOB_HANG)
        assert "SECRET" not in status["error"] and "SECRET" not in "".join(log["lines"])


def _bomb(path: Path, nodes: int, per_member: int = 10_000) -> int:
    """A .osc.gz of ``nodes`` nodes that is small on disk: the same gzip member again and again (a valid
    gzip stream). Returns its decompressed size."""
    body = _node() * per_member
    member = gzip.compress(body)
    with path.open("wb") as fh:
        fh.write(gzip.compress(OSC_HEAD))
        for _ in range(nodes // per_member):
            fh.write(member)
        fh.write(gzip.compress(OSC_TAIL))
    return len(OSC_HEAD) + len(body) * (nodes // per_member) + len(OSC_TAIL)


async def test_oversized_input_is_refused_naming_the_limit(bridge, as_role) -> None:
    """Caps on decompressed bytes and objects per job, the limit named in the error."""
    client = await as_role("client")
    root = bridge.input_roots.roots[0]
    size = _bomb(root / "many.osc.gz", 50_000)
    bridge.limits = BridgeLimits(max_input_objects=20_000)
    with pytest.raises(RequestFailed) as info:
        await client.call("spark.expire", {"paths": ["many.osc.gz"], "publish": False, "wait": True}, timeout=JOB_HANG)
    assert "many.osc.gz" in str(info.value) and "max_input_objects=20000" in str(info.value), str(info.value)
    bridge.limits = BridgeLimits(max_input_bytes=size // 10)
    with pytest.raises(RequestFailed) as info:
        await client.call("spark.expire", {"paths": ["many.osc.gz"], "publish": False, "wait": True}, timeout=JOB_HANG)
    assert f"max_input_bytes={size // 10}" in str(info.value), str(info.value)
    job_id = _job_id(info.value)
    status = await client.call("spark.job", {"command": "status", "job_id": job_id}, timeout=JOB_HANG)
    # refused while counting the bytes, before libosmium parsed any of it
    assert status["counters"].get("input_objects", 0) == 0 and "osc_nodes" not in status["counters"]


async def test_cancel_takes_effect_while_the_input_is_read(bridge, as_role) -> None:
    """Cancel is checked while reading; it does not wait for a 20-million-node file."""
    client = await as_role("client")
    root = bridge.input_roots.roots[0]
    size = _bomb(root / "huge.osc.gz", 20_000_000)
    bridge.limits = BridgeLimits(max_input_objects=10**9, max_input_bytes=10**12)
    submitted = await client.call("spark.expire", {"paths": ["huge.osc.gz"], "publish": False}, timeout=JOB_HANG)
    job = {"command": "progress", "job_id": submitted["job_id"]}

    async def reading() -> bool:
        progress = await client.call("spark.job", job, timeout=JOB_HANG)
        return progress["phase"] == "reading" and progress["counters"].get("input_bytes", 0) > 0

    await eventually(reading, timeout=JOB_HANG)
    cancelled = await client.call("spark.job", {"command": "cancel", "job_id": submitted["job_id"]}, timeout=JOB_HANG)
    assert cancelled["state"] == "cancelled"
    status = await client.call("spark.job", {**job, "command": "status"}, timeout=JOB_HANG)
    assert status["phase"] == "reading" and status["counters"]["input_bytes"] < size


async def test_a_client_hears_the_progress_of_its_own_jobs_only(bridge, as_role, provisioned) -> None:
    """Progress alerts are named after the job's owner (qbroker.progress), so the broker lets a
    client bind its own jobs' progress only (as `qbroker call` does while it waits); operators and toposm-web's
    status page hear every job's."""
    heard: dict[str, set[str]] = {"client": set(), "operator": set(), "web": set()}
    units = {}
    for role, hears in heard.items():
        unit = await as_role(role, start=False)
        pattern = progress_pattern(SPARK_EXPIRE, unit.bus.supervisor.user) if role == "client" else PROGRESS_PATTERN

        @unit.on_alert(pattern)
        async def on_progress(body: dict, hears: set[str] = hears) -> None:
            hears.add(body["job_id"])

        await unit.start()
        units[role] = unit
    (bridge.input_roots.roots[0] / "some.list").write_text("10/0/0\n")
    body = {"publish": False, "wait": True, "paths": ["some.list"]}
    theirs = (await units["operator"].call(SPARK_EXPIRE, body, timeout=JOB_HANG))["job_id"]
    mine = (await units["client"].call(SPARK_EXPIRE, body, timeout=JOB_HANG))["job_id"]
    # the last alert of each job follows its end; the operator's job's alerts went out before the client's
    await eventually(lambda: mine in heard["client"] and heard["operator"] == heard["web"] == {mine, theirs})
    assert heard["client"] == {mine}
