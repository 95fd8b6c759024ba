"""Writing a stats result: ``stats.json``, one Parquet file per table, optional ``chart.png``.

Files are written on the bridge host from the (small) collected tables with pyarrow, not by executors,
so the output lands next to the job state whatever the master (local, standalone, Spark Connect).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

TABLES = ("per_zoom", "per_host", "windows")


def write_outputs(result: dict[str, Any], out_dir: Path, *, chart: bool) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    parquet: dict[str, str] = {}
    for name in TABLES:
        rows = result.get(name) or []
        if rows:
            path = out_dir / f"{name}.parquet"
            pq.write_table(pa.Table.from_pylist(rows), path)
            parquet[name] = str(path)
    outputs: dict[str, Any] = {"json": str(out_dir / "stats.json"), "parquet": parquet, "chart": None}
    if chart:
        outputs["chart"] = str(write_chart(result, out_dir / "chart.png"))
    (out_dir / "stats.json").write_bytes(orjson.dumps({**result, "outputs": outputs}, option=orjson.OPT_INDENT_2))
    return outputs


def write_chart(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # headless: the bridge has no display
    import matplotlib.pyplot as plt

    zooms = [row["zoom"] for row in result["per_zoom"]]
    fig, (renders_ax, duration_ax, time_ax) = plt.subplots(3, 1, figsize=(8, 10))
    renders_ax.bar(zooms, [row["renders"] for row in result["per_zoom"]], label="renders")
    renders_ax.bar(zooms, [row["failures"] for row in result["per_zoom"]], label="failures", color="tab:red")
    renders_ax.set(title="Renders per zoom", xlabel="zoom", ylabel="metatiles")
    renders_ax.legend()
    for name in ("p50", "p95", "p99"):
        duration_ax.plot(zooms, [row[name] for row in result["per_zoom"]], marker="o", label=name)
    duration_ax.set(title="Render duration per zoom", xlabel="zoom", ylabel="seconds")
    duration_ax.legend()
    windows = result["windows"]
    time_ax.plot([w["window_start"] for w in windows], [w["renders_per_second"] for w in windows])
    time_ax.set(title=f"Throughput ({result['window_seconds']} s windows)", xlabel="epoch seconds", ylabel="renders/s")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
