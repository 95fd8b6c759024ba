"""Per-run isolation on a real RabbitMQ: a fresh vhost, deleted afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from urllib.parse import quote, urlsplit, urlunsplit

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


def rabbitmqctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("rabbitmqctl")
    if exe is None:
        raise RuntimeError(
            "rabbitmqctl not found: the tests isolate themselves in a vhost of their own and need "
            "rabbitmqctl on this machine (run bin/ensure-rabbitmq first)"
        )
    return subprocess.run([exe, *args], check=check, capture_output=True, text=True, timeout=60)


def create_vhost(prefix: str = "qbroker-test") -> str:
    vhost = f"{prefix}-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", vhost)
    user = urlsplit(os.environ.get("QBROKER_TEST_URL", DEFAULT_URL)).username or "guest"
    rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    return vhost


def delete_vhost(vhost: str) -> None:
    rabbitmqctl("delete_vhost", vhost, check=False)


def url_for_vhost(vhost: str) -> str:
    base = urlsplit(os.environ.get("QBROKER_TEST_URL", DEFAULT_URL))
    return urlunsplit((base.scheme, base.netloc, "/" + quote(vhost, safe=""), base.query, ""))


def list_queues(vhost: str) -> list[str]:
    out = rabbitmqctl("list_queues", "-p", vhost, "-q", "--no-table-headers", "name").stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def close_connections(vhost: str, reason: str = "closed by the test") -> int:
    """Close every client connection to ``vhost`` from the broker's side (a network drop, as clients see it)."""
    out = rabbitmqctl("list_connections", "-q", "--no-table-headers", "pid", "vhost").stdout
    pids = [line.split("\t")[0] for line in out.splitlines() if line.strip().endswith("\t" + vhost)]
    for pid in pids:
        rabbitmqctl("close_connection", pid, reason, check=False)
    return len(pids)
