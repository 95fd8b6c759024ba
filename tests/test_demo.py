"""README command one: the demo imports real OSM data, runs the services end to end, applies a replication
diff through the bridge and leaves real map tiles (before and after the edit) on disk; it clears what an
earlier, killed run left in its work dir, reports at once a service that ends while it keeps running, and a
SIGTERM stops it as completely as Ctrl-C: services, broker accounts, exchanges and queues (one demo run for
all of it: a run costs minutes)."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from demo.accounts import demo_accounts
from demo.broker_objects import claim
from demo.leftovers import PidFile
from harness.broker import create_vhost, delete_vhost, rabbitmqctl, url_for_vhost
from qbroker import Config


class DemoProcess:
    """``python -m demo --keep-running`` as a person starts it, its output read line by line as it comes."""

    def __init__(self, amqp_url: str, workdir: Path) -> None:
        env = dict(os.environ, QBROKER_URL=amqp_url, PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "demo", "--workdir", str(workdir), "--keep-running"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parents[1],
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, text: str, within: float = 600) -> str:
        """The first line (from here on) holding ``text``; fails when the demo ends or hangs first."""
        deadline = time.monotonic() + within
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"the demo ended before printing {text!r}:\n" + "\n".join(self.seen[-40:]))
            self.seen.append(line)
            if text in line:
                return line

    def stop(self, sig: signal.Signals) -> str:
        """Send ``sig``, wait for the demo to end; everything it printed."""
        self.popen.send_signal(sig)
        self.popen.wait(120)
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
        return "\n".join(self.seen)


@pytest.fixture
def vhost_of_its_own() -> Iterator[str]:
    """The demo's run alone on a vhost: what it leaves there is what it left (other tests use ``osm`` too)."""
    vhost = create_vhost("qbroker-demo")
    yield vhost
    delete_vhost(vhost)


def on_the_broker(vhost: str) -> list[str]:
    """The vhost's exchanges and queues, but the broker's own (``amq.*`` and the default exchange)."""
    names = [
        f"exchange {name}"
        for name in rabbitmqctl("list_exchanges", "-p", vhost, "name", "-q", "--no-table-headers").stdout.split()
    ]
    names += [
        f"queue {name}"
        for name in rabbitmqctl("list_queues", "-p", vhost, "name", "-q", "--no-table-headers").stdout.split()
    ]
    return [name for name in names if not name.startswith("exchange amq.")]


@pytest.mark.timeout(900)  # a whole demo: minutes on a loaded machine (the demo's own steps wait up to 600 s)
@pytest.mark.heavy  # the whole demo, started as a program (not a fixture): an OSM import, Spark, every service
def test_demo_runs_end_to_end(vhost_of_its_own: str, tmp_path: Path) -> None:
    amqp_url = url_for_vhost(vhost_of_its_own)
    # What a SIGKILLed run leaves in its work dir (nothing ran its clean-up): a service process recorded in
    # demo.pids, its broker accounts described in deployment.toml, the exchanges and queues it declared (those
    # without the demo's prefix recorded in broker-objects.json). This run must clear all of it first.
    orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)
    PidFile(tmp_path).add(orphan.pid)
    asyncio.run(claim(Config(url=amqp_url, exchange_prefix="demo."), tmp_path))
    killed = demo_accounts(tmp_path, amqp_url, "demo.")  # declares the shared exchanges and queues too
    killed_accounts = list(killed.__enter__().names.values())
    assert "exchange osm" in on_the_broker(vhost_of_its_own)
    demo = DemoProcess(amqp_url, tmp_path)
    try:
        cleared = demo.until("an earlier run in this work dir was stopped without cleaning up")
        assert (
            f"stopped 1 of its processes, deleted {len(killed_accounts)} of its broker accounts, removed 8 of "
            "its exchanges and queues"
        ) in cleared  # demo.rpc, .reply, .alert, .dead, .dead.kept(.in), osm
        assert orphan.wait(30) == -signal.SIGTERM
        assert "/map#map=17/60.1" in demo.until("the edited street (Mikonkatu) on the map:")
        assert (tmp_path / "deployment.toml").exists()  # what the next run would clear after a SIGKILL
        assert (tmp_path / "broker-objects.json").exists()
        demo.until("still running:")
        running = PidFile(tmp_path).alive()
        assert len(running) >= 5, running  # Spark bridge, queuemaster, two renderers, toposm-web
        # A service that ends while the demo keeps running is reported at once, with what still runs.
        renderer = int(demo.until("toposm-renderer ").split("pid")[1].split()[0])
        os.kill(renderer, signal.SIGTERM)
        ended = demo.until(f"toposm-renderer (pid {renderer})", within=120)
        assert re.search(r"(exited with status \d+|killed by SIGTERM); its log: .*service-\d\.log", ended), ended
        still = demo.until("! still running:")
        assert str(renderer) not in still and "toposm-queuemaster" in still and "toposm-web" in still, still
    finally:
        # A supervisor's (or `timeout`'s) stop: everything goes, as with Ctrl-C.
        out = demo.stop(signal.SIGTERM)
        killed.__exit__(None, None, None)
        orphan.kill()
    assert demo.popen.returncode == 0, out[-3000:]
    assert "demo stopped (SIGTERM): services stopped. Broker accounts deleted." in out, out[-3000:]
    # ... and the exchanges and queues it declared, each named.
    assert "exchanges and queues removed from the broker." in out, out[-3000:]
    assert on_the_broker(vhost_of_its_own) == [], out[-3000:]
    removed = [line for line in out.splitlines() if "removed from the broker:" in line][-1]  # this run's
    for name in (
        "exchange demo.rpc",
        "exchange osm",
        "queue demo.dead ",
        "queue toposm.queuemaster.osm",
        "queue demo.rpc_toposm.queuemaster",
    ):
        assert name in removed, removed
    assert not (tmp_path / "broker-objects.json").exists()
    assert PidFile(tmp_path).alive() == []
    assert not [pid for pid in running if Path(f"/proc/{pid}").exists()]
    # The operator's view runs from the start: the demo waited for toposm-web to answer before printing this.
    assert "live status page http://127.0.0.1:" in out and "/map" in out
    assert "importing Helsinki.osm.pbf" in out
    assert "17/74618/37938   rendered" in out  # central Helsinki, where the edit is
    assert "applied sequence 1:" in out and "toposm-replicate --once" in out
    expired_line = next(line for line in out.splitlines() if "metatiles expired, " in line)
    expired, rerendered = (int(word) for word in expired_line.split() if word.isdigit())
    assert expired >= 5 and rerendered >= 5
    # The re-rendered tiles show the edit (the renamed street's label, the moved corner, the new building).
    for z in (16, 17):
        changed = next(line for line in out.splitlines() if f"z{z}: before-{z}.png" in line)
        assert int(changed.split("differ in ")[1].split()[0]) > 100, changed
    assert '"command": "stats"' in out  # the CLI's answer, cut with a marker where it is long
    answer = tmp_path / "queuemaster-stats.json"
    marker = next(line for line in out.splitlines() if "more lines: the whole answer is in" in line)
    assert marker.endswith(str(answer)) and json.loads(answer.read_text())["command"] == "stats"
    # The services log at INFO into their files (the console shows only what the demo prints).
    for log in [*tmp_path.glob("service-*.log"), tmp_path / "spark-bridge.log"]:
        assert "[info" in log.read_text(errors="replace"), log
    assert "[info" not in out
    # Each program ran under its own broker account, made for the demo and deleted after it.
    assert "broker accounts per program: yes" in out
    accounts = next(line for line in out.splitlines() if line.strip().startswith("accounts:"))
    names = [name.strip() for name in accounts.split(":", 1)[1].split(",")]
    assert len(names) >= 5
    users = set(rabbitmqctl("list_users", "-q", "--no-table-headers").stdout.split())
    assert not users & {*names, *killed_accounts}
    overview = Image.open(tmp_path / "overview-15.png")
    assert overview.size == (2048, 2048)
    colours = overview.convert("RGB").resize((64, 64)).getcolors(maxcolors=64 * 64) or []
    assert len(colours) > 20  # a map, not a blank
    tiles = list((tmp_path / "tiles").rglob("*.png"))
    assert len(tiles) > 64
