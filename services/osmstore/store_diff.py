"""Apply an osmChange to a whole embedded store without Spark: the rendering store, then the geometry store.

The two stores share one middle, the geometry store's (render_db): the rendering store's update reads the
state before the diff there and lays the diff over it, so it goes first and the geometry store follows, in
the order the Spark bridge keeps (``spark_bridge.store_job``, which also computes the expiry). Both under
the geometry store's writer lock, so nothing else applies a diff in between. A failure between the two
commits leaves the rendering store one diff ahead; applying the same diff again skips it there (its
sequence or digest is recorded) and completes the geometry store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .geometry import GeometryStore
from .geometry_apply import apply_locked, check_sequence
from .osc_diff import read_diff
from .render_store import apply_osc


def apply_to_store(store_dir: Path, osc_path: Path, *, sequence: int | None = None) -> dict[str, Any]:
    """Apply ``osc_path`` to ``store_dir``'s two stores; returns what each did (``{"render": ..., "geometry":
    ...}``). A diff the geometry store already holds changes neither. Raises RenderStoreError,
    GeometryStoreError (SequenceGap) or UnreadableOsc, with the stores as the message says."""
    geometry = GeometryStore.of_store(store_dir)
    diff = read_diff(Path(osc_path))
    with geometry.locked() as manifest:
        replay = check_sequence(manifest, sequence, diff.sha256)
        if replay is not None:
            return {"render": {"skipped": 1}, "geometry": {"applied": False, "replay": replay.reason}}
        render = apply_osc(store_dir, osc_path, sequence=sequence, sha256=diff.sha256)
        return {"render": render, "geometry": apply_locked(geometry, manifest, diff, sequence)}
