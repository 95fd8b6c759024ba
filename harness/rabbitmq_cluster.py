"""A RabbitMQ cluster of private nodes on this machine (Debian's rabbitmq-server; the user's broker is never
touched): node names, ports and data directories of their own under one directory. ``bench/rabbitmq_cluster.py``
starts and stops one from the shell; tests use ``start_cluster``/``stop_cluster``.

The nodes boot together and form the cluster by classic peer discovery (each node's rabbitmq.conf lists them
all), which takes one boot instead of one per node; a node that formed a cluster of its own instead (booted
before it could see the others) is joined to the first one with ``join_cluster``. They share the Erlang cookie
of the account the Debian wrapper runs them as.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from harness.broker import rabbitmqctl
from harness.private_node import NodeDied, PrivateNode, launch_node, prepare_node

MANIFEST = "cluster.json"


@dataclass
class Cluster:
    base: Path
    nodes: list[PrivateNode]

    def urls(self, first: int = 0) -> list[str]:
        """Every node's URL, starting at node ``first`` (a client's failover order)."""
        return [n.url for n in self.nodes[first:] + self.nodes[:first]]

    def url(self, first: int = 0) -> str:
        """The URL list as ``QBROKER_URL`` takes it (comma-separated)."""
        return ",".join(self.urls(first))

    def running(self) -> list[PrivateNode]:
        return [n for n in self.nodes if _listens(n.port)]

    def index_of(self, name: str) -> int:
        return next(i for i, n in enumerate(self.nodes) if n.name == name)

    def kill(self, index: int) -> None:
        """SIGKILL node ``index``'s Erlang VM (no shutdown: a crash, or the machine gone), and wait until
        its port is closed."""
        node = self.nodes[index]
        pid = int((node.base / "pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _listens(node.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.name} still listens 30 s after SIGKILL")
            time.sleep(0.1)

    def queue_leader(self, queue: str, vhost: str = "/") -> str | None:
        """The node name of the leader of quorum queue ``queue`` (asked of a running node), or None."""
        out = rabbitmqctl(
            "-n", self.running()[0].name, "list_queues", "-p", vhost, "name", "leader", "--formatter", "json"
        ).stdout
        return next((q.get("leader") for q in json.loads(out) if q.get("name") == queue), None)

    def queues(self, vhost: str = "/") -> list[dict[str, object]]:
        """Every queue of ``vhost`` with its type, leader, members and state (for failure messages)."""
        out = rabbitmqctl(
            "-n",
            self.running()[0].name,
            "list_queues",
            "-p",
            vhost,
            "name",
            "type",
            "leader",
            "members",
            "online",
            "state",
            "messages",
            "--formatter",
            "json",
        ).stdout
        return list(json.loads(out))

    def running_members(self) -> list[str]:
        out = rabbitmqctl("-n", self.running()[0].name, "cluster_status", "--formatter", "json").stdout
        return list(json.loads(out).get("running_nodes", []))

    def save(self) -> None:
        manifest = {"nodes": [{"name": n.name, "port": n.port, "base": str(n.base)} for n in self.nodes]}
        (self.base / MANIFEST).write_text(json.dumps(manifest, indent=2))

    @classmethod
    def load(cls, base: Path) -> Cluster:
        manifest = json.loads((base / MANIFEST).read_text())
        nodes = [PrivateNode(name=n["name"], port=n["port"], base=Path(n["base"])) for n in manifest["nodes"]]
        return cls(base, nodes)


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _config(names: list[str]) -> str:
    lines = ["cluster_formation.peer_discovery_backend = classic_config"]
    lines += [f"cluster_formation.classic_config.nodes.{i} = {name}" for i, name in enumerate(names, 1)]
    # No lock with classic discovery: a random delay spreads simultaneous boots (default 5-60 s); a short one
    # is enough here, and a node that formed a cluster of its own anyway is joined by ``start_cluster``.
    lines += [
        "cluster_formation.randomized_startup_delay_range.min = 0",
        "cluster_formation.randomized_startup_delay_range.max = 2",
    ]
    return "\n".join(lines) + "\n"


def _start_node(name: str, base: Path, config: str, attempts: int = 3) -> PrivateNode:
    """One member, started again on fresh ports if another process took one before it bound it."""
    for attempt in range(1, attempts + 1):
        node, env = prepare_node(config, name=name, base=base)
        # Schedulers that sleep instead of spinning: three VMs share a machine that others use too.
        env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] = "+sbwt none +sbwtdcpu none +sbwtdio none"
        try:
            launch_node(node, env)
            return node
        except NodeDied:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def start_cluster(size: int = 3, base: Path | None = None, timeout: float = 120) -> Cluster:
    """``size`` nodes clustered together; raises if they are not all running members within ``timeout``."""
    if shutil.which("rabbitmq-server") is None:
        raise RuntimeError("rabbitmq-server is not installed: run bin/ensure-rabbitmq")
    base = Path(tempfile.mkdtemp(prefix="qbroker-cluster-")) if base is None else base
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)  # noqa: S103 - the nodes run as the rabbitmq user and must reach their dirs
    tag = uuid.uuid4().hex[:6]
    names = [f"qbc{tag}{i}@localhost" for i in range(1, size + 1)]
    config = _config(names)
    nodes: list[PrivateNode | None] = [None] * size
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            nodes[i] = _start_node(names[i], base / f"node{i + 1}", config)
        except BaseException as exc:  # reported below, after the other starts end
            errors.append(exc)

    starts = [threading.Thread(target=start, args=(i,)) for i in range(size)]
    for thread in starts:
        thread.start()
    for thread in starts:
        thread.join()
    cluster = Cluster(base, [n for n in nodes if n is not None])
    cluster.save()
    try:
        if errors:
            raise errors[0]
        _formed(cluster, names, timeout)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def _formed(cluster: Cluster, names: list[str], timeout: float, join_after: float = 15) -> None:
    start = time.monotonic()
    deadline = start + timeout
    joined = False
    while sorted(cluster.running_members()) != sorted(names):
        if not joined and time.monotonic() > start + join_after:
            # Discovery left someone out: join whoever is not a member of the first node's cluster to it.
            joined = True
            first = cluster.nodes[0].name
            for node in cluster.nodes[1:]:
                if node.name not in cluster.running_members():
                    for step in (("stop_app",), ("reset",), ("join_cluster", first), ("start_app",)):
                        rabbitmqctl("-n", node.name, *step)
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster not formed in {timeout}s: running members {cluster.running_members()}")
        time.sleep(0.5)


def stop_cluster(cluster: Cluster, *, keep: bool = False) -> None:
    """Stop every node that still runs (in parallel) and remove the directory unless ``keep``."""
    stops = [
        threading.Thread(target=rabbitmqctl, args=("-n", n.name, "stop"), kwargs={"check": False})
        for n in cluster.running()
    ]
    for thread in stops:
        thread.start()
    for thread in stops:
        thread.join()
    for node in cluster.nodes:  # a node that did not stop (or never answered rabbitmqctl) is killed
        pid_file = node.base / "pid"
        if pid_file.exists() and _listens(node.port):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
    if not keep:
        shutil.rmtree(cluster.base, ignore_errors=True)
