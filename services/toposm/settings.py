"""The TopOSM stack's settings: ``TOPOSM_*`` in the environment, and the options several of its programs share.

Each option shared by programs is defined here once (``stack_option``); a program's settings class names it
with its own default where it needs one (``qbroker.settings`` reads flags, environment and ``--config``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic_settings import SettingsConfigDict

from qbroker.settings import ProgramSettings, UserList, option, shared
from services.toposm import __version__
from services.toposm.tile_store import TileStoreKind

__all__ = ["StackOptions", "StackSettings", "UserList", "check_zooms", "stack_option"]

_UNSET: Any = object()


class StackSettings(ProgramSettings):
    """A program of the TopOSM stack: its own options read from ``TOPOSM_*`` (the bus's still ``QBROKER_*``)."""

    model_config = SettingsConfigDict(env_prefix="TOPOSM_")
    version: ClassVar[str] = __version__


class StackOptions(StackSettings):
    """Every option two or more of the stack's programs take, each once."""

    tile_root: Path = option(
        Path("tiles"), "tile store root (<root>/z/x/y.png, or mod_tile's .meta files)", metavar="DIR"
    )
    tile_store: TileStoreKind = option(
        "png",
        "png: <root>/z/x/y.png; meta: mod_tile's .meta files, <root>/z/h4/h3/h2/h1/h0.meta (the "
        "queuemaster, the renderers and toposm-web must agree)",
    )
    min_zoom: int = option(0, "lowest zoom", metavar="Z", ge=0, le=30)
    max_zoom: int = option(18, "highest zoom", metavar="Z", ge=0, le=30)
    render_log: Path | None = option(
        None, "the queuemaster's render log: one JSON line per finished render", metavar="FILE"
    )
    operator_users: UserList = option(frozenset(), "broker accounts of operators (comma-separated)", metavar="USERS")
    store: Path | None = option(None, "an OSM store directory (toposm-import --store)", metavar="DIR")
    postgis: str | None = option(
        None, "a PostGIS database (libpq DSN; its password better in PGPASSWORD or ~/.pgpass)", metavar="DSN"
    )
    flat_nodes: Path | None = option(
        None, "with --postgis: osm2pgsql's flat-nodes file (node locations)", metavar="FILE"
    )


def check_zooms(min_zoom: int, max_zoom: int) -> None:
    """``--min-zoom`` and ``--max-zoom`` together (each alone is checked by its field)."""
    if min_zoom > max_zoom:
        raise ValueError(f"--min-zoom {min_zoom} is above --max-zoom {max_zoom}")


def stack_option(name: str, default: Any = _UNSET, help: str | None = None) -> Any:  # noqa: A002
    """The shared option ``name`` (its default or ``default``; its help, or ``help`` where a program says more)."""
    field = shared(StackOptions, name, StackOptions.model_fields[name].default if default is _UNSET else default)
    if help is not None:
        field.description = help
    return field
