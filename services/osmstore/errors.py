"""Errors of the OSM import, shared by the embedded (importer) and PostGIS (postgis) paths."""

from __future__ import annotations


class ImportFailed(Exception):
    """The extract could not be imported; the message names the file and the cause."""


class StoreUnavailable(ImportFailed):
    """osm2pgsql or PostgreSQL failed on a run (database down or locked, a table missing, disk full, a timeout).
    The same run may succeed later: ``toposm-replicate`` backs off and applies the same diffs again, which
    osm2pgsql tolerates (osm2pgsql-replication does the same after a failed ``--append``)."""
