"""What a demo run leaves behind when it cannot clean up (a SIGKILL, a power cut), and how the next run clears it.

Every service the demo starts runs in a session of its own (so a Ctrl-C in the terminal reaches the demo, which
stops them in order). When the demo itself is killed, nothing stops them: so each one is recorded in
``WORKDIR/demo.pids`` with its start time (a pid alone may have been reused by an unrelated process since), the
broker accounts stay described in ``WORKDIR/deployment.toml`` until they are deleted, and the exchanges and
queues it declared are known from ``WORKDIR/broker-objects.json`` (demo/broker_objects.py) until they are
removed. A new run in the same work dir (or ``bin/demo --clean``) reads all three and clears what is still
there, in that order (a service still running would hold the exchanges), before it starts anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from demo.broker_objects import Record, owned_after, remove
from qbroker.config import Config
from qbroker.runner import run

PIDS_FILE = "demo.pids"
DEPLOYMENT_FILE = "deployment.toml"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None when it is gone or a
    zombie (an orphan's parent may be slow to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the fields after "(comm)"; comm may hold spaces
    return None if fields[0] in ("Z", "X") else fields[19]


class PidFile:
    """The demo's service processes (session leaders), recorded as they start: pid -> start time."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / PIDS_FILE

    def _read(self) -> dict[int, str]:
        try:
            return {int(pid): str(start) for pid, start in json.loads(self.path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def add(self, *pids: int) -> None:
        recorded = self._read()
        for pid in pids:
            start = _start_time(pid)
            if start is not None:
                recorded[pid] = start
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(pid): start for pid, start in recorded.items()}))
        tmp.replace(self.path)

    def alive(self) -> list[int]:
        """The recorded processes still running (same pid and the same start time)."""
        return [pid for pid, start in self._read().items() if _start_time(pid) == start]

    def stop_leftovers(self, grace: float = 10.0) -> list[int]:
        """SIGTERM the process group of each recorded process still alive, SIGKILL after ``grace`` seconds;
        forget the file. Returns the pids that were still running."""
        leftovers = self.alive()
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.path.unlink(missing_ok=True)
        return leftovers


def remove_leftover_accounts(workdir: Path) -> list[str]:
    """Delete the broker accounts an earlier run in ``workdir`` described and did not delete; their names."""
    from qbroker.cli.cmd_provision import remove
    from qbroker.cli.deployment import load_deployment

    description = workdir / DEPLOYMENT_FILE
    if not description.exists():
        return []
    deployment = load_deployment(description)
    remove(deployment)
    description.unlink()
    return [account.name for account in deployment.account]


def clear_leftovers(workdir: Path, accounts: bool, broker: Config | None) -> list[str]:
    """Clear what an earlier run in ``workdir`` left behind: its processes, its broker accounts (``accounts``)
    and its exchanges and queues (removed with ``broker``'s account; None: left to the caller). Lines saying
    what; none when nothing."""
    stopped = PidFile(workdir).stop_leftovers()
    removed = remove_leftover_accounts(workdir) if accounts else []
    objects = None
    if broker is not None and Record(workdir).exists():
        objects = run(remove(broker, owned_after(broker, workdir), workdir))
    if not stopped and not removed and (objects is None or (objects.complete and not objects.removed)):
        return []
    return [
        f"an earlier run in this work dir was stopped without cleaning up: stopped {len(stopped)} of its "
        f"processes, deleted {len(removed)} of its broker accounts, removed "
        f"{len(objects.removed) if objects else 0} of its exchanges and queues",
        *(objects.lines(workdir) if objects is not None else []),
    ]


def stop_on_signals(*signals: signal.Signals) -> None:
    """Make SIGTERM, SIGHUP, ... stop the demo as Ctrl-C does: a KeyboardInterrupt, so every ``finally`` (services
    stopped, accounts deleted) runs. Further signals of these kinds are ignored, so they cannot cut the clean-up
    short (a supervisor repeating its SIGTERM, a terminal sending SIGHUP then SIGTERM)."""

    def interrupt(signum: int, frame: object) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in signals:
        signal.signal(sig, interrupt)
