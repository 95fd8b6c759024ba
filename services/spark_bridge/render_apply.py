"""A store job's rendering store update, in a process of its own while Spark computes the expiry.

``apply_osc`` is Python and SQLite (1-2 s for a 10,000-object diff); run after the Spark part, it added up
with it. In a thread beside the job it fought the job's own Python (py4j calls, the resolution's
dictionaries) for the GIL, and the two were barely faster than one after the other. So it runs in a
child interpreter (``python -m services.spark_bridge.render_apply``, importing only the rendering store)
and the two really overlap. The child builds the whole transaction, says ``prepared`` and waits; the job
answers ``commit`` once the expiry succeeded and no guard tripped, ``rollback`` on anything else, so a
failed, refused or cancelled job leaves the rendering store as it was, and the commits keep their order
(rendering store, then publishing, then the geometry store).

Protocol, one JSON document per line: the child writes ``{"prepared": true}`` (only when it has a
transaction to commit), then ``{"done": {...what changed}}`` or ``{"error": "message"}``; the parent
writes ``"commit"`` or ``"rollback"`` to its stdin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from services.osmstore.render_store import RenderStoreError, apply_osc

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding services/


class RenderApply:
    """Starts the child at once; ``commit()`` or ``abandon()`` ends it (exactly one of them, once)."""

    def __init__(self, store_dir: Path, osc_path: Path, sequence: int | None, sha256: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_ROOT),
                                                                         os.environ.get("PYTHONPATH")]))}
        seq = "" if sequence is None else str(sequence)
        args = [sys.executable, "-m", __name__, str(store_dir), str(osc_path), seq, sha256]
        self._child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)

    def _finish(self, verdict: str) -> dict[str, Any]:
        assert self._child.stdin is not None and self._child.stdout is not None
        try:
            word = json.loads(self._child.stdout.readline() or '{"error": "stopped without an answer"}')
            if word.get("prepared"):
                self._child.stdin.write(verdict + "\n")
                self._child.stdin.flush()
                word = json.loads(self._child.stdout.readline() or '{"error": "stopped without an answer"}')
        except (OSError, ValueError) as exc:
            word = {"error": f"the rendering store update failed ({type(exc).__name__})"}
        finally:
            self._child.stdin.close()
            self._child.wait()
            self._child.stdout.close()
        return word

    def commit(self) -> dict[str, int]:
        word = self._finish("commit")
        if "error" in word:
            raise RenderStoreError(str(word["error"]))
        return dict(word["done"])

    def abandon(self) -> None:
        self._finish("rollback")


def _serve(argv: list[str], proto: IO[str]) -> None:
    store_dir, osc_path, sequence, sha256 = argv

    def commit_if() -> bool:
        proto.write(json.dumps({"prepared": True}) + "\n")
        proto.flush()
        return sys.stdin.readline().strip() == "commit"

    try:
        done = apply_osc(Path(store_dir), Path(osc_path), sequence=int(sequence) if sequence else None,
                         sha256=sha256, commit_if=commit_if)
    except Exception as exc:  # noqa: BLE001 - every failure is the parent's to report
        message = str(exc) if isinstance(exc, RenderStoreError) else f"{type(exc).__name__}: {exc}"
        proto.write(json.dumps({"error": message}) + "\n")
    else:
        proto.write(json.dumps({"done": done}) + "\n")
    proto.flush()


if __name__ == "__main__":
    # The protocol keeps the real stdout; anything else printed goes to stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _serve(sys.argv[1:], protocol)
