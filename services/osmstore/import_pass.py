"""The import's read of the extract: libosmium's C++ handlers do the per-object work, Python sees few objects.

Two reads of the file, as libosmium's multipolygon assembly needs (its relations first):

1. relations: the area assembler collects the multipolygon relations with area tags and the ways they need.
2. everything: ``NodeLocationsForWays`` stores every node location in the on-disk index
   (``node_locations``) and hands the ways their locations; the area assembler builds areas from closed
   ways and the collected relations; a C++ key filter lets only the areas with tags that can make a
   feature reach Python (``area_features``: their WKB written by libosmium, projected a batch at a time),
   and only nodes with a ``place`` tag (the only node features, ``FeatureExtractor.node``); libosmium's
   OPL writer writes every way and relation to a text file that ``opl_columns`` reads back as Arrow
   columns.

What Python does per object here is bounded by the features, not by the extract's nodes, ways and members.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import osmium

from . import tags as osm_tags
from .area_features import AreaFeatures
from .features import FeatureExtractor
from .node_locations import NodeLocations, create_index
from .render_db import FeatureWriter

LOCATIONS_FILE = "locations.idx"
OBJECTS_FILE = "objects.opl"
# The keys whose tags can make an area or node feature (tags.area_features, tags.node_features).
AREA_KEYS = sorted({"building"} | {k for k, _ in osm_tags.LANDUSE_KIND} | {k for k, _ in osm_tags.WATER_TAGS})
NODE_KEYS = ["place"]
WRITE_QUEUE = 4  # OPL buffers formatted ahead of the disk


@dataclass
class PassResult:
    locations: NodeLocations
    objects: Path  # OPL of the ways and relations


class _FeatureHandler(osmium.SimpleHandler):
    """Sees only what the key filters let through: place nodes and candidate areas."""

    def __init__(self, writer: FeatureWriter) -> None:
        super().__init__()
        self.nodes = FeatureExtractor(writer)
        self.areas = AreaFeatures(writer)

    def node(self, n: osmium.osm.Node) -> None:
        self.nodes.node(n)

    def area(self, a: osmium.osm.Area) -> None:
        self.areas.add(a)


def read_extract(extract: Path, scratch: Path, writer: FeatureWriter) -> PassResult:
    """Run the two reads; node and area features go to ``writer``. Raises what libosmium raises
    for an unreadable file (RuntimeError, ValueError)."""
    scratch.mkdir(parents=True, exist_ok=True)
    index_path, objects = scratch / LOCATIONS_FILE, scratch / OBJECTS_FILE
    areas = osmium.area.AreaManager()
    with osmium.io.Reader(str(extract), osmium.osm.RELATION) as reader:
        # Only relations that can make a feature: libosmium keeps the member ways of every relation it
        # collects until the relation is complete, and a boundary cut by the extract's edge never is.
        osmium.apply(reader, osmium.filter.KeyFilter(*AREA_KEYS), areas.first_pass_handler())
    index = create_index(index_path)
    locations = osmium.NodeLocationsForWays(index)
    locations.ignore_errors()  # a way cut at the extract's edge has refs without a location
    handler = _FeatureHandler(writer)
    area_filter = osmium.filter.KeyFilter(*AREA_KEYS)
    node_filter = osmium.filter.KeyFilter(*NODE_KEYS)
    node_filter.enable_for(osmium.osm.NODE)
    # A writer pool with a short queue: with the default one, the text waiting to be written grew with the
    # extract whenever the disk fell behind the reader (432 MB at K=200 against 281 MB; docs/performance.md).
    opl = osmium.SimpleWriter(osmium.io.File(str(objects), "opl,add_metadata=false"), overwrite=True,
                              thread_pool=osmium.io.ThreadPool(2, WRITE_QUEUE))
    try:
        with osmium.io.Reader(str(extract)) as reader:
            osmium.apply(reader, locations, areas.second_pass_handler(area_filter, handler), node_filter, handler,
                         osmium.filter.EntityFilter(osmium.osm.WAY | osmium.osm.RELATION), opl)
    finally:
        opl.close()
    handler.areas.flush()
    return PassResult(NodeLocations.of_index(index_path, index), objects)
