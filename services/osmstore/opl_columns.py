"""Ways and relations as Arrow columns, from the OPL text libosmium writes during the import's C++ pass.

pyosmium hands Python one object at a time (a few microseconds each before any work, and as much again per
way node or relation member), which was most of the import's time. Instead libosmium writes the ways and
relations as OPL ("w12 Thighway=residential,name=X Nn1,n2,n3"; "r5 Ttype=route Mw12@,n7@stop"; written
without metadata) and pyarrow reads that back in large blocks and splits it into columns in C: ids, the
raw tag text, and the way refs and relation members as flat arrays with offsets. Python then touches
objects only where it must (the distinct tag texts, see ``distinct_tags``).

OPL escapes a character that could be read as syntax (space, comma, equals, at, percent, control and many
non-Latin characters) as ``%<hex code point>%``; ``unescape`` decodes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

_ESCAPE = re.compile(r"%([0-9a-fA-F]+)%")
BLOCK = 1 << 22  # bytes of OPL per batch: what bounds the memory of everything done per batch
T = TypeVar("T")


def unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text) if "%" in text else text


def opl_tags(raw: str) -> dict[str, str]:
    """``k=v,k2=v2`` (OPL, escaped) as a dict, in the object's tag order."""
    if not raw:
        return {}
    tags: dict[str, str] = {}
    for item in raw.split(","):
        key, _, value = item.partition("=")
        tags[unescape(key)] = unescape(value)
    return tags


def unescaped(column: pa.Array) -> list[str]:
    """The strings of ``column`` (OPL text such as roles) decoded, the few with an escape in Python."""
    values = column.to_pylist()
    for i in np.flatnonzero(pc.match_substring(column, "%").to_numpy(zero_copy_only=False)).tolist():
        values[i] = unescape(values[i])
    return values


def distinct_tags(raw: pa.Array, fn: Callable[[str], T]) -> list[T]:
    """``fn`` of each tag text in ``raw``, computed once per distinct text (objects often share their tags:
    ``building=yes``, a street's segments) and spread back in C."""
    encoded = (
        pc.dictionary_encode(raw).combine_chunks() if isinstance(raw, pa.ChunkedArray) else pc.dictionary_encode(raw)
    )
    values = [fn(text) for text in encoded.dictionary.to_pylist()]
    return [values[i] for i in encoded.indices.to_numpy(zero_copy_only=False).tolist()]


def _lists(text: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """A comma-separated list per row (OPL's refs or members, after the field's letter): offsets and items."""
    lists = pc.split_pattern(pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text), ",")  # none
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False), out=offsets[1:])
    return offsets, lists.flatten()


def _count(text: pa.Array, mark: str) -> int:
    """How many times the character ``mark`` occurs in the column (OPL escapes it inside names and roles):
    counted over the column's character data at once, not string by string."""
    if len(text) == 0:
        return 0
    offsets = text.buffers()[1]
    ends = np.frombuffer(offsets, np.int32 if text.type == pa.string() else np.int64)[text.offset :]
    data = np.frombuffer(text.buffers()[2], np.uint8)[ends[0] : ends[len(text)]]
    return int(np.count_nonzero(data == ord(mark)))


@dataclass
class Ways:
    """A block of ways. The refs are split into numbers only when asked for (``refs``, ``offsets``): the
    geometry store needs only their text."""

    ids: np.ndarray  # int64
    tags: pa.Array  # raw OPL tag text per way
    ref_text: pa.Array  # the refs as OPL wrote them ("n1,n2,n3")

    def __len__(self) -> int:
        return len(self.ids)

    @cached_property
    def _split(self) -> tuple[np.ndarray, np.ndarray]:
        offsets, items = _lists(self.ref_text)
        return offsets, pc.cast(pc.utf8_slice_codeunits(items, 1), pa.int64()).to_numpy(zero_copy_only=False)

    @property
    def offsets(self) -> np.ndarray:
        """Refs of way i are ``refs[offsets[i]:offsets[i + 1]]``."""
        return self._split[0]

    @property
    def refs(self) -> np.ndarray:
        """The node ids of all the block's ways, int64."""
        return self._split[1]

    def ref_count(self) -> int:
        return _count(self.ref_text, "n")

    def nodes_json(self) -> pa.Array:
        """Each way's node ids as a JSON array ("[1,2,3]"): the geometry store's ``ways.nodes``. Made from
        the OPL text in C (OPL's ``n`` prefixes dropped), not from Python ints."""
        return pc.binary_join_element_wise("[", pc.replace_substring(self.ref_text, "n", ""), "]", "")


@dataclass
class Relations:
    """A block of relations. The members are split into columns only when asked for (``member_rows``):
    the geometry store's JSON is made from their text, and the rendering store keeps the members of only
    the relations that can make an area."""

    ids: np.ndarray
    tags: pa.Array
    member_text: pa.Array  # the members as OPL wrote them ("w12@outer,n7@")

    def __len__(self) -> int:
        return len(self.ids)

    @cached_property
    def _split(self) -> tuple[np.ndarray, pa.Array, np.ndarray, pa.Array]:
        offsets, items = _lists(self.member_text)
        at = pc.split_pattern(pc.utf8_slice_codeunits(items, 1), "@", max_splits=1).flatten()
        pairs = np.arange(len(at)) % 2 == 0
        member_ids = pc.cast(at.filter(pa.array(pairs)), pa.int64()).to_numpy(zero_copy_only=False)
        return offsets, pc.utf8_slice_codeunits(items, 0, 1), member_ids, at.filter(pa.array(~pairs))

    @property
    def offsets(self) -> np.ndarray:
        """Members of relation i are ``[offsets[i]:offsets[i + 1]]``."""
        return self._split[0]

    @property
    def member_types(self) -> pa.Array:
        """ "n", "w" or "r" per member."""
        return self._split[1]

    @property
    def member_ids(self) -> np.ndarray:
        return self._split[2]

    @property
    def roles(self) -> pa.Array:
        """Per member, as OPL wrote it (escaped)."""
        return self._split[3]

    def member_count(self) -> int:
        return _count(self.member_text, "@")

    def members_json(self) -> pa.Array:
        """Each relation's members as a JSON array of [type, id, role] ('[["w",12,"outer"],["n",7,""]]'): the
        geometry store's ``relations.members``, as osm2pgsql's middle keeps them. Rewritten from the OPL text
        in C with plain replacements ("w12@outer,n7@": members apart at the commas, role after the at sign,
        the type quoted), which OPL's escaping makes safe: a role holds no raw comma or at sign. The few
        relations with a role JSON must escape (a quote, a backslash) or OPL did (``%20%``) are written by
        ``json`` from their parsed members."""
        text = pc.replace_substring(pc.replace_substring(self.member_text, ",", '"],["'), "@", ',"')
        text = pc.binary_join_element_wise('[["', text, '"]]', "")
        for letter in "nwr":
            text = pc.replace_substring(text, '["' + letter, '["' + letter + '",')
        joined = pc.if_else(pc.equal(self.member_text, ""), pa.scalar("[]"), text)
        special = pc.match_substring_regex(self.member_text, r'["\\%]').to_numpy(zero_copy_only=False)
        if not special.any():
            return joined
        odd = self.select(special)
        types, ids, roles = odd.member_types.to_pylist(), odd.member_ids.tolist(), odd.roles.to_pylist()
        decoded = [
            json.dumps(
                [[types[k], ids[k], unescape(roles[k])] for k in range(start, end)],
                ensure_ascii=False,
                separators=(",", ":"),
            )
            for start, end in zip(odd.offsets[:-1].tolist(), odd.offsets[1:].tolist(), strict=True)
        ]
        values = joined.to_pylist()
        for i, value in zip(np.flatnonzero(special).tolist(), decoded, strict=True):
            values[i] = value
        return pa.array(values, pa.string())

    def select(self, keep: np.ndarray) -> Relations:
        """The relations where ``keep`` (a bool per relation) is true."""
        mask = pa.array(keep)
        return Relations(self.ids[keep], self.tags.filter(mask), self.member_text.filter(mask))

    def seq(self) -> np.ndarray:
        return np.arange(len(self.member_ids)) - np.repeat(self.offsets[:-1], np.diff(self.offsets))

    def owner(self) -> np.ndarray:
        return np.repeat(self.ids, np.diff(self.offsets))

    def member_rows(self, relations: np.ndarray | None = None) -> list[list[object]]:
        """(relation id, seq, type, member id, role) columns of the members, of all relations or of those
        where ``relations`` (a bool per relation) is true (only theirs are split)."""
        chosen = self if relations is None else self.select(relations)
        return [
            chosen.owner().tolist(),
            chosen.seq().tolist(),
            chosen.member_types.to_pylist(),
            chosen.member_ids.tolist(),
            unescaped(chosen.roles),
        ]


def _ids(column: pa.Array) -> np.ndarray:
    return pc.cast(pc.utf8_slice_codeunits(column, 1), pa.int64()).to_numpy(zero_copy_only=False)


def _objects(kind: type[Ways] | type[Relations], batch: pa.RecordBatch) -> Ways | Relations:
    """The block's ways or relations: ids, and the tag and list text without their field letters."""
    return kind(
        _ids(batch.column(0)), pc.utf8_slice_codeunits(batch.column(1), 1), pc.utf8_slice_codeunits(batch.column(2), 1)
    )


def _text_blocks(path: Path, size: int) -> Iterator[bytes]:
    """The file's text about ``size`` bytes at a time, each block ending at a line's end."""
    rest = b""
    with path.open("rb") as fh:
        while chunk := fh.read(size):
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                yield data[:cut]
    if rest:
        yield rest


def read_objects(path: Path, block_size: int = BLOCK, *, tags: bool = True) -> Iterator[Ways | Relations]:
    """The ways and relations of an OPL file (as libosmium writes it without metadata), ``block_size`` bytes
    of text at a time, in file order: what a caller holds at once does not grow with the file. Each block is
    read here and parsed when its turn comes: pyarrow's streaming CSV reader reads up to 32 blocks ahead in
    the background (128 MB with 4 MB blocks, as much as the whole file at K=50). ``tags=False``: the tags
    are not made into strings (all null; the geometry store has no use for them)."""
    names = ["id", "tags", "list"]
    parse_options = pcsv.ParseOptions(delimiter=" ", quote_char=False, escape_char=False)
    convert_options = pcsv.ConvertOptions(
        column_types=dict.fromkeys(names, pa.string()), include_columns=names if tags else ["id", "list"]
    )
    for block in _text_blocks(path, block_size):
        read_options = pcsv.ReadOptions(column_names=names, block_size=len(block) + 1, use_threads=False)
        table = pcsv.read_csv(
            pa.py_buffer(block), read_options=read_options, parse_options=parse_options, convert_options=convert_options
        )
        if not tags:
            table = table.add_column(1, "tags", pa.nulls(table.num_rows, pa.string()))
        for batch in table.to_batches():
            kind = pc.utf8_slice_codeunits(batch.column(0), 0, 1)
            for letter, objects in (("w", Ways), ("r", Relations)):
                part = batch.filter(pc.equal(kind, letter))
                if part.num_rows:
                    yield _objects(objects, part)
