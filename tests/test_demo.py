"""README command one: the demo imports real OSM data, runs the services end to end, applies a replication
diff through the bridge and leaves real map tiles (before and after the edit) on disk."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from PIL import Image

from demo.accounts import demo_accounts
from demo.leftovers import PidFile
from tests.broker import rabbitmqctl


def test_demo_runs_end_to_end(amqp_url: str, tmp_path: Path) -> None:
    env = dict(os.environ, QBROKER_URL=amqp_url)
    result = subprocess.run([sys.executable, "-m", "demo", "--workdir", str(tmp_path)], capture_output=True,
                            text=True, timeout=600, env=env, cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
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
    assert '"command": "stats"' in out  # the CLI's answer
    assert "demo finished: services stopped." in out
    # Each program ran under its own broker account (issue 10), made for the demo and deleted after it.
    assert "broker accounts per program: yes" in out
    accounts = next(line for line in out.splitlines() if line.strip().startswith("accounts:"))
    names = [name.strip() for name in accounts.split(":", 1)[1].split(",")]
    assert len(names) >= 5
    users = rabbitmqctl("list_users", "-q", "--no-table-headers").stdout
    assert not [name for name in names if name in users]
    overview = Image.open(tmp_path / "overview-15.png")
    assert overview.size == (2048, 2048)
    colours = overview.convert("RGB").resize((64, 64)).getcolors(maxcolors=64 * 64) or []
    assert len(colours) > 20  # a map, not a blank
    tiles = list((tmp_path / "tiles").rglob("*.png"))
    assert len(tiles) > 64


class DemoProcess:
    """``python -m demo --keep-running`` as a person starts it, its output read line by line as it comes."""

    def __init__(self, amqp_url: str, workdir: Path) -> None:
        env = dict(os.environ, QBROKER_URL=amqp_url, PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "demo", "--workdir", str(workdir), "--keep-running", "--renderers", "1",
             "--web-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            cwd=Path(__file__).resolve().parents[1])
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, text: str, within: float = 300) -> str:
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
        self.popen.send_signal(sig)
        self.popen.wait(120)
        rest = []
        while (line := self.lines.get(timeout=10)) is not None:
            rest.append(line)
        return "\n".join(rest)

    def accounts(self) -> list[str]:
        line = self.until("accounts: demo-")
        return [name.strip() for name in line.split(":", 1)[1].split(",")]


def test_demo_cleans_up_after_sigterm_and_after_an_earlier_sigkill(amqp_url: str, tmp_path: Path) -> None:
    """What a SIGKILLed run leaves in its work dir (a service process recorded in demo.pids, its accounts described
    in deployment.toml) is cleared by the next run there, and a SIGTERM stops a demo as completely as Ctrl-C."""
    # The leftovers of a killed run: nothing ran its clean-up (a real process, real accounts on the broker).
    orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)
    PidFile(tmp_path).add(orphan.pid)
    killed = demo_accounts(tmp_path, amqp_url, "demo.")
    killed_accounts = list(killed.__enter__().names.values())
    demo = DemoProcess(amqp_url, tmp_path)
    try:
        cleared = demo.until("an earlier run in this work dir was stopped without cleaning up")
        assert f"stopped 1 of its processes, deleted {len(killed_accounts)} of its broker accounts" in cleared
        assert orphan.wait(30) == -signal.SIGTERM
        accounts = demo.accounts()
        assert (tmp_path / "deployment.toml").exists()  # what the next run would clear after a SIGKILL
        assert "/map#map=17/60.1" in demo.until("the edited street (Mikonkatu) on the map:")
        running = PidFile(tmp_path).alive()
        assert len(running) >= 4, running  # Spark bridge, queuemaster, renderer, toposm-web
    finally:
        out = demo.stop(signal.SIGTERM)
        killed.__exit__(None, None, None)
        orphan.kill()
    assert "demo stopped (SIGTERM): services stopped. Broker accounts deleted." in out, out
    assert demo.popen.returncode == 0
    assert PidFile(tmp_path).alive() == []
    assert not [pid for pid in running if Path(f"/proc/{pid}").exists()]
    users = set(rabbitmqctl("list_users", "-q", "--no-table-headers").stdout.split())
    assert not users & {*killed_accounts, *accounts}
