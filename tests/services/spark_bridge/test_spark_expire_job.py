"""Expiry job on a real local Spark, checked against the mercantile oracle."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from spark_helpers import oracle_metatiles, oracle_point_tiles, oracle_propagate, per_zoom

from harness.osm import OscNode, OscWay, write_osc
from services.spark_bridge.confine import InputRoots
from services.spark_bridge.expire_inputs import validate_inputs
from services.spark_bridge.expire_job import ExpireParams, ExpireTooLarge, run_expire
from services.spark_bridge.job_context import JobContext


def run(spark, paths, min_zoom, max_zoom, **kw):
    published: list[str] = []
    ctx = JobContext("test", spark, None, publish=published.append)
    roots = InputRoots.of(sorted({Path(p).parent for p in paths}))  # the test's own directory
    result = run_expire(validate_inputs([str(p) for p in paths], roots), ExpireParams(min_zoom, max_zoom, **kw), ctx)
    return result, published


def published_tiles(messages: list[str]) -> list[str]:
    return [t for m in messages for t in m.split(";")]


def test_osc_nodes_match_oracle(spark, tmp_path: Path) -> None:
    rng = random.Random(5)
    nodes = [OscNode(i, rng.uniform(-179.9, 179.9), rng.uniform(-84, 84)) for i in range(1, 60)]
    path = write_osc(tmp_path / "nodes.osc.gz", modify=nodes)
    result, messages = run(spark, [path], 10, 16)
    expected: set = set()
    for n in nodes:
        expected |= oracle_point_tiles(n.lon, n.lat, 16)
    expected = oracle_propagate(expected, 10)
    assert result["tiles_per_zoom"] == per_zoom(expected)
    tiles = published_tiles(messages)
    assert len(tiles) == len(set(tiles))
    assert set(tiles) == oracle_metatiles(expected)
    assert result["total_metatiles"] == len(tiles)
    assert result["unresolved_ways"] == {"count": 0, "ids": []}


def test_point_near_tile_edge_expires_neighbour(spark, tmp_path: Path) -> None:
    # 0.05 tile right of the boundary between z12 columns 2047 and 2048 (lon 0): both are expired.
    lon = 0.05 * 360 / 2**12
    path = write_osc(tmp_path / "edge.osc", create=[OscNode(1, lon, 29.19, version=1)])  # mid-row 1700
    result, messages = run(spark, [path], 12, 12)
    assert result["tiles_per_zoom"] == {"12": 2}
    assert set(published_tiles(messages)) == {"12/2040/1696", "12/2048/1696"}


def test_way_expires_tiles_along_segments_and_reports_unresolved(spark, tmp_path: Path) -> None:
    # A horizontal way across 20 z14 tiles with only its two end nodes in the diff.
    lat = 47.123
    path = write_osc(
        tmp_path / "ways.osc",
        modify=[
            OscNode(1, 8.01, lat),
            OscNode(2, 8.44, lat),
            OscWay(100, [1, 2]),
            OscWay(101, [1, 999]),  # node 999 is not in the diff: unresolved, not guessed
        ],
    )
    result, _ = run(spark, [path], 14, 14, publish=False)
    a, b = oracle_point_tiles(8.01, lat, 14), oracle_point_tiles(8.44, lat, 14)
    (_, x0, _), (_, x1, _) = min(a), max(b)
    along = {(14, x, yy) for x in range(x0, x1 + 1) for _, _, yy in a}
    assert x1 - x0 >= 19
    assert result["tiles_per_zoom"] == per_zoom(along | a | b)
    assert result["unresolved_ways"] == {"count": 1, "ids": [101]}


def test_deleted_node_without_location_is_counted(spark, tmp_path: Path) -> None:
    path = write_osc(tmp_path / "del.osc", delete=[OscNode(1, None, None), OscNode(2, 10.5, 50.5)])
    result, _ = run(spark, [path], 10, 10, publish=False)
    assert result["inputs"]["deleted_nodes_without_location"] == 1
    assert result["tiles_per_zoom"] == per_zoom(oracle_point_tiles(10.5, 50.5, 10))


def test_expire_list_zooms_above_and_below_range(spark, tmp_path: Path) -> None:
    listing = tmp_path / "expire.list"
    listing.write_text("18/137000/91000\n\n13/4281/2843\n8/133/88\n")
    result, messages = run(spark, [listing], 10, 14)
    base = {
        (14, 137000 >> 4, 91000 >> 4),  # z18 reduced to max
        (13, 4281, 2843),  # kept at its zoom, propagated down only
    }
    base |= {(10, (133 << 2) + dx, (88 << 2) + dy) for dx in range(4) for dy in range(4)}  # z8 -> its z10 children
    expected = oracle_propagate(base, 10)
    assert result["tiles_per_zoom"] == per_zoom(expected)
    assert set(published_tiles(messages)) == oracle_metatiles(expected)


def test_low_zoom_metatiles_and_map_edges(spark, tmp_path: Path) -> None:
    corners = [OscNode(1, -180.0, 85.3), OscNode(2, 180.0, -89.0), OscNode(3, 179.99999, 0.0001)]
    path = write_osc(tmp_path / "corners.osc", modify=corners)
    result, messages = run(spark, [path], 0, 5)
    tiles = set(published_tiles(messages))
    for z in (0, 1, 2):
        assert f"{z}/0/0" in tiles  # one metatile per zoom at z0-2
    assert {t for t in tiles if t.split("/")[0] in "012"} == {"0/0/0", "1/0/0", "2/0/0"}
    assert "5/0/0" in tiles and "5/24/24" in tiles  # top-left and bottom-right corners, no wrap-around
    assert result["tiles_per_zoom"]["5"] == len(
        oracle_point_tiles(-180.0, 85.3, 5)
        | oracle_point_tiles(180.0, -89.0, 5)
        | oracle_point_tiles(179.99999, 0.0001, 5)
    )


def test_csv_points_and_batches_respect_caps(spark, tmp_path: Path) -> None:
    rng = random.Random(9)
    pts = [(rng.uniform(5, 15), rng.uniform(45, 55)) for _ in range(300)]
    csv = tmp_path / "points.csv"
    csv.write_text("lon,lat\n" + "".join(f"{lo},{la}\n" for lo, la in pts) + "999,0\n")
    result, messages = run(spark, [csv], 12, 16, batch_max_tiles=50, batch_max_bytes=400)
    assert result["inputs"]["invalid_points"] == 1
    assert all(len(m) <= 400 and m.count(";") < 50 for m in messages)
    expected: set = set()
    for lo, la in pts:
        expected |= oracle_point_tiles(lo, la, 16)
    assert published_tiles(messages) == sorted(
        oracle_metatiles(oracle_propagate(expected, 12)), key=lambda t: tuple(int(p) for p in t.split("/"))
    )


def test_max_tiles_guard(spark, tmp_path: Path) -> None:
    listing = tmp_path / "big.list"
    listing.write_text("\n".join(f"16/{x}/100" for x in range(500)) + "\n")
    with pytest.raises(ExpireTooLarge, match="max_tiles=100"):
        run(spark, [listing], 14, 16, max_tiles=100)
    way = write_osc(tmp_path / "long.osc", modify=[OscNode(1, -170, 0), OscNode(2, 170, 0), OscWay(5, [1, 2])])
    with pytest.raises(ExpireTooLarge, match="way 5 would expire up to 77376 tiles at z12"):
        run(spark, [way], 12, 12, max_tiles_per_geometry=4000)


def test_mixed_inputs_union_and_parquet_points(spark, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"LON": [13.4, 13.5], "Lat": [52.5, 52.52]}), tmp_path / "points.parquet")
    listing = tmp_path / "tiles.txt"
    listing.write_text("15/17602/10748\n")
    diff = write_osc(tmp_path / "d.osc", create=[OscNode(1, 13.45, 52.51, version=1)], delete=[OscNode(2, None, None)])
    result, messages = run(spark, [diff, listing, tmp_path / "points.parquet"], 11, 15)
    expected = oracle_point_tiles(13.4, 52.5, 15) | oracle_point_tiles(13.5, 52.52, 15)
    expected |= oracle_point_tiles(13.45, 52.51, 15) | {(15, 17602, 10748)}
    expected = oracle_propagate(expected, 11)
    assert result["tiles_per_zoom"] == per_zoom(expected)
    assert set(published_tiles(messages)) == oracle_metatiles(expected)
    assert result["inputs"]["points"] == 2 and result["inputs"]["deleted_nodes_without_location"] == 1


def test_parquet_without_lon_lat_and_bad_list_line_fail(spark, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from services.spark_bridge.expire_inputs import InputError

    pq.write_table(pa.table({"x": [1.0]}), tmp_path / "nolonlat.parquet")
    with pytest.raises(InputError, match="needs lon and lat columns"):
        run(spark, [tmp_path / "nolonlat.parquet"], 10, 12)
    listing = tmp_path / "late-bad.list"
    listing.write_text("12/1/1\n12/2/2\n12/4096/0\n")  # x out of range at z12, on line 3
    # The file is named, its contents never quoted (docs/security.md).
    with pytest.raises(InputError, match="late-bad.list: a line is not z/x/y"):
        run(spark, [listing], 10, 12)


def _list_lines(rng: random.Random, n: int) -> str:
    zooms = [rng.choice((9, 12, 15, 17)) for _ in range(n)]
    lines = [f"{z}/{rng.randrange(1 << z)}/{rng.randrange(1 << z)}" for z in zooms]
    # Blank lines (spaces only), surrounding whitespace and \r\n / \r line ends: both readers skip and
    # split the same way (Hadoop's line reader, Spark's trim, Java's \s).
    return "\n".join(lines[:5]) + "\n   \n\t" + lines[5] + " \r\n" + "\r".join(lines[6:]) + "\n"


def test_expire_list_read_on_the_driver_or_by_spark_gives_the_same(spark, tmp_path: Path, monkeypatch) -> None:
    """Small plain lists are parsed on the driver (no Spark action), big or gzipped ones by a Spark pass:
    the same tiles, counts and refusals either way."""
    from services.spark_bridge import expire_inputs
    from services.spark_bridge.expire_inputs import InputError

    listing = tmp_path / "mixed.list"
    listing.write_text(_list_lines(random.Random(3), 40))
    on_driver, driver_messages = run(spark, [listing], 10, 16)
    monkeypatch.setattr(expire_inputs, "DRIVER_LIST_BYTES", 0)
    by_spark, spark_messages = run(spark, [listing], 10, 16)
    assert on_driver["tiles_per_zoom"] == by_spark["tiles_per_zoom"] and driver_messages == spark_messages
    assert on_driver["inputs"]["list_tiles"] == by_spark["inputs"]["list_tiles"] == 40
    base: set[tuple[int, int, int]] = set()
    for z, x, y in (tuple(int(v) for v in line.split("/")) for line in listing.read_text().split()):
        if z > 16:  # above max_zoom: its ancestor at max_zoom
            base.add((16, x >> (z - 16), y >> (z - 16)))
        elif z < 10:  # below min_zoom: its descendants at min_zoom
            d = 10 - z
            base |= {(10, (x << d) + dx, (y << d) + dy) for dx in range(1 << d) for dy in range(1 << d)}
        else:
            base.add((z, x, y))
    expected = oracle_propagate(base, 10)
    assert on_driver["tiles_per_zoom"] == per_zoom(expected)
    assert set(published_tiles(driver_messages)) == oracle_metatiles(expected)
    bad = tmp_path / "bad.list"
    bad.write_text("12/1/1\n\n12/4096/0\n")
    for limit in (0, 1 << 20):
        monkeypatch.setattr(expire_inputs, "DRIVER_LIST_BYTES", limit)
        with pytest.raises(InputError, match="bad.list: a line is not z/x/y"):
            run(spark, [bad], 10, 12)


def test_a_small_job_is_one_spark_action(spark, tmp_path: Path) -> None:
    """A minutely-sized list runs as one collect (plus the jobs Spark's adaptive execution splits it into),
    not a Spark action per step: the fixed cost per action is what a small job's seconds were."""
    from services.spark_bridge.spark_session import enter_job, job_tag, leave_job

    listing = tmp_path / "minutely.list"
    rng = random.Random(8)
    listing.write_text(
        "".join(f"18/{149_000 + rng.randrange(900)}/{75_700 + rng.randrange(500)}\n" for _ in range(2_000))
    )
    published: list[str] = []
    ctx = JobContext("small-job", spark, None, publish=published.append)
    enter_job(spark, "small-job", "test")
    try:
        result = run_expire(validate_inputs([str(listing)], InputRoots.of([tmp_path])), ExpireParams(10, 18), ctx)
    finally:
        leave_job(spark, "small-job")
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(job_tag("small-job"))
    assert result["total_metatiles"] == len(published_tiles(published)) > 0
    assert "estimated_tiles" not in result["inputs"]  # 2,000 lines x 9 zooms cannot reach max_tiles
    assert len(jobs) <= 4, jobs
