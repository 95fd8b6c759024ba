"""Time ``apply_osc`` alone on the Helsinki store with the store-diff benchmark's diff, old code vs new.

Each measurement runs in a fresh process (``--one``) on a fresh copy of the store; old (a ``git archive``
of ``--old``'s services/) and new (the working tree) alternate so the shared machine's load hits both.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _one(code: str | None, store: Path, diff: Path) -> None:
    if code:
        sys.path.insert(0, code)
    sys.path.insert(0, str(ROOT)) if not code else sys.path.append(str(ROOT))
    from services.osmstore.render_store import apply_osc

    t0 = time.perf_counter()
    stats = apply_osc(store, diff, sequence=1)
    print(json.dumps({"seconds": time.perf_counter() - t0, "stats": stats}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work", type=Path, default=Path("/tmp/render-apply-work"))
    p.add_argument("--old", help="directory holding the old services/ (from git archive)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        code, store, diff = args.one
        _one(code or None, Path(store), Path(diff))
        return
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from osm_expire import make_diff

    from harness.osm import read_extract
    from services.osmstore.importer import import_extract

    helsinki = ROOT / "var" / "osm" / "Helsinki.osm.pbf"
    base = args.work / "helsinki"
    if not base.exists():
        import_extract(helsinki, base)
    diff = args.work / f"diff-{args.objects}-{args.seed}.osc.gz"
    if not diff.exists():
        diff.write_bytes(gzip.compress(make_diff(read_extract(helsinki), args.objects, seed=args.seed).encode()))
    variants = [("old", args.old), ("new", None)] if args.old else [("new", None)]
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    for _ in range(args.runs):
        for name, code in variants:
            live = args.work / f"live-{name}"
            shutil.rmtree(live, ignore_errors=True)
            shutil.copytree(base, live)
            out = subprocess.run(
                [sys.executable, __file__, "--one", code or "", str(live), str(diff)],
                check=True,
                capture_output=True,
                text=True,
                cwd=ROOT,
            ).stdout
            times[name].append(json.loads(out.splitlines()[-1])["seconds"])
    print(
        json.dumps(
            {
                "load": os.getloadavg(),
                **{
                    name: {"median": statistics.median(ts), "min": min(ts), "max": max(ts), "runs": ts}
                    for name, ts in times.items()
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
