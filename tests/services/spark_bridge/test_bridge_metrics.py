"""``qbroker-spark-bridge --metrics-port``: jobs by state, job seconds and tiles expired after a job."""

from __future__ import annotations

from harness import eventually
from qbroker.cli.dead_letter import NAMESPACE as DEAD_LETTER
from services import toposm
from services.spark_bridge.metrics import NAMESPACE
from services.spark_bridge.service import SparkBridge
from services.toposm.metrics_port import service_metrics
from tests.grafana_dashboard import missing
from tests.prometheus_text import created_series, says_its_version, scrape, value


async def test_bridge_metrics_after_an_expire_job(make_unit, spark, tmp_path, client) -> None:
    unit = await make_unit("spark.bridge")
    bridge = SparkBridge(
        unit, spark, tmp_path / "state", max_jobs=1, input_roots=[tmp_path], metrics=service_metrics(NAMESPACE, 0)
    )
    await unit.start()
    await bridge.start()
    try:
        port = bridge.metrics_server.bound_port
        assert port is not None
        listing = tmp_path / "expire.list"
        listing.write_text("15/17000/11000\n15/17001/11000\n")
        reply = await client.call(
            "spark.expire",
            {"paths": [str(listing)], "min_zoom": 12, "max_zoom": 15, "publish": False, "wait": True},
            timeout=120,
        )
        assert reply["state"] == "succeeded"

        def counted() -> bool:
            text = scrape(port)
            return (
                value(text, 'spark_bridge_jobs{kind="expire",state="succeeded"}') == 1
                and value(text, "spark_bridge_tiles_expired_total") == 5
            )

        await eventually(counted, timeout=30)
        text = scrape(port)
        assert value(text, 'spark_bridge_job_seconds_count{kind="expire",state="succeeded"}') == 1
        assert value(text, 'spark_bridge_jobs{kind="stats",state="running"}') == 0
        assert 'qbroker_handled_total{endpoint="spark.expire"' in text
        # What the Grafana dashboard asks of the bridge: its own and the library's (not another program's build info).
        assert not missing(("spark_bridge_", "qbroker_"), text) - {f"{DEAD_LETTER}_build_info"}
        # as every program (docs/metrics.md)
        assert says_its_version(text, NAMESPACE, toposm.__version__) and not created_series(text)
    finally:
        await bridge.stop()
