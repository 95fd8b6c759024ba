"""A three-node RabbitMQ cluster on this machine, and what quorum queues cost on it; prints JSON.

    .venv/bin/python bench/rabbitmq_cluster.py start [--dir DIR] [--nodes 3]   # prints the nodes and QBROKER_URL
    .venv/bin/python bench/rabbitmq_cluster.py stop --dir DIR
    .venv/bin/python bench/rabbitmq_cluster.py bench [--calls 1000] [--concurrency 32] [--rounds 4]

``start`` leaves the nodes running (names, ports and data under DIR, a fresh temp dir by default) until
``stop``; Debian's rabbitmq-server, never the user's broker (harness/rabbitmq_cluster.py). ``bench`` starts a
cluster, measures calls/s and latency with qbroker's queues classic and quorum (``QBROKER_QUEUE_TYPE``), plain
and guaranteed (persistent, confirmed), sequential and concurrent, in one process over node 1, the two types
taking turns round after round (medians and the range of the per-round ratios); then kills the
node leading the quorum request queue and times how long the next call takes to be answered (failover over
the URL list, leader election, re-declaration); then stops the cluster. Run at normal priority and read the
ratios: three Erlang VMs share the machine with the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.rabbitmq_cluster import Cluster, start_cluster, stop_cluster  # noqa: E402
from qbroker import Config, QBrokerError, Unit  # noqa: E402


def _config(cluster: Cluster, queue_type: str, prefix: str, durable_reply_queue: bool = False) -> Config:
    return Config(
        url=cluster.url(0),
        queue_type=queue_type,
        exchange_prefix=prefix,
        heartbeat=5,
        reconnect_backoff_max=0.5,
        connect_timeout=2,
        durable_reply_queue=durable_reply_queue,
    )


async def _measure(client: Unit, calls: int, concurrency: int, guarantee: bool) -> dict[str, Any]:
    latencies = []
    started = time.perf_counter()
    for n in range(calls):
        t = time.perf_counter()
        await client.call("bench.echo", {"n": n}, guarantee=guarantee, timeout=30)
        latencies.append(time.perf_counter() - t)
    sequential = calls / (time.perf_counter() - started)
    gate = asyncio.Semaphore(concurrency)

    async def one(n: int) -> None:
        async with gate:
            await client.call("bench.echo", {"n": n}, guarantee=guarantee, timeout=60)

    started = time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(calls * 4)))
    concurrent = calls * 4 / (time.perf_counter() - started)
    latencies.sort()
    return {
        "sequential_calls_per_s": round(sequential),
        f"concurrent{concurrency}_calls_per_s": round(concurrent),
        "sequential_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "sequential_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
    }


async def _rates(cluster: Cluster, calls: int, concurrency: int, rounds: int) -> dict[str, Any]:
    """Both queue types side by side (servers and clients up throughout), measured in alternating order round
    after round, so each round's quorum/classic ratio compares the same moment of a shared machine."""
    units: list[Unit] = []
    clients: dict[tuple[str, bool], Unit] = {}
    for queue_type in ("classic", "quorum"):
        prefix = f"bench.{queue_type}."
        server = Unit("bench.server", config=_config(cluster, queue_type, prefix))

        @server.rpc("bench.echo", prefetch=256)
        async def echo(n: int) -> int:
            return n

        units.append(server)
        for guarantee in (False, True):
            # A guaranteed call's reply queue must outlive the caller's node too: durable (a quorum queue when
            # the rest are); a plain call's is the usual exclusive one.
            clients[queue_type, guarantee] = Unit(
                "bench.client", config=_config(cluster, queue_type, prefix, durable_reply_queue=guarantee)
            )
            units.append(clients[queue_type, guarantee])
    for unit in units:
        await unit.start()
    figures: dict[str, list[dict[str, Any]]] = {}
    try:
        for r in range(rounds):
            order = [("classic", "quorum"), ("quorum", "classic")][r % 2]
            for guarantee in (False, True):
                for queue_type in order:
                    key = f"{queue_type}.{'guaranteed' if guarantee else 'plain'}"
                    figures.setdefault(key, []).append(
                        await _measure(clients[queue_type, guarantee], calls, concurrency, guarantee)
                    )
    finally:
        for unit in reversed(units):
            await unit.stop()
    out: dict[str, Any] = {"rounds": figures, "median": {}, "quorum_over_classic": {}}
    for key, runs in figures.items():
        out["median"][key] = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    for kind in ("plain", "guaranteed"):
        for name in figures[f"classic.{kind}"][0]:
            if name.endswith("per_s"):
                ratios = sorted(
                    q[name] / c[name]
                    for q, c in zip(figures[f"quorum.{kind}"], figures[f"classic.{kind}"], strict=True)
                )
                out["quorum_over_classic"][f"{kind}.{name}"] = {
                    "median": round(statistics.median(ratios), 2),
                    "range": [round(ratios[0], 2), round(ratios[-1], 2)],
                }
    return out


async def _failover(cluster: Cluster) -> dict[str, Any]:
    """Kill the node leading the (quorum) request queue and the units' node; time the next answered call."""
    prefix = "bench.failover."
    server = Unit("bench.server", config=_config(cluster, "quorum", prefix))

    @server.rpc("bench.echo")
    async def echo(n: int) -> int:
        return n

    client = Unit("bench.client", config=_config(cluster, "quorum", prefix, durable_reply_queue=True))
    await server.start()
    await client.start()
    try:
        await client.call("bench.echo", {"n": 0}, timeout=30)
        leader = cluster.queue_leader(f"{prefix}rpc_bench.echo")
        killed = time.perf_counter()
        await asyncio.to_thread(cluster.kill, cluster.index_of(leader or cluster.nodes[0].name))
        attempts = 0
        while True:
            attempts += 1
            try:
                await client.call("bench.echo", {"n": 1}, timeout=5)
                break
            except QBrokerError:
                await asyncio.sleep(0.05)
        answered = time.perf_counter() - killed
        return {
            "killed": leader,
            "first_answer_after_s": round(answered, 2),
            "calls_tried": attempts,
            "new_leader": cluster.queue_leader(f"{prefix}rpc_bench.echo"),
        }
    finally:
        await client.stop(drain_timeout=1)
        await server.stop(drain_timeout=1)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    cluster = start_cluster(args.nodes)
    boot = time.perf_counter() - started
    try:
        result: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_before": os.getloadavg()},
            "nodes": args.nodes,
            "cluster_start_s": round(boot, 1),
            "calls": args.calls,
        }
        result.update(asyncio.run(_rates(cluster, args.calls, args.concurrency, args.rounds)))
        result["failover"] = asyncio.run(_failover(cluster))
        result["machine"]["load_after"] = os.getloadavg()
        return result
    finally:
        stop_cluster(cluster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a cluster and leave it running")
    start.add_argument("--dir", type=Path, default=None)
    start.add_argument("--nodes", type=int, default=3)
    stop = sub.add_parser("stop", help="stop the cluster under --dir and remove it")
    stop.add_argument("--dir", type=Path, required=True)
    run = sub.add_parser("bench", help="classic vs quorum queues and a failover, on a fresh cluster")
    run.add_argument("--nodes", type=int, default=3)
    run.add_argument("--calls", type=int, default=1000)
    run.add_argument("--concurrency", type=int, default=32)
    run.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.command == "start":
        cluster = start_cluster(args.nodes, args.dir)
        print(
            json.dumps(
                {
                    "dir": str(cluster.base),
                    "QBROKER_URL": cluster.url(),
                    "nodes": [{"name": n.name, "port": n.port} for n in cluster.nodes],
                },
                indent=2,
            )
        )
    elif args.command == "stop":
        stop_cluster(Cluster.load(args.dir))
    else:
        print(json.dumps(bench(args), indent=2))


if __name__ == "__main__":
    main()
