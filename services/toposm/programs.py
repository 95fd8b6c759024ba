"""The TopOSM stack's console scripts (services/pyproject.toml): each names the extra its program needs.

Run without it, a script prints one line naming ``pip install 'toposm-stack[<extra>]'`` and exits 64 (usage),
never a traceback; ``--version`` answers the stack's version (qbroker.cli.launch does both).
"""

from __future__ import annotations

from collections.abc import Sequence

from qbroker.cli.launch import launch
from services.toposm import __version__

DISTRIBUTION = "toposm-stack"
# extra -> the top-level modules its program imports at start (services/pyproject.toml lists the packages)
EXTRA_MODULES: dict[str, Sequence[str]] = {
    "render": ("PIL", "numpy", "pyarrow"),
    "spark": ("pyspark", "osmium", "numpy", "pyarrow", "matplotlib"),
    "web": ("aiohttp", "limits"),
    "import": ("numpy", "osmium", "pyarrow"),
    "replicate": ("aiohttp", "numpy", "osmium", "pyarrow"),
}


def _run(prog: str, target: str, extra: str | None = None) -> None:
    needs = None if extra is None else (extra, f"{DISTRIBUTION}[{extra}]", EXTRA_MODULES[extra])
    launch(prog, __version__, target, extra=needs)


def queuemaster() -> None:
    _run("toposm-queuemaster", "services.tiles.queuemaster.main:main")


def renderer() -> None:
    _run("toposm-renderer", "services.tiles.renderer.main:main", "render")


def render_list() -> None:
    _run("toposm-render-list", "services.tiles.render_list.main:main")


def spark_bridge() -> None:
    _run("qbroker-spark-bridge", "services.spark_bridge.main:main", "spark")


def web() -> None:
    _run("toposm-web", "services.web.main:main", "web")


def osm_import() -> None:
    _run("toposm-import", "services.osmstore.importer:main", "import")


def replicate() -> None:
    _run("toposm-replicate", "services.replicate.main:main", "replicate")
