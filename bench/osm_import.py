"""Import throughput and memory at scale: ``toposm-import`` against osm2pgsql, same files.

For each K (``--k 1,10,50,200``): the real Helsinki extract scaled K times (bench/osm_scale_data.py: K
copies on a grid, ids spread over the real OSM id ranges), imported by ``toposm-import``'s code in a child
process (wall seconds, CPU seconds of the process and its worker, peak RSS of each, store size) and, when
osm2pgsql is installed (bin/ensure-postgis), by ``osm2pgsql --create --slim`` into a fresh PostGIS database
(wall seconds and osm2pgsql's own peak RSS; the PostgreSQL server's memory is not counted). They take
turns per K, the order reversed every other K, so the machine's load falls on all alike. ``--old REV`` also
imports with the importer of git revision REV (exported with ``git archive``), for a before/after ratio.

    .venv/bin/python bench/osm_import.py --k 1,10,50,200 [--work DIR] [--keep] [--old REV] [--no-peer]

Prints one JSON document (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from osm_scale_data import Scale, read_source  # noqa: E402

from harness.osm import helsinki_extract, postgis_database  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# The child reports its own peak RSS (VmHWM: ru_maxrss would count what a forked child inherited before its
# exec) and the geometry worker's (sampled every 50 ms from /proc, the worker being started by Popen), and the
# CPU of both.
_IMPORT = """import json, resource, sys, threading, time
from pathlib import Path
from services.osmstore import geometry_import
from services.osmstore.importer import import_extract
def status(pid, key):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
worker = {"pid": None, "kb": 0}
start = geometry_import.GeometryBuild.__init__
def init(self, *args):
    start(self, *args)
    worker["pid"] = self.process.pid
geometry_import.GeometryBuild.__init__ = init
def sample():
    while True:
        if worker["pid"]:
            worker["kb"] = max(worker["kb"], status(worker["pid"], "VmRSS"))
        time.sleep(0.05)
threading.Thread(target=sample, daemon=True).start()
info = import_extract(Path(sys.argv[1]), Path(sys.argv[2]))
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"counts": info["counts"], "self_rss_kb": status("self", "VmHWM"), "worker_rss_kb": worker["kb"],
                  "cpu": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}))
"""


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def load() -> float:
    return round(os.getloadavg()[0], 1)


def import_ours(extract: Path, store: Path, code: Path) -> dict[str, Any]:
    shutil.rmtree(store, ignore_errors=True)
    os.sync()  # the last run's ~2 GB of writes go to disk now, not during this run
    before = load()
    started = time.perf_counter()
    # cwd too: `python -c` puts the working directory first on sys.path, before PYTHONPATH
    run = subprocess.run(
        [sys.executable, "-c", _IMPORT, str(extract.resolve()), str(store.resolve())],
        capture_output=True,
        text=True,
        cwd=code,
        env={**os.environ, "PYTHONPATH": str(code)},
        check=False,
    )
    seconds = time.perf_counter() - started
    if run.returncode:
        raise SystemExit(f"import of {extract} failed: {run.stderr[-2000:]}")
    out = json.loads(run.stdout.strip().splitlines()[-1])
    objects = sum(out["counts"].values())
    self_mb, worker_mb = out["self_rss_kb"] / 1024, out["worker_rss_kb"] / 1024
    return {
        "objects": objects,
        "seconds": round(seconds, 2),
        "objects_per_second": round(objects / seconds),
        "cpu_seconds": round(out["cpu"], 2),
        "peak_rss_mb": round(self_mb + worker_mb),
        "peak_rss_main_mb": round(self_mb),
        "peak_rss_worker_mb": round(worker_mb),
        "store_mb": round(du(store) / 1e6, 1),
        "load_before": before,
        "load_after": load(),
    }


def import_osm2pgsql(extract: Path, dsn: str, cache_mb: int, processes: int) -> dict[str, Any]:
    before = load()
    started = time.perf_counter()
    child = subprocess.Popen(
        [
            "osm2pgsql",
            "--create",
            "--slim",
            "--cache",
            str(cache_mb),
            "--number-processes",
            str(processes),
            "--log-progress",
            "false",
            "--database",
            dsn,
            str(extract),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert child.stderr is not None
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"osm2pgsql failed on {extract}: {err.decode()[-2000:]}")
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "load_before": before,
        "load_after": load(),
    }


def drop_database(name: str) -> None:
    subprocess.run(
        [
            "psql",
            "-X",
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            f"DROP DATABASE IF EXISTS {name} WITH (FORCE)",
        ],
        capture_output=True,
        check=False,
    )


def old_tree(rev: str, work: Path) -> Path:
    """The repository at ``rev``, exported (not checked out): its importer, run against the same files."""
    dest = work / f"code-{rev}"
    if not dest.is_dir():
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", default="1,10,50,200", help="scale factors, comma-separated")
    p.add_argument("--work", type=Path, help="where the extracts and stores go (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep --work's extracts (and reuse them next time)")
    p.add_argument("--old", metavar="REV", help="also import with the importer of this git revision")
    p.add_argument("--old-max-k", type=int, default=50, help="largest K the --old importer runs (it is slow)")
    p.add_argument("--no-peer", action="store_true", help="do not run osm2pgsql")
    p.add_argument("--osm2pgsql-cache", type=int, default=800, help="osm2pgsql --cache MB (its default)")
    a = p.parse_args()
    ks = [int(v) for v in a.k.split(",")]
    extract = helsinki_extract()
    work = a.work or Path(tempfile.mkdtemp(prefix="osm-import-"))
    work.mkdir(parents=True, exist_ok=True)
    peer = not a.no_peer and shutil.which("osm2pgsql") is not None
    cores = len(os.sched_getaffinity(0))
    out: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "cores_usable": cores,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_before": os.getloadavg(),
        },
        "osm2pgsql": subprocess.run(["osm2pgsql", "--version"], capture_output=True, text=True).stderr.splitlines()[0]
        if peer
        else None,
        "osm2pgsql_args": f"--create --slim --cache {a.osm2pgsql_cache} --number-processes {cores}" if peer else None,
        "sizes": [],
    }
    old = old_tree(a.old, work) if a.old else None
    src = read_source(extract)
    db = f"bench_import_{os.getpid()}"
    try:
        for turn, k in enumerate(ks):
            pbf = work / f"helsinki-x{k}.osm.pbf"
            if not pbf.is_file():
                Scale(src, k).write_pbf(pbf)
            row: dict[str, Any] = {"k": k, "pbf_mb": round(pbf.stat().st_size / 1e6, 1)}
            contenders = ["ours", "osm2pgsql"] if peer else ["ours"]
            if old is not None and k <= a.old_max_k:
                contenders.append("old")
            if turn % 2:
                contenders.reverse()
            for who in contenders:
                if who == "ours":
                    row["ours"] = import_ours(pbf, work / f"store-x{k}", ROOT)
                    shutil.rmtree(work / f"store-x{k}", ignore_errors=True)
                elif who == "old":
                    assert old is not None
                    row["old"] = import_ours(pbf, work / f"store-old-x{k}", old)
                    shutil.rmtree(work / f"store-old-x{k}", ignore_errors=True)
                else:
                    drop_database(db)
                    row["osm2pgsql"] = import_osm2pgsql(pbf, postgis_database(db), a.osm2pgsql_cache, cores)
                    drop_database(db)
                print(json.dumps({"k": k, who: row[who]}), file=sys.stderr, flush=True)
            if "old" in row:
                row["old_over_ours_seconds"] = round(row["old"]["seconds"] / row["ours"]["seconds"], 2)
            row["objects"] = row["ours"]["objects"]
            if peer:
                row["osm2pgsql_over_ours_seconds"] = round(row["osm2pgsql"]["seconds"] / row["ours"]["seconds"], 2)
            out["sizes"].append(row)
    finally:
        if peer:
            drop_database(db)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    out["machine"]["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
