"""The Spark bridge's jobs on the live status page, and toposm-web's polls of it in /metrics (a real bridge on
local Spark)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from tests.services.spark_bridge.conftest import bridge, spark  # noqa: F401 - the bridge's own fixtures
from tests.services.tiles.conftest import TileBus
from tests.services.web.conftest import start_web, wait_for

pytestmark = pytest.mark.usefixtures("bridge")
VIEWER_ZONE = "Asia/Kolkata"


async def test_jobs_show_on_the_page_and_in_metrics(
    amqp_url: str, make_unit: Any, browser: Any, tmp_path: Path
) -> None:
    tb = TileBus(amqp_url, tmp_path)  # toposm-web on the bridge's vhost; no tile services needed here
    web = start_web(tb)
    try:
        # The viewer is in India (UTC+05:30, no daylight saving): the page shows times in the viewer's zone.
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": VIEWER_ZONE})
        await asyncio.to_thread(browser.get, web.url + "/")
        await wait_for(browser, "document.body.dataset.version !== '-1'")
        log = tmp_path / "render.log"
        log.write_text(
            "".join(
                json.dumps(
                    {
                        "metatile": "9/0/0",
                        "zoom": 9,
                        "renderer": "toposm.render.h.1.1",
                        "start": 1000.0 + i,
                        "duration": 1.0,
                        "status": "ok",
                    }
                )
                + "\n"
                for i in range(10)
            )
        )
        client = await make_unit("test.web.spark.client")
        await client.start()
        job = await client.call("spark.stats", {"paths": [str(log)], "wait": True, "window_seconds": 5}, timeout=120)
        short = job["job_id"][:12]
        row = await wait_for(
            browser,
            "[...document.querySelectorAll('#jobs tr')].map(tr => tr.textContent)"
            f".find(t => t.startsWith('{short}') && t.includes('succeeded'))",
        )
        assert "stats" in row
        # Its final phase, not the last step it was in ("writing"), and when it finished, in local time.
        status = await client.call("spark.job", {"command": "status", "job_id": job["job_id"]})
        assert status["phase"] == "done"
        finished = datetime.fromtimestamp(status["finished_at"], ZoneInfo(VIEWER_ZONE)).strftime("%H:%M:%S")
        cells = await wait_for(
            browser,
            "(() => { const tr = [...document.querySelectorAll('#jobs tr')].find("
            f"tr => tr.textContent.startsWith('{short}'));"
            " const c = [...tr.children].map(td => td.textContent);"
            " return c[5].startsWith('finished') && c; })()",
        )
        assert cells[2:4] == ["succeeded", "done"], cells
        assert re.fullmatch(f"finished {finished} " + r"(just now|\d+ s ago)", cells[5]), cells

        # /metrics has toposm-web's polls of the bridge; the jobs are the bridge's own figures (spark_bridge_jobs,
        # on its --metrics-port), not repeated here under another name (docs/metrics.md).
        async with aiohttp.ClientSession() as session, session.get(web.url + "/metrics") as response:
            text = await response.text()
        assert re.search(r'^toposm_web_rpc_calls_total\{endpoint="spark.job",status="ok"\} [1-9]', text, re.MULTILINE)
        assert not re.search(r"^spark_", text, re.MULTILINE)
    finally:
        for proc in tb.procs:
            with contextlib.suppress(Exception):
                proc.stop()
