"""toposm-replicate's HTTP client on 127.0.0.1: one large diff downloaded (MB/s), and a batch of small diffs
fetched and merged (seconds). Prints JSON. Compare two versions by running each checkout's copy in turn.

    .venv/bin/python bench/replicate_http.py [--diff-mb 64] [--diffs 10] [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.osm import node_xml, osc, publish  # noqa: E402
from services.osmstore.replication import diff_path  # noqa: E402
from services.replicate.batch import build_batch  # noqa: E402
from services.replicate.source import HttpSource  # noqa: E402


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


async def measure(url: str, spool: Path, a: argparse.Namespace) -> dict[str, float]:
    source = HttpSource(url)
    try:
        download, batch = [], []
        for _ in range(a.repeat):
            started = time.perf_counter()
            assert len(await source.diff(1_000_000)) == a.diff_mb << 20
            download.append(time.perf_counter() - started)
            started = time.perf_counter()
            merged = await build_batch(source, 1, a.diffs, spool, published=a.diffs)
            batch.append(time.perf_counter() - started)
            assert (merged.first, merged.last) == (1, a.diffs)
            merged.discard()
    finally:
        await source.close()
    return {
        "download_mb_per_s": round(a.diff_mb / statistics.median(download), 1),
        "batch_s": round(statistics.median(batch), 3),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--diff-mb", type=int, default=64)
    p.add_argument("--diffs", type=int, default=10)
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "mirror"
        for seq in range(1, a.diffs + 1):  # ~100 KB of gzip each, a minutely diff's order
            first = seq * 20_000
            publish(
                root,
                seq,
                osc(modify=[node_xml(n, 24.9 + n * 1e-7, 60.1, version=seq + 1) for n in range(first, first + 20_000)]),
            )
        big = diff_path(root, 1_000_000)
        big.parent.mkdir(parents=True)
        big.write_bytes(os.urandom(a.diff_mb << 20))
        server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            result = asyncio.run(measure(f"http://127.0.0.1:{server.server_address[1]}/", Path(tmp) / "spool", a))
        finally:
            server.shutdown()
    print(json.dumps({**result, "diff_mb": a.diff_mb, "diffs": a.diffs, "repeat": a.repeat}))


if __name__ == "__main__":
    main()
