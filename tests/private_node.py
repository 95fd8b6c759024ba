"""A private RabbitMQ node for tests that restart the broker: the user's broker is never stopped."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.broker import rabbitmqctl


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PrivateNode:
    name: str
    port: int
    base: Path

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def ctl(self, *args: str) -> None:
        rabbitmqctl("-n", self.name, *args)

    def ready_messages(self, queue: str) -> int:
        """Messages waiting in ``queue`` on this node (0 when it does not exist)."""
        out = rabbitmqctl("-n", self.name, "list_queues", "-q", "--no-table-headers", "name", "messages_ready").stdout
        counts = dict(line.split("\t") for line in out.splitlines() if line.count("\t") == 1)
        return int(counts.get(queue, 0))

    def stop_app(self) -> None:
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        self.wait_ready()

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"private RabbitMQ node {self.name} did not listen on {self.port} in {timeout}s")


def start_private_node(config: str | None = None, files: dict[str, bytes] | None = None) -> PrivateNode:
    """A fresh node; ``config`` is its rabbitmq.conf (e.g. a TLS listener) and ``files`` are written next
    to it first (certificates), owned by the node's user, so the config can name them as ``{base}/name``."""
    if shutil.which("rabbitmq-server") is None:
        raise RuntimeError("rabbitmq-server is not installed: run bin/ensure-rabbitmq")
    port = _free_port()
    base = Path(tempfile.mkdtemp(prefix="qbroker-node-"))
    (base / "enabled_plugins").write_text("[].\n")
    owned = [base, base / "enabled_plugins"]
    for name, data in (files or {}).items():
        (base / name).write_bytes(data)
        owned.append(base / name)
    if config is not None:
        (base / "rabbitmq.conf").write_text(config.replace("{base}", str(base)))
        owned.append(base / "rabbitmq.conf")
    if os.geteuid() == 0:
        # The Debian wrapper runs the node as the rabbitmq user, which must own its data directory.
        user = pwd.getpwnam("rabbitmq")
        for path in owned:
            os.chown(path, user.pw_uid, user.pw_gid)
    node = PrivateNode(name=f"qbt{uuid.uuid4().hex[:8]}@localhost", port=port, base=base)
    env = dict(
        os.environ,
        RABBITMQ_NODENAME=node.name,
        RABBITMQ_NODE_PORT=str(port),
        RABBITMQ_DIST_PORT=str(_free_port()),
        RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
        RABBITMQ_LOG_BASE=str(base / "log"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
        RABBITMQ_CONFIG_FILE=str(base / "rabbitmq"),
        RABBITMQ_PID_FILE=str(base / "pid"),
    )
    subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, capture_output=True, timeout=60)
    node.wait_ready()
    return node


def stop_private_node(node: PrivateNode) -> None:
    rabbitmqctl("-n", node.name, "stop", check=False)
    shutil.rmtree(node.base, ignore_errors=True)
