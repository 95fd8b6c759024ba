"""Errors of the OSM import, shared by the embedded (importer) and PostGIS (postgis) paths."""

from __future__ import annotations


class ImportFailed(Exception):
    """The extract could not be imported; the message names the file and the cause."""
