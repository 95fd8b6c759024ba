"""Tile hits over HTTP: ``toposm-web --front nginx`` against Debian's nginx serving the same files.

One run, side by side, same machine, same load generator (Debian's ``wrk``, keep-alive, a random mix of the
tile root's tiles over several zooms): plain nginx with a static configuration (the peer), then
``toposm-web --port P --tile-root DIR --front nginx`` (what an operator runs: whatever answers on P counts),
both running throughout and taking turns (who goes first alternating), ``--rounds`` times at each
connection count; then, for context, ``toposm-web`` without a front. Prints JSON: requests/s and
latency percentiles of each, and the ratios front/nginx.

    bin/ensure-nginx && .venv/bin/python bench/tiles_http.py            # tiles rendered for the bench
    .venv/bin/python bench/tiles_http.py --tile-root var/demo/tiles      # or an existing tile root

toposm-web needs RabbitMQ (``QBROKER_URL``, default amqp://guest:guest@127.0.0.1:5672/). The bench starts
and stops every server itself and sends traffic to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.tiles.renderer.backends.testpattern import TestPatternBackend
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Metatile
from services.web.front import free_port, make_runtime_dir, nginx_static_preamble, worker_account

BIN = Path(sys.executable).parent
# wrk's Lua: a random tile of the list per request, and the summary as one JSON line at the end.
WRK_SCRIPT = """
local paths = {%s}
math.randomseed(%d)
request = function() return wrk.format("GET", paths[math.random(#paths)]) end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests": %%d, "duration_us": %%d, "errors": %%d, "non_2xx": %%d, '
    .. '"p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "max_us": %%d}\\n', summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
"""
PEER_SERVER = """
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location /tiles/ {{ alias {root}/; }}
    }}
}}
"""


def render_root(root: Path, zooms: range, per_zoom: int) -> None:
    """Test-pattern metatiles at each zoom around one place (Portland, OR), as the renderers write them."""
    store, backend = TileStore(root), TestPatternBackend()
    for z in zooms:
        cx, cy = int(0.1786 * 2**z) >> 3, int(0.3640 * 2**z) >> 3  # metatile of about 45.5N 122.7W
        for i in range(per_zoom):
            store.write(backend.render(Metatile(z, cx + i % 3, cy + i // 3)))


def tile_paths(root: Path, limit: int, seed: int) -> list[str]:
    paths = [f"/tiles/{p.relative_to(root).as_posix()}" for p in root.glob("[0-9]*/[0-9]*/[0-9]*.png")]
    random.Random(seed).shuffle(paths)
    return paths[:limit]


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url, timeout=2).read()  # noqa: S310 - our own server on 127.0.0.1
            return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:g}s")


@contextlib.contextmanager
def server(args: list[str], url: str, log: Path) -> Iterator[None]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(url, proc)
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def nginx_peer(root: Path, work: Path, port: int) -> tuple[list[str], Path]:
    """A plain nginx serving the tile root as static files: the front's own process and static-file
    settings (``nginx_static_preamble``), a bare ``alias`` instead of the front's tile location."""
    run = work / "peer"
    run.mkdir(parents=True)
    user, uid, gid = worker_account(root)
    make_runtime_dir(run, uid, gid)
    conf = run / "nginx.conf"
    conf.write_text(nginx_static_preamble(run, user) + PEER_SERVER.format(port=port, root=root.resolve()))
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    return [nginx, "-p", str(run), "-c", str(conf), "-e", str(run / "error.log")], run


def wrk(url: str, script: Path, connections: int, seconds: float, threads: int) -> dict[str, Any]:
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    ).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("WRKJSON "))
    result: dict[str, Any] = json.loads(line.removeprefix("WRKJSON "))
    result["rps"] = round(result["requests"] / (result["duration_us"] / 1e6), 1)
    return result


def measure(name: str, port: int, script: Path, args: argparse.Namespace, connections: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    wrk(url, script, connections, 1, args.threads)  # warm-up: page cache, keep-alive pools, workers
    result = wrk(url, script, connections, args.seconds, args.threads)
    if result["non_2xx"] or result["errors"]:
        print(
            f"warning: {name} at {connections} connections: {result['non_2xx']} non-2xx, "
            f"{result['errors']} socket errors",
            file=sys.stderr,
        )
    return result


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tile-root", type=Path, default=None, help="serve this tile root (default: render one)")
    p.add_argument("--connections", type=int, nargs="+", default=[32, 256])
    p.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    p.add_argument("--rounds", type=int, default=2, help="peer and front alternate this many times")
    p.add_argument("--threads", type=int, default=2, help="wrk threads")
    p.add_argument("--paths", type=int, default=2000, help="distinct tiles requested")
    p.add_argument("--no-plain", action="store_true", help="skip toposm-web without a front")
    args = p.parse_args(argv)
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            sys.exit(f"tiles_http: {tool} is missing: run bin/ensure-nginx")
    work = Path(tempfile.mkdtemp(prefix="tiles-http-"))
    work.chmod(0o755)
    try:
        root = args.tile_root
        if root is None:
            root = work / "tiles"
            render_root(root, range(10, 17), 6)
        paths = tile_paths(root, args.paths, 1)
        if not paths:
            sys.exit(f"tiles_http: no z/x/y.png tiles under {root}")
        script = work / "tiles.lua"
        script.write_text(WRK_SCRIPT % (", ".join(json.dumps(x) for x in paths), 1))
        sizes = [(root / x.removeprefix("/tiles/")).stat().st_size for x in paths]
        report: dict[str, Any] = {
            "bench": "tiles_http",
            "nproc": os.cpu_count(),
            "loadavg_before": loadavg(),
            "tiles": len(paths),
            "zooms": sorted({int(x.split("/")[2]) for x in paths}),
            "mean_tile_bytes": round(sum(sizes) / len(sizes)),
            "seconds": args.seconds,
            "wrk_threads": args.threads,
            "runs": [],
        }
        peer_port, front_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        peer_cmd, _ = nginx_peer(root, work, peer_port)
        front_cmd = [
            str(BIN / "toposm-web"),
            "--tile-root",
            str(root),
            "--port",
            str(front_port),
            "--front",
            "nginx",
            "--poll-interval",
            "5",
        ]
        ports = {"nginx": peer_port, "front": front_port}
        # Both run throughout and take turns, who goes first alternating: a neighbour's load that rises or
        # falls during a pair then favours each side in turn (the machine is shared).
        with (
            server(peer_cmd, f"http://127.0.0.1:{peer_port}{paths[0]}", work / "peer.log"),
            server(front_cmd, f"http://127.0.0.1:{front_port}/api/status", work / "front.log"),
        ):
            for rnd in range(args.rounds):
                for conns in args.connections:
                    run: dict[str, Any] = {"round": rnd, "connections": conns}
                    for name in ("nginx", "front") if rnd % 2 == 0 else ("front", "nginx"):
                        run[name] = measure(name, ports[name], script, args, conns)
                    run["front_rps_ratio"] = round(run["front"]["rps"] / run["nginx"]["rps"], 3)
                    run["front_p99_ratio"] = round(run["front"]["p99_us"] / max(run["nginx"]["p99_us"], 1), 3)
                    report["runs"].append(run)
        if not args.no_plain:  # context: toposm-web answering the hits itself, as before the front
            port = free_port("127.0.0.1")
            plain = [str(BIN / "toposm-web"), "--tile-root", str(root), "--port", str(port), "--poll-interval", "5"]
            with server(plain, f"http://127.0.0.1:{port}/api/status", work / "plain.log"):
                report["plain"] = {c: measure("plain", port, script, args, c) for c in args.connections}
            first = {r["connections"]: r["nginx"]["rps"] for r in report["runs"] if r["round"] == 0}
            report["plain_rps_ratio"] = {c: round(report["plain"][c]["rps"] / first[c], 3) for c in args.connections}
        for key in ("front_rps_ratio", "front_p99_ratio"):
            for conns in args.connections:
                values = sorted(r[key] for r in report["runs"] if r["connections"] == conns)
                report[f"{key}_c{conns}"] = {"min": values[0], "median": values[len(values) // 2], "max": values[-1]}
        report["loadavg_after"] = loadavg()
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
