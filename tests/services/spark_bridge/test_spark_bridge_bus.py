"""The bridge on the bus: submit/wait, published expirations, progress alerts, job control, bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import aio_pika
import pytest
from spark_helpers import oracle_metatiles, oracle_point_tiles, oracle_propagate

from harness import eventually
from harness.osm import OscNode, OscWay, write_osc
from qbroker import InvalidParams, RequestFailed

CALL = 120.0


async def test_expire_wait_publishes_metatiles_to_listener(bridge, client, make_unit, tmp_path, amqp_url) -> None:
    received: list[str] = []
    listener = await make_unit("test.expire.listener")

    @listener.on_alert("expire_toposm")
    async def on_expire(body: str) -> None:
        received.append(body)

    await listener.start()
    # A listener written from the TopOSM seed alone: bound only to `expire_toposm` on `osm`.
    seed = await aio_pika.connect(amqp_url)
    channel = await seed.channel()
    osm = await channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=True)
    seed_queue = await channel.declare_queue("", exclusive=True)
    await seed_queue.bind(osm, routing_key="expire_toposm")
    heard_on_osm: list[str] = []

    async def on_osm(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        async with message.process():
            heard_on_osm.append(message.body.decode())

    await seed_queue.consume(on_osm)
    rng = random.Random(11)
    nodes = [OscNode(i, rng.uniform(-10, 10), rng.uniform(40, 50)) for i in range(1, 40)]
    path = write_osc(tmp_path / "diff.osc.gz", modify=[*nodes, OscWay(7, [1, 2]), OscWay(8, [1, 12345])])
    reply = await client.call(
        "spark.expire",
        {"paths": [str(path)], "min_zoom": 8, "max_zoom": 13, "wait": True, "batch_max_tiles": 25},
        timeout=CALL,
    )
    assert reply["state"] == "succeeded"
    result = reply["result"]
    assert result["unresolved_ways"] == {"count": 1, "ids": [8]}
    expected_nodes: set = set()
    for n in nodes:
        expected_nodes |= oracle_point_tiles(n.lon, n.lat, 13)
    expected_meta = oracle_metatiles(oracle_propagate(expected_nodes, 8))
    await eventually(lambda: sum(m.count(";") + 1 for m in received) >= result["total_metatiles"])
    tiles = [t for m in received for t in m.split(";")]
    assert len(tiles) == len(set(tiles)) == result["total_metatiles"] == result["published"]["metatiles"]
    assert all(m.count(";") < 25 for m in received) and result["published"]["messages"] == len(received)
    # Way 7 adds the tiles between nodes 1 and 2; every node metatile is published.
    assert expected_meta <= set(tiles)
    assert sum(result["metatiles_per_zoom"].values()) == len(tiles)
    # the same lists, once each, on the seed's wire
    await eventually(lambda: len(heard_on_osm) >= len(received))
    assert sorted(heard_on_osm) == sorted(received)
    await seed.close()


async def test_submit_then_query_job(bridge, client, tmp_path) -> None:
    listing = tmp_path / "expire.list"
    listing.write_text("15/17000/11000\n15/17001/11000\n")
    reply = await client.call(
        "spark.expire", {"paths": [str(listing)], "min_zoom": 12, "max_zoom": 15, "publish": False}
    )
    job_id = reply["job_id"]
    assert reply["state"] in ("queued", "running")
    await eventually(lambda: bridge.manager.get(job_id).state.finished, timeout=90)
    status = await client.call("spark.job", {"command": "status", "job_id": job_id})
    assert status["state"] == "succeeded" and status["kind"] == "expire" and "result" not in status
    result = await client.call("spark.job", {"command": "result", "job_id": job_id})
    assert result["result"]["tiles_per_zoom"] == {"12": 1, "13": 1, "14": 1, "15": 2}
    assert result["result"]["published"] == {"messages": 0, "metatiles": 0}
    log = await client.call("spark.job", {"command": "log", "job_id": job_id, "lines": 3})
    assert log["lines"][-1].endswith("succeeded")
    progress = await client.call("spark.job", {"command": "progress", "job_id": job_id})
    assert progress["state"] == "succeeded" and progress["counters"]["tiles"] == 5
    listed = await client.call("spark.job", {"command": "list", "state": "succeeded"})
    assert job_id in [j["job_id"] for j in listed["jobs"]]
    with pytest.raises(RequestFailed) as err:
        await client.call("spark.job", {"command": "status", "job_id": "nope"})
    assert err.value.id == "unknown_job"
    with pytest.raises(RequestFailed) as err:
        await client.call(
            "spark.expire", {"paths": [str(listing)], "publish": False, "wait": True, "wait_timeout": 0.001}
        )
    assert err.value.id == "wait_timeout" and "keeps running" in err.value.message


async def test_cancel_long_job_queue_bound_and_progress(bridge, client, make_unit, spark, tmp_path) -> None:
    progress: list[dict] = []
    watcher = await make_unit("test.progress.watcher")

    @watcher.on_alert("spark.progress.#")
    async def on_progress(body: dict) -> None:
        progress.append(body)

    await watcher.start()
    # A way across the whole map at z20: millions of samples, long enough to cancel mid-flight.
    long_osc = write_osc(tmp_path / "long.osc", modify=[OscNode(1, -170, 10), OscNode(2, 170, 10.5), OscWay(3, [1, 2])])
    big = {
        "paths": [str(long_osc)],
        "min_zoom": 0,
        "max_zoom": 22,
        "publish": False,
        "max_tiles_per_geometry": 10**9,
        "max_tiles": 10**9,
    }
    first = await client.call("spark.expire", big)
    # The tile estimate runs first (phase "estimating"): the job is cancellable from there on.
    await eventually(lambda: bridge.manager.get(first["job_id"]).phase in ("estimating", "expiring"), timeout=60)
    second = await client.call("spark.expire", {**big, "max_zoom": 10})
    assert (await client.call("spark.job", {"command": "status", "job_id": second["job_id"]}))["state"] == "queued"
    listed = await client.call("spark.job", {"command": "list"})
    states = {j["job_id"]: j["state"] for j in listed["jobs"]}
    assert states[first["job_id"]] == "running" and states[second["job_id"]] == "queued" and listed["max_jobs"] == 1
    live = await eventually(
        lambda: [p for p in progress if p["job_id"] == first["job_id"] and p["spark"] and p["spark"]["tasks"] > 0]
    )
    assert live[-1]["state"] == "running" and live[-1]["phase"] in ("estimating", "expiring")
    queued_cancel = await client.call("spark.job", {"command": "cancel", "job_id": second["job_id"]})
    assert queued_cancel["state"] == "cancelled"
    # The call's own timeout is the ceiling: a cancel that hangs fails with CallTimeout.
    running_cancel = await client.call("spark.job", {"command": "cancel", "job_id": first["job_id"]}, timeout=30)
    assert running_cancel["state"] == "cancelled"
    # Spark really stopped: nothing of the job group is still active.
    await eventually(lambda: not spark.sparkContext.statusTracker().getActiveJobsIds(), timeout=20)
    with pytest.raises(RequestFailed) as err:
        await client.call("spark.job", {"command": "result", "job_id": first["job_id"]})
    assert err.value.id == "job_cancelled"
    await eventually(lambda: any(p["job_id"] == first["job_id"] and p["state"] == "cancelled" for p in progress))


@pytest.mark.parametrize(
    ("body", "error_id", "text"),
    [
        ({"paths": ["/nonexistent/diff.osc"]}, "input_not_allowed", "outside the bridge's input roots"),
        ({"paths": ["MISSING"]}, "no_such_input", "no such file"),
        ({"paths": ["X"], "min_zoom": 15, "max_zoom": 12}, "invalid_params", "min_zoom (15) is greater"),
        ({"paths": ["X"], "max_zoom": 23}, "invalid_params", "max_zoom"),
        ({"paths": []}, "invalid_params", "paths"),
        ({"paths": ["X"], "bogus": 1}, "invalid_params", "bogus"),
        ({"paths": ["NOT_OSC"]}, "bad_input", "not an osmChange document"),
        ({"paths": ["NOT_LIST"]}, "bad_input", "not an expire list"),
    ],
)
async def test_bad_expire_requests_fail_at_submit(bridge, client, tmp_path, body, error_id, text) -> None:
    (tmp_path / "x.list").write_text("1/0/0\n")
    (tmp_path / "bad.osc").write_text("<html>nope</html>")
    (tmp_path / "bad.list").write_text("hello world\n")
    subst = {
        "X": str(tmp_path / "x.list"),
        "NOT_OSC": str(tmp_path / "bad.osc"),
        "NOT_LIST": str(tmp_path / "bad.list"),
        "MISSING": str(tmp_path / "missing.osc"),
    }
    body = {**body, "paths": [subst.get(p, p) for p in body["paths"]]}
    with pytest.raises(RequestFailed) as err:
        await client.call("spark.expire", body)
    # The specifics are in the message, or in `detail` where the message is fixed per error id (the seed).
    assert err.value.id == error_id and text in err.value.message + (err.value.detail or "")
    if error_id == "invalid_params":
        assert isinstance(err.value, InvalidParams)


async def test_unparsable_osc_fails_the_job_with_reason(bridge, client, tmp_path) -> None:
    broken = tmp_path / "broken.osc"
    broken.write_text('<osmChange version="0.6"><modify><node id="1" lat="1" lon="2" version="1"></modify>')
    submitted = await client.call("spark.expire", {"paths": [str(broken)]})
    with pytest.raises(RequestFailed) as err:
        await client.call("spark.expire", {"paths": [str(broken)], "wait": True}, timeout=CALL)
    assert err.value.id == "job_failed" and "unparsable osmChange" in err.value.detail
    status = await client.call("spark.job", {"command": "status", "job_id": submitted["job_id"]})
    assert status["state"] == "failed" and "unparsable osmChange" in status["error"]


async def test_stats_over_bus_writes_outputs(bridge, client, tmp_path) -> None:
    log = tmp_path / "render.log"
    log.write_text(
        "".join(
            json.dumps(
                {
                    "metatile": "9/0/0",
                    "zoom": 9,
                    "renderer": f"toposm.render.h{i % 2}.1.1",
                    "start": 1000.0 + i,
                    "duration": float(i),
                    "status": "ok",
                }
            )
            + "\n"
            for i in range(1, 11)
        )
    )
    reply = await client.call("spark.stats", {"paths": [str(log)], "wait": True, "window_seconds": 5}, timeout=CALL)
    result = reply["result"]
    assert result["per_zoom"][0]["p50"] == pytest.approx(5.5)
    assert [h["host"] for h in result["per_host"]] == ["h0", "h1"]
    assert Path(result["outputs"]["json"]).parent == bridge.state_dir / "results" / reply["job_id"]
    with pytest.raises(RequestFailed) as err:
        await client.call("spark.stats", {"paths": [str(tmp_path / "missing.log")]})
    assert err.value.id == "no_such_input"


async def test_each_error_triple_has_one_message(bridge, client, tmp_path) -> None:
    """The seed: one (status, id, part), one message; what is particular to the request is in `detail`."""
    (tmp_path / "bad.osc").write_text("<html>nope</html>")
    (tmp_path / "bad.list").write_text("hello world\n")
    requests = [
        ("spark.job", {"command": "status", "job_id": "nope-1"}),
        ("spark.job", {"command": "status", "job_id": "nope-2"}),
        ("spark.job", {"command": "log", "job_id": "nope-3"}),
        ("spark.job", {"command": "list", "limit": 0}),
        ("spark.job", {"command": "list", "limit": 5000}),
        ("spark.expire", {"paths": [str(tmp_path / "bad.osc")]}),
        ("spark.expire", {"paths": [str(tmp_path / "bad.list")]}),
        ("spark.expire", {"paths": [str(tmp_path / "missing-1.osc")]}),
        ("spark.expire", {"paths": [str(tmp_path / "missing-2.list")]}),
        ("spark.expire", {"paths": ["/etc/passwd"]}),
        ("spark.expire", {"paths": ["/etc/hostname"]}),
        ("spark.expire", {"paths": [str(tmp_path / "bad.list")], "max_tiles": 10**12}),
        ("spark.expire", {"paths": [str(tmp_path / "bad.list")], "max_tiles": 10**13}),
    ]
    messages: dict[tuple, set[str]] = {}
    details = set()
    for name, body in requests:
        with pytest.raises(RequestFailed) as err:
            await client.call(name, body, timeout=CALL)
        e = err.value
        messages.setdefault((e.status, e.id, e.part), set()).add(e.message)
        details.add(e.detail)
    assert {t: m for t, m in messages.items() if len(m) > 1} == {}
    assert len(messages) >= 5 and len(details) >= 10
