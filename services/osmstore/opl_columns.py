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
    encoded = pc.dictionary_encode(raw).combine_chunks() if isinstance(raw, pa.ChunkedArray) else \
        pc.dictionary_encode(raw)
    values = [fn(text) for text in encoded.dictionary.to_pylist()]
    return [values[i] for i in encoded.indices.to_numpy(zero_copy_only=False).tolist()]


@dataclass
class Ways:
    ids: np.ndarray  # int64
    tags: pa.Array  # raw OPL tag text per way
    offsets: np.ndarray  # refs of way i are refs[offsets[i]:offsets[i + 1]]
    refs: np.ndarray  # int64 node ids
    ref_text: pa.Array  # the refs as OPL wrote them ("n1,n2,n3")

    def __len__(self) -> int:
        return len(self.ids)

    def nodes_json(self) -> pa.Array:
        """Each way's node ids as a JSON array ("[1,2,3]"): the geometry store's ``ways.nodes``. Made from
        the OPL text in C (OPL's ``n`` prefixes dropped), not from Python ints."""
        return pc.binary_join_element_wise("[", pc.replace_substring(self.ref_text, "n", ""), "]", "")

    def seq(self) -> np.ndarray:
        """The position of each ref in its way (way_nodes.seq)."""
        return np.arange(len(self.refs)) - np.repeat(self.offsets[:-1], np.diff(self.offsets))

    def owner(self) -> np.ndarray:
        """The way id of each ref."""
        return np.repeat(self.ids, np.diff(self.offsets))

    def ref_rows(self) -> list[list[int]]:
        """(way id, seq, node id) columns: the stores' ``way_nodes`` rows."""
        return [self.owner().tolist(), self.seq().tolist(), self.refs.tolist()]


@dataclass
class Relations:
    ids: np.ndarray
    tags: pa.Array
    offsets: np.ndarray  # members of relation i are [offsets[i]:offsets[i + 1]]
    member_types: pa.Array  # "n", "w" or "r"
    member_ids: np.ndarray
    roles: pa.Array

    def __len__(self) -> int:
        return len(self.ids)

    def members_json(self) -> pa.Array:
        """Each relation's members as a JSON array of [type, id, role] ('[["w",12,"outer"],["n",7,""]]'): the
        geometry store's ``relations.members``, as osm2pgsql's middle keeps them. Joined in C from the
        columns; a role's quotes and backslashes are escaped for JSON there too, and only the few roles with
        an OPL escape (``%20%``) are decoded in Python."""
        roles = pc.replace_substring(pc.replace_substring(self.roles, "\\", "\\\\"), '"', '\\"')
        escaped = pc.match_substring(self.roles, "%")
        if pc.any(escaped).as_py():
            decoded = [json.dumps(unescape(role), ensure_ascii=False)[1:-1]
                       for role in self.roles.filter(escaped).to_pylist()]
            roles = pc.replace_with_mask(roles, escaped, pa.array(decoded, pa.string()))
        ids = pc.cast(pa.array(self.member_ids), pa.string())
        members = pc.binary_join_element_wise('["', self.member_types, '",', ids, ',"', roles, '"]', "")
        lists = pa.ListArray.from_arrays(pa.array(self.offsets, pa.int32()), members)
        return pc.binary_join_element_wise("[", pc.binary_join(lists, ","), "]", "")

    def seq(self) -> np.ndarray:
        return np.arange(len(self.member_ids)) - np.repeat(self.offsets[:-1], np.diff(self.offsets))

    def owner(self) -> np.ndarray:
        return np.repeat(self.ids, np.diff(self.offsets))

    def member_rows(self, relations: np.ndarray | None = None) -> list[list[object]]:
        """(relation id, seq, type, member id, role) columns of the members, of all relations or of those
        where ``relations`` (a bool per relation) is true."""
        if relations is None:
            return [self.owner().tolist(), self.seq().tolist(), self.member_types.to_pylist(),
                    self.member_ids.tolist(), unescaped(self.roles)]
        keep = np.repeat(relations, np.diff(self.offsets))
        where = pa.array(keep)
        return [self.owner()[keep].tolist(), self.seq()[keep].tolist(),
                self.member_types.filter(where).to_pylist(), self.member_ids[keep].tolist(),
                unescaped(self.roles.filter(where))]


def _ids(column: pa.Array) -> np.ndarray:
    return pc.cast(pc.utf8_slice_codeunits(column, 1), pa.int64()).to_numpy(zero_copy_only=False)


def _lists(column: pa.Array) -> tuple[pa.Array, np.ndarray, pa.Array]:
    """The comma-separated list after the field's one-letter prefix: its text, offsets and flat items."""
    text = pc.utf8_slice_codeunits(column, 1)
    lists = pc.split_pattern(pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text), ",")  # "N": none
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False), out=offsets[1:])
    return text, offsets, lists.flatten()


def _ways(batch: pa.RecordBatch) -> Ways:
    text, offsets, items = _lists(batch.column(2))
    refs = pc.cast(pc.utf8_slice_codeunits(items, 1), pa.int64()).to_numpy(zero_copy_only=False)
    return Ways(_ids(batch.column(0)), pc.utf8_slice_codeunits(batch.column(1), 1), offsets, refs, text)


def _relations(batch: pa.RecordBatch) -> Relations:
    _, offsets, items = _lists(batch.column(2))
    at = pc.split_pattern(pc.utf8_slice_codeunits(items, 1), "@", max_splits=1).flatten()
    pairs = np.arange(len(at)) % 2 == 0
    member_ids = pc.cast(at.filter(pa.array(pairs)), pa.int64()).to_numpy(zero_copy_only=False)
    roles = at.filter(pa.array(~pairs))
    return Relations(_ids(batch.column(0)), pc.utf8_slice_codeunits(batch.column(1), 1), offsets,
                     pc.utf8_slice_codeunits(items, 0, 1), member_ids, roles)


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


def read_objects(path: Path, block_size: int = BLOCK) -> Iterator[Ways | Relations]:
    """The ways and relations of an OPL file (as libosmium writes it without metadata), ``block_size`` bytes
    of text at a time, in file order: what a caller holds at once does not grow with the file. Each block is
    read here and parsed when its turn comes: pyarrow's streaming CSV reader reads up to 32 blocks ahead in
    the background (128 MB with 4 MB blocks, as much as the whole file at K=50)."""
    names = ["id", "tags", "list"]
    parse_options = pcsv.ParseOptions(delimiter=" ", quote_char=False, escape_char=False)
    convert_options = pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()))
    for block in _text_blocks(path, block_size):
        read_options = pcsv.ReadOptions(column_names=names, block_size=len(block) + 1, use_threads=False)
        table = pcsv.read_csv(pa.py_buffer(block), read_options=read_options, parse_options=parse_options,
                              convert_options=convert_options)
        for batch in table.to_batches():
            kind = pc.utf8_slice_codeunits(batch.column(0), 0, 1)
            for letter, parse in (("w", _ways), ("r", _relations)):
                part = batch.filter(pc.equal(kind, letter))
                if part.num_rows:
                    yield parse(part)
