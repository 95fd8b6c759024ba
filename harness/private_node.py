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

from harness.broker import rabbitmqctl


def free_port() -> int:
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
        crash_dump = self.base / "log" / "erl_crash.dump"
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if crash_dump.exists():
                    raise NodeDied(
                        f"private RabbitMQ node {self.name} died while starting: {_crash_slogan(crash_dump)}"
                    ) from None
                time.sleep(0.2)
        raise RuntimeError(f"private RabbitMQ node {self.name} did not listen on {self.port} in {timeout}s")


class NodeDied(RuntimeError):
    """The node's Erlang VM stopped during boot (it wrote a crash dump), e.g. a port taken meanwhile."""


def _crash_slogan(dump: Path) -> str:
    with dump.open(errors="replace") as lines:
        for line in lines:
            if line.startswith("Slogan:"):
                return line.removeprefix("Slogan:").strip()[:300]
    return "no slogan in the crash dump"


def start_private_node(
    config: str | None = None, files: dict[str, bytes] | None = None, attempts: int = 3
) -> PrivateNode:
    """A fresh node; ``config`` is its rabbitmq.conf (e.g. a TLS listener) and ``files`` are written next
    to it first (certificates), owned by the node's user, so the config can name them as ``{base}/name``.

    The ports are picked free but only bound by the node seconds later; on a shared machine another
    process can take one meanwhile and the node dies at boot, so a node that dies is started again on
    fresh ports (a node that merely boots slowly is waited for, not retried)."""
    if shutil.which("rabbitmq-server") is None:
        raise RuntimeError("rabbitmq-server is not installed: run bin/ensure-rabbitmq")
    for attempt in range(1, attempts + 1):
        try:
            return _start_once(config, files)
        except NodeDied:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def _start_once(config: str | None, files: dict[str, bytes] | None) -> PrivateNode:
    node, env = prepare_node(config, files)
    launch_node(node, env)
    return node


def prepare_node(
    config: str | None = None,
    files: dict[str, bytes] | None = None,
    *,
    name: str | None = None,
    base: Path | None = None,
) -> tuple[PrivateNode, dict[str, str]]:
    """A node's data directory (``base``, a fresh temp dir by default), files and free ports, and the
    environment that starts it; nothing runs yet. ``{base}`` in ``config`` is the data directory."""
    port = free_port()
    if base is None:
        base = Path(tempfile.mkdtemp(prefix="qbroker-node-"))
    else:
        base.mkdir(parents=True)
    (base / "enabled_plugins").write_text("[].\n")
    owned = [base, base / "enabled_plugins"]
    for file_name, data in (files or {}).items():
        (base / file_name).write_bytes(data)
        owned.append(base / file_name)
    if config is not None:
        (base / "rabbitmq.conf").write_text(config.replace("{base}", str(base)))
        owned.append(base / "rabbitmq.conf")
    if os.geteuid() == 0:
        # The Debian wrapper runs the node as the rabbitmq user, which must own its data directory.
        user = pwd.getpwnam("rabbitmq")
        for path in owned:
            os.chown(path, user.pw_uid, user.pw_gid)
    node = PrivateNode(name=name or f"qbt{uuid.uuid4().hex[:8]}@localhost", port=port, base=base)
    env = dict(
        os.environ,
        RABBITMQ_NODENAME=node.name,
        RABBITMQ_NODE_PORT=str(port),
        RABBITMQ_DIST_PORT=str(free_port()),
        RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
        RABBITMQ_LOG_BASE=str(base / "log"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
        RABBITMQ_CONFIG_FILE=str(base / "rabbitmq"),
        RABBITMQ_PID_FILE=str(base / "pid"),
    )
    return node, env


def launch_node(node: PrivateNode, env: dict[str, str]) -> None:
    """Start a prepared node and wait until it listens (its data directory is removed if it dies)."""
    subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, capture_output=True, timeout=60)
    try:
        node.wait_ready()
    except NodeDied:
        shutil.rmtree(node.base, ignore_errors=True)
        raise


def stop_private_node(node: PrivateNode) -> None:
    rabbitmqctl("-n", node.name, "stop", check=False)
    shutil.rmtree(node.base, ignore_errors=True)
