"""What the demo waits for and measures: a service answering, the render queue drained, toposm-web up, the
pixels an edit changed. Each wait has a generous ceiling and names what did not happen."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from qbroker import QBrokerError, Unit
from services.toposm.contract import QUEUEMASTER


async def wait_until_answering(unit: Unit, name: str, body: dict[str, Any], within: float) -> Any:
    deadline = time.monotonic() + within
    while True:
        try:
            return await unit.call(name, body, timeout=5)
        except QBrokerError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def wait_queue_empty(unit: Unit, within: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        stats: dict[str, Any] = await unit.call(QUEUEMASTER, {"command": "stats"})
        if not stats["queues"]["total"] and not stats["queues"]["rendering"]:
            return stats
        if time.monotonic() > deadline:
            raise TimeoutError("the render queue did not drain")
        await asyncio.sleep(0.5)


async def wait_web(url: str, within: float = 60) -> None:
    """Until toposm-web answers its JSON status (it starts beside the other services)."""
    import aiohttp

    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url + "/api/status") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"toposm-web did not answer at {url}")
            await asyncio.sleep(0.3)


def changed_pixels(before: Path, after: Path) -> int:
    from PIL import Image, ImageChops

    diff = ImageChops.difference(Image.open(before).convert("RGB"), Image.open(after).convert("RGB")).convert("L")
    histogram = diff.point(lambda v: 255 if v else 0).histogram()
    return int(histogram[255])
