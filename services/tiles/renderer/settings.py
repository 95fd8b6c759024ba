"""What a renderer process is told at start (``toposm-renderer``'s options)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path


def short_hostname() -> str:
    """The host's name as one routing-key word (dots would add hierarchy levels)."""
    name = socket.gethostname().split(".")[0]
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name) or "localhost"


@dataclass
class RendererSettings:
    tile_root: Path
    threads: int = 1
    strategy: str = "by_work_available"
    backend: str = "testpattern"
    hostname: str = field(default_factory=short_hostname)
    render_delay: float = 0.0  # extra seconds per render (demos, tests catching a render in progress)
    report_retry_for: float = 120.0  # keep trying to deliver `rendered` this long (queuemaster restarting)
    reregister_after: float = 10.0  # not pinged for this long: register again (the queuemaster lost us)
    drain_timeout: float = 10.0  # on stop: finish the metatiles in hand if they are done within this
    # Broker accounts (checked against the broker-validated user_id): who may send `render`/`ping`
    # (None: anyone the broker lets publish there) and who may send `shutdown` (None: nobody; SIGTERM).
    queuemaster_users: frozenset[str] | None = None
    operator_users: frozenset[str] = frozenset()
    metrics_port: int | None = None  # --metrics-port (services/toposm/metrics_port.py); None: no metrics server
    metrics_host: str = "127.0.0.1"
    tile_store: str = "png"  # png or meta (tile_store.py)
