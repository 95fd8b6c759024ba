"""A forged or broken ``stats`` answer from whatever answers as the queuemaster never makes the status page
fail: counters that are not numbers count as 0, renderer entries that are not objects are left out."""

from __future__ import annotations

import orjson

from services.web.status import StatusModel

FORGED = [
    {"queues": {"missing": "lots", "important": [1], "total": float("nan"), "rendering": True,
                "by_zoom": {"12": "x", "13": 4}},
     "renderers": ["not a thread", 7, {"renderer": "r1", "rendered": "many"}]},
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
