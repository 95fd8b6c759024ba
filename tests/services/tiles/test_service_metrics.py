"""``--metrics-port`` on the queuemaster and a renderer: their Prometheus metrics after a render (what every
program's ``/metrics`` holds, and the Grafana dashboard's queries: tests/services/tiles/test_program_metrics.py)."""

from __future__ import annotations

from harness import eventually
from tests.prometheus_text import scrape, value
from tests.services.tiles.conftest import TileBus, wait_renderers
from tests.services.web.conftest import free_port


async def test_queuemaster_and_renderer_metrics(bus: TileBus) -> None:
    qm_port, renderer_port = free_port(), free_port()
    bus.queuemaster("--metrics-port", str(qm_port))
    bus.renderer("--metrics-port", str(renderer_port))
    client = await bus.client()
    await wait_renderers(client, 1)
    answer = await client.call("toposm.queuemaster", {"command": "render", "tile": "5/3/4"}, timeout=60)
    assert answer["command"] == "rendered"
    await client.call("toposm.queuemaster", {"command": "expire", "tiles": "5/3/4;9/0/0"}, timeout=10)

    async def queuemaster_counted() -> str | None:
        text = scrape(qm_port)
        rendered = value(text, 'toposm_queuemaster_renders_total{status="rendered"}') >= 1
        return text if rendered and value(text, "toposm_queuemaster_expired_tiles_total") == 2 else None

    text = await eventually(queuemaster_counted)
    assert value(text, "toposm_queuemaster_dispatch_seconds_count") >= 1
    assert (
        value(text, 'toposm_queuemaster_render_threads{state="idle"}')
        + value(text, 'toposm_queuemaster_render_threads{state="rendering"}')
        == 1
    )
    assert value(text, 'toposm_queuemaster_queue_depth{kind="missing",zoom="all"}') >= 0
    assert value(text, "toposm_queuemaster_waiters") == 0
    assert 'qbroker_handled_total{endpoint="toposm.queuemaster"' in text  # the library's, same port

    text = scrape(renderer_port)
    assert value(text, 'toposm_renderer_render_seconds_count{zoom="5"}') >= 1
    assert value(text, "toposm_renderer_threads") == 1
    assert value(text, "toposm_renderer_busy_threads") in (0, 1)
    assert (
        "toposm_renderer_render_failures_total" not in text
        or value(text, 'toposm_renderer_render_failures_total{kind="error"}') <= 0
    )
