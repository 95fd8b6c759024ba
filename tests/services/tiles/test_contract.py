"""The TopOSM contract's key packing and expiry list, as each user of them computes them."""

from __future__ import annotations

import sqlite3

from services.tiles.queuemaster.expiry_keys import ancestor_keys, expiry_keys
from services.toposm.contract import KEY_SQL, join_expiry_list, metatile_key, split_expiry_list, unpack_key
from services.toposm.tilemath import Metatile, Tile


def test_keys_round_trip_and_agree_everywhere() -> None:
    for z, mx, my in ((0, 0, 0), (14, 1023, 2047), (30, (1 << 27) - 1, 5)):
        key = metatile_key(z, mx, my)
        assert unpack_key(key) == (z, mx, my)
        assert (
            sqlite3.connect(":memory:")
            .execute(
                f"SELECT {KEY_SQL} FROM (SELECT ? z, ? mx, ? my)",  # noqa: S608
                (z, mx, my),
            )
            .fetchone()[0]
            == key
        )
    tiles = [Tile(14, 8185, 5448), Tile(3, 7, 0)]
    keys, problems = expiry_keys(join_expiry_list(tiles))
    assert not problems and keys == [metatile_key(t.z, t.metatile.mx, t.metatile.my) for t in tiles]
    found = dict.fromkeys(keys[:1])
    ancestor_keys(found, 12)
    assert [Metatile(*unpack_key(k)) for k in found] == [tiles[0].metatile, *tiles[0].metatile.ancestors(12)]


def test_expiry_list_items() -> None:
    assert split_expiry_list(" 1/2/3 ;;\n4/5/6\n") == ["1/2/3", "4/5/6"]
    assert join_expiry_list(["1/2/3", Tile(4, 5, 6)]) == "1/2/3;4/5/6"
