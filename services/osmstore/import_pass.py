"""The import's read of the extract: libosmium's C++ handlers do the per-object work, Python sees few objects.

Two reads of the file, as libosmium's multipolygon assembly needs (its relations first):

1. relations: the area assembler collects the multipolygon relations with area tags and the ways they need.
2. everything: ``NodeLocationsForWays`` stores every node location in the on-disk index
   (``node_locations``) and hands the ways their locations; the area assembler builds areas from closed
   ways and the collected relations; a C++ key filter lets only the areas with tags that can make a
   feature reach Python (``area_features``: their WKB written by libosmium and spilled to a file a batch at
   a time, their features written after the pass), and only nodes with a ``place`` tag (the only node
   features, ``FeatureExtractor.node``); libosmium's OPL writer writes every way and relation to a text
   file that ``opl_columns`` reads back as Arrow columns.

What Python does per object here is bounded by the features, not by the extract's nodes, ways and members.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import osmium

from . import tags as osm_tags
from .area_features import AreaFeatures
from .features import FeatureExtractor
from .node_locations import NodeLocations, create_index
from .render_db import FeatureWriter

LOCATIONS_FILE = "locations.idx"
OBJECTS_FILE = "objects.opl"
AREAS_FILE = "areas.spill"
# The keys whose tags can make an area or node feature (tags.area_features, tags.node_features).
AREA_KEYS = osm_tags.AREA_KEYS
NODE_KEYS = ["place"]
WRITE_QUEUE = 4  # OPL buffers formatted ahead of the disk
WRITE_BUFFER = 1 << 20  # bytes of objects the OPL writer gathers before handing them to its threads
# libosmium's queues between its threads (read, decode, hand over; format, write): each holds buffers of
# objects or text, 20 by default, which is up to a few hundred MB once the consumer falls behind (the OPL
# output queue with 4 MB buffers reached ~150 MB at K=50). A few suffice to keep the threads busy.
QUEUES = {"OSMIUM_MAX_INPUT_QUEUE_SIZE": "4", "OSMIUM_MAX_OSMDATA_QUEUE_SIZE": "4", "OSMIUM_MAX_OUTPUT_QUEUE_SIZE": "2"}


@dataclass
class PassResult:
    locations: NodeLocations
    objects: Path  # OPL of the ways and relations
    areas: AreaFeatures  # with the areas spilled during the pass (write_spilled)
    spilled_areas: Path


class _FeatureHandler(osmium.SimpleHandler):
    """Sees only what the key filters let through: place nodes and candidate areas."""

    def __init__(self, writer: FeatureWriter, spill: BinaryIO) -> None:
        super().__init__()
        self.nodes = FeatureExtractor(writer)
        self.areas = AreaFeatures(writer, spill=spill)

    def node(self, n: osmium.osm.Node) -> None:
        self.nodes.node(n)

    def area(self, a: osmium.osm.Area) -> None:
        self.areas.add(a)


@contextmanager
def _short_queues() -> Iterator[None]:
    """libosmium reads its queue sizes from the environment when a reader or writer starts; the caller's
    own settings win."""
    added = [name for name in QUEUES if name not in os.environ]
    os.environ.update({name: QUEUES[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def read_extract(extract: Path, scratch: Path, writer: FeatureWriter) -> PassResult:
    """Run the two reads; node features go to ``writer``, and area features once the caller calls
    ``result.areas.write_spilled(result.spilled_areas)``. Raises what libosmium raises for an unreadable
    file (RuntimeError, ValueError)."""
    scratch.mkdir(parents=True, exist_ok=True)
    index_path, objects, spilled = scratch / LOCATIONS_FILE, scratch / OBJECTS_FILE, scratch / AREAS_FILE
    areas = osmium.area.AreaManager()
    with _short_queues(), osmium.io.Reader(str(extract), osmium.osm.RELATION) as reader:
        # Only relations that can make a feature: libosmium keeps the member ways of every relation it
        # collects until the relation is complete, and a boundary cut by the extract's edge never is.
        osmium.apply(reader, osmium.filter.KeyFilter(*AREA_KEYS), areas.first_pass_handler())
    index = create_index(index_path)
    locations = osmium.NodeLocationsForWays(index)
    locations.ignore_errors()  # a way cut at the extract's edge has refs without a location
    area_filter = osmium.filter.KeyFilter(*AREA_KEYS)
    node_filter = osmium.filter.KeyFilter(*NODE_KEYS)
    node_filter.enable_for(osmium.osm.NODE)
    # A writer pool with a short queue, small buffers and short libosmium queues (QUEUES): with the defaults,
    # the objects and text waiting between the threads grew with the extract up to hundreds of MB whenever
    # one stage fell behind (docs/performance.md).
    with _short_queues(), spilled.open("wb") as spill:
        handler = _FeatureHandler(writer, spill)
        opl = osmium.SimpleWriter(
            osmium.io.File(str(objects), "opl,add_metadata=false"),
            bufsz=WRITE_BUFFER,
            overwrite=True,
            thread_pool=osmium.io.ThreadPool(2, WRITE_QUEUE),
        )
        try:
            with osmium.io.Reader(str(extract)) as reader:
                osmium.apply(
                    reader,
                    locations,
                    areas.second_pass_handler(area_filter, handler),
                    node_filter,
                    handler,
                    osmium.filter.EntityFilter(osmium.osm.WAY | osmium.osm.RELATION),
                    opl,
                )
        finally:
            opl.close()
        handler.areas.flush()
    handler.areas.spill = None
    return PassResult(NodeLocations.of_index(index_path, index), objects, handler.areas, spilled)
