"""``toposm-render-list``'s plan and resume file without the bus: the metatiles of a box are those of the tiles
mercantile finds in it, in an order any position of which is computed, and a resume file is for one area."""

import json

import mercantile
import pytest

from services.tiles.render_list.area import AreaError, AreaPlan, BBox, parse_zooms
from services.tiles.render_list.main import parse_args
from services.tiles.render_list.resume import Progress, ResumeError, load, save
from services.toposm.tilemath import Tile, ZoomRange

BOXES = [
    (24.9351766, 60.1641551, 24.9534132, 60.1791074),  # the Helsinki extract
    (-180.0, -85.0511287798066, 180.0, 85.0511287798066),  # the world
    (0.0, 0.0, 45.0, 40.97989806962013),  # edges on tile boundaries at every zoom up to 2 and beyond
    (-0.0001, -0.0001, 0.0001, 0.0001),  # four tiles meeting at the origin
    (139.6, 35.5, 139.9, 35.8),
]


@pytest.mark.parametrize("bbox", BOXES)
def test_the_plan_is_mercantiles_tiles_by_metatile(bbox):
    zooms = range(0, 13) if bbox[2] - bbox[0] < 1 else range(0, 7)
    plan = AreaPlan(BBox(*bbox), ZoomRange(zooms[0], zooms[-1]))
    planned = [m for _, m in plan.metatiles()]
    expected = {Tile(t.z, t.x, t.y).metatile for t in mercantile.tiles(*bbox, zooms=list(zooms))}
    assert len(planned) == len(set(planned)) == plan.count
    assert set(planned) == expected
    assert [m.z for m in planned] == sorted(m.z for m in planned)  # zoom by zoom, lowest first
    assert [plan.at(i) for i in range(plan.count)] == planned
    assert [m for _, m in plan.metatiles(plan.count // 2)] == planned[plan.count // 2 :]


def test_bad_areas_are_named():
    for text, problem in [
        ("1,2,3", "W,S,E,N"),
        ("a,1,2,3", "W,S,E,N"),
        ("10,0,5,1", "W < E"),
        ("0,5,1,4", "S < N"),
        ("0,0,1,nan", "finite"),
        ("170,0,190,1", "W < E"),
    ]:
        with pytest.raises(AreaError, match=problem):
            BBox.parse(text)
    assert parse_zooms("10-16") == ZoomRange(10, 16) and parse_zooms("14") == ZoomRange(14, 14)
    for text in ("16-10", "x", "0-31"):
        with pytest.raises(AreaError):
            parse_zooms(text)
    with pytest.raises(SystemExit):
        parse_args(["--bbox", "0,0,1,1", "--zooms", "3-2"])


def test_a_resume_file_is_for_one_area(tmp_path):
    plan = AreaPlan(BBox(*BOXES[0]), ZoomRange(13, 16))
    path = tmp_path / "resume.json"
    assert load(path, plan).next == 0  # no file yet: from the start
    progress = Progress.new(plan)
    progress.next, progress.settled_ahead = 2, [3]
    progress.record(13, "rendered", "13/582/296")
    progress.record(16, "failed", "16/4663/2371", "mapnik broke")
    save(path, progress)
    again = load(path, plan)
    assert (again.next, again.settled_ahead, again.settled) == (2, [3], 3)
    assert again.counts() == {"rendered": 1, "skipped": 0, "failed": 1}
    assert again.failures == [{"metatile": "16/4663/2371", "reason": "mapnik broke"}]
    with pytest.raises(ResumeError, match="--zooms 13-16"):
        load(path, AreaPlan(BBox(*BOXES[0]), ZoomRange(13, 15)))
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "next": plan.count + 1}))
    with pytest.raises(ResumeError, match="outside"):
        load(path, plan)
    path.write_text("{not json")
    with pytest.raises(ResumeError, match="cannot read"):
        load(path, plan)
