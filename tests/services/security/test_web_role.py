"""``toposm-web`` under its own broker role: the documented deployment gave it ``client``, with
which it could not start (ACCESS_REFUSED binding ``expire_toposm`` on ``alert``). The real process, the
real queuemaster, each with its provisioned account."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from harness import eventually
from harness.provisioned import HOST, Provisioned
from tests.services.tiles.conftest import TileBus
from tests.services.web.conftest import start_web


async def get_json(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url) as response:
        assert response.status == 200, await response.text()
        result: dict = await response.json()
        return result


async def test_web_starts_and_works_under_its_own_role(
    provisioned: Provisioned, as_role, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tb = TileBus(f"amqp://{HOST}/{provisioned.deployment.vhost}", tmp_path)
    for key, value in provisioned.service_env.items():
        monkeypatch.setenv(key, value)

    def account(role: str) -> None:
        monkeypatch.setenv("QBROKER_USERNAME", provisioned.names[role])
        monkeypatch.setenv("QBROKER_PASSWORD_FILE", str(provisioned.passwords[role]))

    try:
        account("queuemaster")
        tb.queuemaster()
        account("web")
        web = start_web(tb)
        async with aiohttp.ClientSession() as session:

            async def online() -> dict | None:
                status = await get_json(session, web.url + "/api/status")
                return status if status["queuemaster"]["online"] else None

            await eventually(online)  # stats answered
            # the map's re-render: expire (TOPOSM_EXPIRE_USERS names the web account) and render
            async with session.post(web.url + "/api/render", json={"tile": "6/8/8"}) as response:
                assert response.status == 202, await response.text()
            # expirations the bridge publishes reach the overlay (the binding the client role was refused)
            bridge = await as_role("spark_bridge", app="spark.bridge")
            await bridge.alert("expire_toposm", "6/16/16", content_type="text/plain")

            async def overlaid() -> bool:
                overlay = await get_json(session, web.url + "/api/overlay")
                return any((m["z"], m["mx"], m["my"]) == (6, 2, 2) for m in overlay["metatiles"])

            await eventually(overlaid)
        os.killpg(web.proc.pid, signal.SIGTERM)
        assert await asyncio.to_thread(web.proc.popen.wait, 30) == 0
        log = web.proc.log.read_text()
        assert "ACCESS_REFUSED" not in log and "forbidden" not in log, log[-3000:]
    finally:
        for proc in reversed(tb.procs):
            proc.stop()
