"""Layer datasources: the embedded rendering store (Mapnik ``sqlite``) or an osm2pgsql database (``postgis``).

Both present the same tables and columns to the style (``roads.class``, ``landuse.kind``...): for PostGIS the
subqueries below derive them from osm2pgsql's default columns with the same mapping as ``tags``.
"""

# ruff: noqa: S608 - the SQL here is built from this project's constant tag tables, never from input.
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

from . import tags
from .render_db import RENDER_DB

Source = Path | str  # a store directory, or a PostGIS DSN (postgresql://... or "dbname=... host=...")
WORLD_EXTENT = "-20037508.34,-20037508.34,20037508.34,20037508.34"


def is_postgis(source: Source) -> bool:
    s = str(source)
    return s.startswith(("postgresql://", "postgres://")) or "dbname=" in s


def _params(params: dict[str, str]) -> str:
    body = "".join(f'<Parameter name="{k}">{escape(v)}</Parameter>' for k, v in params.items())
    return f"<Datasource>{body}</Datasource>"


def datasource(source: Source, table: str, order: str | None) -> str:
    if is_postgis(source):
        return _postgis(str(source), table, order)
    path = Path(source) / RENDER_DB
    order_sql = f" ORDER BY {order}" if order else ""
    return _params(
        {
            "type": "sqlite",
            "file": str(path.resolve()),
            "geometry_table": table,
            "geometry_field": "geom",
            "key_field": "fid",
            "extent": WORLD_EXTENT,
            # !intersects! is where the plugin puts its R*Tree lookup; the ORDER BY then runs on the tile's rows only.
            "table": f"(SELECT * FROM {table} WHERE !intersects!{order_sql})",
        }
    )


def connection_params(dsn: str) -> dict[str, str]:
    """libpq URI or keyword DSN -> Mapnik postgis parameters (host, port, user, password, dbname)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        u = urlsplit(dsn)
        out = {
            "host": u.hostname or "",
            "port": str(u.port or ""),
            "user": unquote(u.username or ""),
            "password": unquote(u.password or ""),
            "dbname": unquote(u.path.lstrip("/")),
        }
    else:
        out = dict(part.split("=", 1) for part in dsn.split() if "=" in part)
    return {k: v for k, v in out.items() if v and k in ("host", "port", "user", "password", "dbname")}


def _case(column_of: dict[tuple[str, str], str], default: str = "NULL") -> str:
    whens = " ".join(f"WHEN \"{k}\" = '{v}' THEN '{kind}'" for (k, v), kind in column_of.items())
    return f"(CASE {whens} ELSE {default} END)"


def _flag(column: str) -> str:
    return f"(CASE WHEN \"{column}\" IS NULL OR \"{column}\" IN ('no', 'false', '0') THEN 0 ELSE 1 END)"


def _in(values: Iterable[str]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in sorted(values)) + ")"


def _road_class() -> str:
    return _case({("highway", h): c for h, c in tags.ROAD_CLASS.items()})


def _postgis_query(table: str) -> str:
    if table == "roads":
        z = " ".join(f"WHEN '{c}' THEN {n * 10}" for c, n in tags.ROAD_Z.items())
        return (
            f"SELECT way AS geom, highway AS kind, class, name, ref, {_flag('bridge')} AS bridge, "
            f"{_flag('tunnel')} AS tunnel, 0 AS layer, (CASE class {z} ELSE 0 END) AS z_order FROM "
            f"(SELECT *, {_road_class()} AS class FROM planet_osm_line "
            f"WHERE highway IN {_in(tags.ROAD_CLASS)}) AS r"
        )
    if table == "railways":
        return (
            f"SELECT way AS geom, railway AS kind, name, {_flag('bridge')} AS bridge, "
            f"(CASE WHEN railway = 'subway' THEN 1 ELSE {_flag('tunnel')} END) AS tunnel "
            f"FROM planet_osm_line WHERE railway IN {_in(tags.RAILWAY_KINDS)}"
        )
    if table == "waterways":
        return (
            f"SELECT way AS geom, waterway AS kind, name, {_flag('tunnel')} AS tunnel "
            f"FROM planet_osm_line WHERE waterway IN {_in(tags.WATERWAY_KINDS)}"
        )
    if table == "coastline":
        return "SELECT way AS geom, 'coastline' AS kind FROM planet_osm_line WHERE \"natural\" = 'coastline'"
    if table == "water":
        cond = " OR ".join(f"\"{k}\" = '{v}'" for k, v in sorted(tags.WATER_TAGS))
        return (
            f"SELECT way AS geom, COALESCE(\"natural\", 'water') AS kind, name, way_area AS area "
            f"FROM planet_osm_polygon WHERE {cond}"
        )
    if table == "landuse":
        return (
            f"SELECT * FROM (SELECT way AS geom, {_case(tags.LANDUSE_KIND)} AS kind, name, way_area AS area "
            f"FROM planet_osm_polygon) AS l WHERE kind IS NOT NULL"
        )
    if table == "buildings":
        return (
            'SELECT way AS geom, building AS kind, name, "addr:housenumber" AS housenumber, '
            "way_area AS area FROM planet_osm_polygon WHERE building IS NOT NULL AND building <> 'no'"
        )
    if table == "places":
        rank = " ".join(f"WHEN '{p}' THEN {r}" for p, r in tags.PLACE_RANK.items())
        return (
            f"SELECT way AS geom, place AS kind, name, (CASE place {rank} END) AS rank, "
            f"(CASE WHEN population ~ '^[0-9]+$' THEN population::bigint ELSE 0 END) AS population "
            f"FROM planet_osm_point WHERE place IN {_in(tags.PLACE_RANK)} AND name IS NOT NULL"
        )
    raise ValueError(f"no PostGIS query for table {table!r}")


def _postgis(dsn: str, table: str, order: str | None) -> str:
    order_sql = f" ORDER BY {order}" if order else ""
    return _params(
        {
            "type": "postgis",
            **connection_params(dsn),
            "geometry_field": "geom",
            "srid": "3857",
            "extent": WORLD_EXTENT,
            "table": f"(SELECT * FROM ({_postgis_query(table)}) AS q{order_sql}) AS {table}",
        }
    )


def check_source(source: Source) -> str | None:
    """What is wrong with ``source`` as a rendering source, or None."""
    if is_postgis(source):
        return None if connection_params(str(source)).get("dbname") else f"{source}: DSN names no database"
    if not (Path(source) / RENDER_DB).is_file():
        return f"{source}: not a rendering store (no {RENDER_DB}; build one with toposm-import)"
    return None
