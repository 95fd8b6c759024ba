"""Stats job over a generated render log with known percentiles."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from services.spark_bridge.job_context import JobContext
from services.spark_bridge.stats_job import StatsInputError, StatsParams, run_stats

T0 = 1_700_000_000.0


def write_render_log(path: Path) -> dict:
    rng = random.Random(3)
    lines, durations = [], {10: [], 12: []}
    for i in range(1, 101):  # z10: durations 1..100 s, shuffled
        durations[10].append(float(i))
    for _ in range(40):
        durations[12].append(round(rng.uniform(0.1, 3.0), 3))
    rng.shuffle(durations[10])
    t = T0
    for zoom, values in durations.items():
        for j, d in enumerate(values):
            host = "vader" if j % 2 else "hoth.example.com"
            lines.append(
                {
                    "metatile": f"{zoom}/8/16",
                    "zoom": zoom,
                    "renderer": f"toposm.render.{host}.555.{j % 3}",
                    "start": t,
                    "duration": d,
                    "status": "ok",
                }
            )
            t += 1.0
    for j in range(3):
        lines.append(
            {
                "metatile": "12/0/0",
                "zoom": 12,
                "renderer": "vader.555.1",
                "start": t + j,
                "duration": 999.0,
                "status": "error",
                "reason": "mapnik exploded",
            }
        )
    text = "\n".join(json.dumps(line) for line in lines) + "\n{not json\n"
    path.write_text(text)
    return {"durations": durations, "lines": lines}


def test_stats_per_zoom_host_window(spark, tmp_path: Path) -> None:
    log = tmp_path / "render.log"
    data = write_render_log(log)
    ctx = JobContext("stats-test", spark, None)
    result = run_stats([log], [], StatsParams(window_seconds=60, chart=True), tmp_path / "out", ctx)
    assert result["renders"] == 143 and result["failures"] == 3 and result["bad_lines"] == 1
    by_zoom = {z["zoom"]: z for z in result["per_zoom"]}
    for zoom, values in data["durations"].items():
        expected = np.percentile(values, [50, 95, 99])
        assert [by_zoom[zoom][p] for p in ("p50", "p95", "p99")] == pytest.approx(list(expected))
    assert by_zoom[10]["p50"] == pytest.approx(50.5) and by_zoom[10]["p99"] == pytest.approx(99.01)
    assert by_zoom[12]["failures"] == 3 and by_zoom[12]["renders"] == 43
    hosts = {h["host"]: h for h in result["per_host"]}
    assert set(hosts) == {"vader", "hoth.example.com"}
    assert hosts["vader"]["failures"] == 3 and hosts["vader"]["renders"] == 50 + 20 + 3
    assert hosts["vader"]["renderers"] == 4  # three toposm.render.vader.555.N threads + vader.555.1
    assert sum(w["renders"] for w in result["windows"]) == 143
    assert result["windows"][0] == {
        "window_start": int(T0 // 60 * 60),
        "renders": int(60 - T0 % 60),
        "failures": 0,
        "renders_per_second": pytest.approx((60 - T0 % 60) / 60),
    }
    assert result["recent_failures"][0]["reason"] == "mapnik exploded"
    written = json.loads(Path(result["outputs"]["json"]).read_text())
    assert written["per_zoom"] == json.loads(json.dumps(result["per_zoom"]))
    table = pq.read_table(result["outputs"]["parquet"]["per_zoom"]).to_pylist()
    assert [row["zoom"] for row in table] == [10, 12]
    assert Path(result["outputs"]["chart"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stats_request_log_and_time_filter(spark, tmp_path: Path) -> None:
    log = tmp_path / "render.log"
    write_render_log(log)
    requests = tmp_path / "requests.log"
    requests.write_text(
        "".join(json.dumps({"tile": f"{z}/1/1", "time": T0 + i}) + "\n" for i, z in enumerate([5, 5, 7, 9]))
    )
    ctx = JobContext("stats-test2", spark, None)
    result = run_stats(
        [log], [requests], StatsParams(window_seconds=3600, since=T0 + 2, until=T0 + 200), tmp_path / "out", ctx
    )
    assert result["renders"] == 138 + 3  # ok renders start at T0 + 0..139, failures at T0 + 140..142
    assert result["requests"]["requests"] == 2
    assert result["requests"]["per_zoom"] == [{"zoom": 7, "requests": 1}, {"zoom": 9, "requests": 1}]
    assert result["requests"]["windows"] == [{"window_start": int(T0 // 3600 * 3600), "requests": 2}]


def test_stats_without_usable_records_fails(spark, tmp_path: Path) -> None:
    log = tmp_path / "garbage.log"
    log.write_text("hello\nworld\n")
    with pytest.raises(StatsInputError, match="no usable render records"):
        run_stats([log], [], StatsParams(), tmp_path / "out", JobContext("x", spark, None))
