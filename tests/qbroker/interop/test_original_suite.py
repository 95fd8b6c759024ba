"""The original QBroker's own test suite, run beside a qbroker unit, fails nothing it does not fail alone."""

from __future__ import annotations

import asyncio
import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from harness import HANG
from harness.broker import create_vhost, delete_vhost, url_for_vhost
from harness.original_qbroker import original_source
from tests.conftest import MakeUnit
from tests.qbroker.interop.conftest import original_env, original_settings


def suite_copy(base: Path, url: str) -> Path:
    """The original's tree with a test.cfg for ``url`` (its suite reads test.cfg from its working directory and
    writes test.log there, so it runs in a copy)."""
    tree = base / "trio_qbroker"
    shutil.copytree(original_source(), tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "test.log"))
    server = original_settings(url, "unused")
    (tree / "test.cfg").write_text(
        "config:\n  amqp:\n    server:\n"
        f"      host: {server['host']}\n      port: {server['port']}\n      login: {server['login']}\n"
        f"      password: {server['password']}\n      virtualhost: {server['vhost']}\n"
        "    handlers:\n      dead: 1\n      debug: 1\n"
    )
    return tree


async def run_suite(python: Path, tree: Path, *tests: str) -> tuple[set[str], str]:
    """Run (some of) its suite in ``tree``; the ids of the tests that failed or errored, and its output's end.
    Asynchronously: the qbroker unit beside it lives in this event loop."""
    report = tree / f"junit-{len(list(tree.glob('junit-*.xml')))}.xml"
    proc = await asyncio.create_subprocess_exec(
        str(python),
        "-m",
        "pytest",
        *(tests or ("tests",)),
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
        cwd=tree,
        env={**original_env(), "PYTHONPATH": str(tree)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 10 * HANG)
    failed = set()
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(f"{case.get('classname')}::{case.get('name')}")
    return failed, output.decode(errors="replace")[-4000:]


def node_id(case: str) -> str:
    """tests.test_unit::test_rpc_basic -> tests/test_unit.py::test_rpc_basic"""
    module, name = case.split("::")
    return f"{module.replace('.', '/')}.py::{name}"


async def test_its_own_suite_beside_a_qbroker_unit(
    peer_python: Path, tmp_path: Path, qbroker_units: MakeUnit, fresh_url: str
) -> None:
    alone_vhost = create_vhost("qbroker-interop-alone")
    try:
        alone, alone_output = await run_suite(peer_python, suite_copy(tmp_path / "alone", url_for_vhost(alone_vhost)))
    finally:
        delete_vhost(alone_vhost)
    unit = await qbroker_units("qb.beside")  # every unit collects dead letters, answers pings, listens

    @unit.rpc("qb.beside.echo")
    async def echo(body: Any = None) -> Any:
        return body

    @unit.on_alert("#")
    async def everything(body: Any = None) -> None:
        return None

    await unit.start()
    tree = suite_copy(tmp_path / "beside", fresh_url)
    beside, output = await run_suite(peer_python, tree)
    assert len(alone) <= 4, alone_output  # on Python 3.11 two of its tests assert 3.6's error wording
    # Its tests wait on the clock (half a second; test_alert_durable1 fails one run in four alone on a busy
    # machine): one that failed here but not alone is run again by itself, beside the unit, up to three times.
    for case in sorted(beside - alone):
        for _ in range(3):
            again, rerun_output = await run_suite(peer_python, tree, node_id(case))
            if not again:
                break
        assert not again, f"{case} fails beside a qbroker unit, not alone:\n{output}\n{rerun_output}"
