"""A forged or broken ``stats`` answer from whatever answers as the queuemaster never makes the status page
fail: counters that are not numbers count as 0, renderer entries that are not objects are left out. A
render log with a line longer than a read does not stop the page's render list."""

from __future__ import annotations

from pathlib import Path

import orjson

from qbroker import Unit
from services.toposm.tilemath import ZoomRange
from services.web.collector import MAX_LOG_READ, Collector
from services.web.status import StatusModel
from services.web.web_metrics import WebMetrics

FORGED = [
    {
        "queues": {
            "missing": "lots",
            "important": [1],
            "total": float("nan"),
            "rendering": True,
            "by_zoom": {"12": "x", "13": 4},
        },
        "renderers": ["not a thread", 7, {"renderer": "r1", "rendered": "many"}],
    },
    {"queues": "nothing", "renderers": {"r": 1}},
    {"queues": {"total": float("inf")}, "renderers": None},
]


def test_forged_queuemaster_stats_give_a_status_page_with_zeros() -> None:
    for stats in FORGED:
        model = StatusModel()
        model.set_queuemaster(stats)
        model.set_queuemaster(stats)  # a second poll computes rates from the first
        snapshot = model.snapshot()
        orjson.dumps(snapshot)
        queues = model.queues()
        assert all(isinstance(queues[k], int) for k in ("missing", "important", "total", "rendering")), queues
    assert StatusModel().queues()["total"] == 0
    model = StatusModel()
    model.set_queuemaster(FORGED[0])
    assert model.queues()["expired_by_zoom"] == {"13": 4}
    assert [t["renderer"] for t in model.renderers()] == ["r1"]


def test_a_render_log_line_longer_than_a_read_is_skipped_and_reading_goes_on(tmp_path: Path) -> None:
    """A line with no end within a read (1 MiB) was read again at every poll: the page never saw another
    render. It is skipped to its end, and the records after it are read."""

    def record(metatile: str) -> bytes:
        return (
            orjson.dumps(
                {"metatile": metatile, "renderer": "r1", "start": 1.0, "duration": 0.5, "status": "ok", "zoom": 12}
            )
            + b"\n"
        )

    log = tmp_path / "render.log"
    log.write_bytes(record("12/0/0") + b'{"metatile": "' + b"x" * (3 * MAX_LOG_READ) + b'"}\n' + record("12/8/8"))
    model = StatusModel()
    collector = Collector(Unit("test.web"), model, WebMetrics(model), zooms=ZoomRange(), render_log=log)
    counts = [collector.read_render_log() for _ in range(6)]
    assert sum(counts) == 2 and counts[-1] == 0
    assert [entry["metatile"] for entry in model.recent] == ["12/8/8", "12/0/0"]
    with log.open("ab") as more:  # and it goes on with what comes next
        more.write(record("12/16/16"))
    assert collector.read_render_log() == 1
