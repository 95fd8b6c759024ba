"""The sea of a store, rebuilt in the background after the diffs that changed its coastline.

A diff that touches a coastline way marks the rendering store's sea stale instead of rebuilding it
(services.osmstore.coastline: the sea is computed from the whole coastline, which grows with the store).
After such a store job has replied, this rebuilds it in a child process (``python -m
services.osmstore.coastline``: Python work that would otherwise hold the bridge's GIL against the next
job) and then publishes that job's metatiles again: tiles re-rendered from the first expiry may still
show the old sea along the edited coast. One refresh runs at a time per store; diffs that come in while
it runs are served by one more refresh after it, their tiles published together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import structlog

from services.spark_bridge.expire_collect import publish_sorted

log = structlog.get_logger("spark_bridge.sea")

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding services/


@dataclass(frozen=True)
class _Expiry:
    metatiles: pa.Table  # z, mx, my, n: what the diff expired
    publish: Callable[[str], None] | None  # None: the job published nothing
    max_bytes: int
    max_tiles: int


class SeaRefresher:
    """One store's background sea refresh; ``request`` after a diff that marked the sea stale."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = Path(store_dir)
        self._lock = threading.Lock()
        self._waiting: list[_Expiry] = []
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.refreshes = 0  # children run (for tests and logs)

    def request(
        self, metatiles: pa.Table, publish: Callable[[str], None] | None, *, max_bytes: int, max_tiles: int
    ) -> None:
        with self._lock:
            self._waiting.append(_Expiry(metatiles, publish, max_bytes, max_tiles))
            self._idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"sea {self.store_dir.name}", daemon=True)
                self._thread.start()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """True once no refresh is running or waiting (False after ``timeout`` seconds)."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                batch, self._waiting = self._waiting, []
                if not batch:
                    self._thread = None
                    self._idle.set()
                    return
            if self._refresh():
                for expiry in batch:
                    self._publish(expiry)

    def _refresh(self) -> bool:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
        }
        done = subprocess.run(
            [sys.executable, "-m", "services.osmstore.coastline", str(self.store_dir)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        self.refreshes += 1
        if done.returncode:
            log.warning(
                "sea refresh failed",
                store=self.store_dir.name,
                status=done.returncode,
                error=done.stderr.strip().splitlines()[-1:],
            )
            return False
        log.info("sea refreshed", store=self.store_dir.name, **json.loads(done.stdout))
        return True

    def _publish(self, expiry: _Expiry) -> None:
        if expiry.publish is None or not expiry.metatiles.num_rows:
            return
        try:
            publish_sorted(
                expiry.metatiles,
                expiry.publish,
                max_bytes=expiry.max_bytes,
                max_tiles=expiry.max_tiles,
                check=lambda _: None,
            )
        except Exception as exc:  # noqa: BLE001 - a bridge stopping meanwhile; the sea itself is rebuilt
            log.warning("sea refresh: expiry not published", store=self.store_dir.name, error=str(exc)[:200])

    def close(self, timeout: float = 600.0) -> None:
        """Let a running refresh finish (a bridge stopping); its expirations may no longer go out."""
        self.wait_idle(timeout)
