"""A unit's start-up on RabbitMQ, an older qbroker against this one: connect, the shared exchanges and queues,
the reply, alert and dead-letter consumers; prints JSON.

    .venv/bin/python bench/unit_start.py --old 7a57b96 [--rounds 7] [--starts 20]

In a vhost of its own, with the shared topology declared once before timing (as ``qbroker provision`` or a first
unit leaves it), each tree starts and stops a unit ``--starts`` times in a fresh process (this script with
``--child``), as two accounts: ``guest`` (may configure everything: the development bus) and an account with
the ``client`` role's permissions *as that tree computes them* (the old tree's may configure the shared names,
the new tree's may not). Old and new alternate within a round; the ratio that counts is taken within a round
(docs/performance.md). The median start is the figure: one start is a few round trips, so the machine's
noise shows in the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.broker import create_vhost, delete_vhost, rabbitmqctl, url_for_vhost  # noqa: E402


def _child_permissions(tree: str) -> None:
    sys.path.insert(0, tree)
    from qbroker.cli.deployment import permissions_for
    from qbroker.cli.roles import load_roles

    roles = load_roles()
    perms = permissions_for(roles["client"], roles, "")
    print(json.dumps([perms.configure, perms.write, perms.read]))


def _child_starts(tree: str, url: str, starts: int) -> None:
    sys.path.insert(0, tree)
    import asyncio

    from qbroker import Config, Unit

    async def main() -> list[float]:
        took = []
        for _ in range(starts + 1):
            unit = Unit("bench.start", config=Config(url=url, debugger_wait=0))
            began = time.perf_counter()
            await unit.start()
            took.append((time.perf_counter() - began) * 1000)
            await unit.stop(drain_timeout=0)
        return took[1:]  # the first pays for imports and the first connection's TLS-free handshake warm-up

    print(json.dumps(asyncio.run(main())))


def _run(*args: str) -> str:
    env = {**os.environ, "QBROKER_LOG_LEVEL": "WARNING", "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env, timeout=600, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def _account(vhost: str, tree: str, name: str) -> str:
    configure, write, read = json.loads(_run("--child-perms", tree))
    rabbitmqctl("add_user", name, "bench")
    rabbitmqctl("set_permissions", "-p", vhost, name, configure, write, read)
    return url_for_vhost(vhost).replace("guest:guest@", f"{name}:bench@")


def _spread(values: list[float], digits: int) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-perms":
        _child_permissions(sys.argv[2])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child_starts(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the commit whose qbroker to compare with")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--starts", type=int, default=20)
    args = parser.parse_args()
    vhost = create_vhost("qbroker-bench-start")
    tag = uuid.uuid4().hex[:6]
    users = [f"bench-{tag}-old", f"bench-{tag}-new"]
    load_before = os.getloadavg()
    medians: dict[str, list[float]] = {f"{tree}_{who}": [] for tree in ("old", "new") for who in ("guest", "client")}
    try:
        with tempfile.TemporaryDirectory() as old_tree:
            archive = subprocess.run(
                ["git", "archive", args.old, "qbroker", "services"], cwd=ROOT, capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", old_tree], input=archive.stdout, check=True)
            trees = {"old": old_tree, "new": str(ROOT)}
            urls = {"old": _account(vhost, old_tree, users[0]), "new": _account(vhost, str(ROOT), users[1])}
            _run("--child", str(ROOT), url_for_vhost(vhost), "1")  # the topology, declared once
            for round_no in range(args.rounds):
                order = [(tree, who) for tree in ("old", "new") for who in ("guest", "client")]
                if round_no % 2:
                    order.reverse()
                for tree, who in order:
                    url = url_for_vhost(vhost) if who == "guest" else urls[tree]
                    took = json.loads(_run("--child", trees[tree], url, str(args.starts)))
                    medians[f"{tree}_{who}"].append(statistics.median(took))
                print(
                    f"round {round_no + 1}: " + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in medians.items()),
                    file=sys.stderr,
                )
    finally:
        for user in users:
            rabbitmqctl("delete_user", user, check=False)
        delete_vhost(vhost)
    ratios = {
        who: [n / o for n, o in zip(medians[f"new_{who}"], medians[f"old_{who}"], strict=True)]
        for who in ("guest", "client")
    }
    print(
        json.dumps(
            {
                "old": args.old,
                "rounds": args.rounds,
                "starts": args.starts,
                "nproc": os.cpu_count(),
                "load_before": load_before,
                "load_after": os.getloadavg(),
                **{f"{key}_start_ms": _spread(values, 1) for key, values in medians.items()},
                **{f"new/old start ({who})": _spread(values, 3) for who, values in ratios.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
