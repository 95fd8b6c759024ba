"""Terminal control sequences from the bus reach an operator's terminal only escaped.

A provisioned ``client`` account names its unit and host ``ESC]0;...BEL ESC[2J`` (retitle, clear) with a
C1 CSI (U+009B) too, and publishes raw with such an app id; a compromised service answers with such a
body and error message. ``qbroker list``, ``qbroker call`` and ``qbroker-debug`` run as the operator,
piped and on a pseudo-terminal: the output holds the escaped text (``\\u001b``), never the codes.
"""

from __future__ import annotations

import asyncio
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from harness import HANG
from harness.provisioned import Provisioned
from qbroker import RequestFailed, Unit

BIN = Path(sys.executable).parent
EVIL = "\x1b]0;pwned\x07\x1b[2J\x9b31mEVIL\x7f\x85"
SLOW_HANG = 1.5 * HANG
SGR = re.compile(rb"\x1b\[[0-9;]*m")  # the colours rich itself writes on a terminal
# what rich's live progress bar writes besides colours: cursor hidden/shown, line erased, cursor up
RICH_LIVE = re.compile(rb"\x1b\[\?25[lh]|\x1b\[2K|\x1b\[[0-9]*A")


def assert_inert(output: bytes) -> None:
    """Nothing a terminal would act on but rich's own colours; the attack is there, escaped."""
    text = SGR.sub(b"", output).decode("utf-8", "replace")
    assert "\\u001b]0;pwned" in text, text[-2000:]
    acting = sorted({f"U+{ord(c):04X}" for c in text if (ord(c) < 0x20 and c not in "\n\r\t") or 0x7F <= ord(c) < 0xA0})
    assert not acting, (acting, text[-2000:])


class Output:
    """A CLI process, piped or on a pseudo-terminal, its output collected as it comes."""

    def __init__(self, args: list[str], env: dict[str, str], *, terminal: bool) -> None:
        self.data = bytearray()
        self._changed = threading.Condition()
        if terminal:
            master, slave = pty.openpty()
            self.proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
            os.close(slave)
            source: Any = os.fdopen(master, "rb", buffering=0)
        else:
            self.proc = subprocess.Popen(
                args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            source = self.proc.stdout
        self._reader = threading.Thread(target=self._read, args=(source,), daemon=True)
        self._reader.start()

    def _read(self, source: Any) -> None:
        try:
            read = getattr(source, "read1", source.read)  # whatever is there, not a full 4096 bytes
            while chunk := read(4096):
                with self._changed:
                    self.data += chunk
                    self._changed.notify_all()
        except OSError:  # a pty's master reads EIO once the process is gone
            pass
        finally:
            source.close()

    def wait_for(self, text: bytes) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: text in self.data, SLOW_HANG), bytes(self.data[-2000:])

    def finish(self) -> tuple[int, bytes]:
        code = self.proc.wait(SLOW_HANG)
        self._reader.join(SLOW_HANG)
        return code, bytes(self.data)


def _env(provisioned: Provisioned) -> dict[str, str]:
    return dict(os.environ, QBROKER_URL=provisioned.url_with_password("operator"), TERM="xterm-256color", COLUMNS="200")


@pytest.fixture
async def hostile(as_role) -> Any:
    """A client's unit named and hosted EVIL (it answers qbroker.ping), and a service answering EVIL."""
    client = await as_role("client", app=f"test.client{EVIL}", start=False)
    client.host = f"host{EVIL}"
    await client.start()
    service = await as_role("operator", app=f"test.service{EVIL}", start=False)

    @service.rpc("t.evil")
    async def evil(fail: bool = False) -> Any:
        if fail:
            raise RequestFailed("evil", f"error message {EVIL}")
        return {"text": f"body {EVIL}", EVIL: 1}

    @service.rpc("t.evil_text")
    async def evil_text() -> str:
        return f"text body {EVIL}\nsecond line"

    await service.start()
    return client


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
async def test_list_and_call_escape_what_came_off_the_wire(hostile, provisioned, terminal: bool) -> None:
    env = _env(provisioned)
    runs = {
        "list": [str(BIN / "qbroker"), "list", "--timeout", "3"],
        "list_schemas": [str(BIN / "qbroker"), "list", "--schemas", "--timeout", "3"],
        "call": [str(BIN / "qbroker"), "call", "t.evil"],
        "call_raw": [str(BIN / "qbroker"), "call", "t.evil_text", "--raw"],
        "call_fail": [str(BIN / "qbroker"), "call", "t.evil", "fail=true"],
    }
    outputs = {label: Output(args, env, terminal=terminal) for label, args in runs.items()}
    for label, output in outputs.items():
        code = (await asyncio.to_thread(output.finish))[0]
        assert code == (2 if label == "call_fail" else 0), (label, output.data[-1000:])
        assert_inert(bytes(output.data))
    assert b"second line" in outputs["call_raw"].data  # a multi-line text body keeps its lines


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
async def test_debug_escapes_names_apps_bodies_and_errors(hostile, provisioned, terminal: bool) -> None:
    env = _env(provisioned)
    debug = Output(
        [
            str(BIN / "qbroker-debug"),
            "--name",
            "t.evil",
            "--name",
            "qbroker.stop",
            "--body",
            "--count",
            "5",
            "--discover-timeout",
            "0.5",
            "--recheck",
            "0",
        ],
        env,
        terminal=terminal,
    )
    try:
        await asyncio.to_thread(debug.wait_for, b"watching")
        # The client's raw publish: its own app id and app header (RabbitMQ checks user_id only).
        raw = await aio_pika.connect(provisioned.url_with_password("client"))
        async with raw:
            channel = await raw.channel()
            alert = await channel.get_exchange(f"{provisioned.deployment.exchange_prefix}alert", ensure=False)
            await alert.publish(
                aio_pika.Message(
                    b'{"text": "x"}',
                    app_id=EVIL,
                    content_type="application/json",
                    user_id=provisioned.names["client"],
                    headers={"app": EVIL},
                ),
                routing_key="qbroker.stop",
            )
        unit = Unit("test.caller", config=provisioned.config("operator"))
        await unit.start()
        try:
            await unit.call("t.evil", {}, timeout=SLOW_HANG)
            with pytest.raises(RequestFailed):
                await unit.call("t.evil", {"fail": True}, timeout=SLOW_HANG)
        finally:
            await unit.stop()
    except BaseException:
        debug.proc.kill()  # the test failed before the debugger finished: do not leave it running
        raise
    code, output = await asyncio.to_thread(debug.finish)
    assert code == 0, output[-2000:]
    assert_inert(output)
    text = output.decode("utf-8", "replace")
    assert text.count("\\u001b]0;pwned") >= 4, text  # app id, app, bodies, error message


def test_console_log_lines_show_control_characters_escaped() -> None:
    """A value from the wire in a log line (a unit's app id, an error message) reaches the operator's
    terminal escaped; JSON log lines escape it as JSON does."""
    code = (
        "import sys; from qbroker.log import get_logger; "
        "get_logger(app=sys.argv[1]).warning('request refused', error=sys.argv[1])"
    )
    for log_format in ("console", "json"):
        env = dict(os.environ, QBROKER_LOG_FORMAT=log_format)
        done = subprocess.run([sys.executable, "-c", code, EVIL], env=env, capture_output=True, timeout=SLOW_HANG)
        assert done.returncode == 0, done.stderr
        assert b"request refused" in done.stderr
        assert_inert(done.stderr)


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
async def test_render_list_escapes_what_the_queuemaster_says(make_unit: Any, amqp_url: str, terminal: bool) -> None:
    """Whatever answers as the queuemaster words its errors with control codes: toposm-render-list's progress
    line (why it asks again), its report's failures (a renderer's reason) and its refusal show them escaped."""
    from qbroker import RequestError

    forged = await make_unit("toposm.queuemaster")
    asked: list[str] = []
    endpoint = forged.commands("toposm.queuemaster")

    @endpoint.command("bulk")
    async def bulk(metatile: str, missing_only: bool = False, priority: str = "bulk") -> Any:
        asked.append(metatile)
        if metatile == "0/0/0" and asked.count(metatile) == 1:
            raise RequestError("strange", f"asking again {EVIL}")
        if metatile == "0/0/0":
            raise RequestError("render_failed", "the render failed", detail=f"renderer reason {EVIL}")
        raise RequestFailed("forbidden", f"refused {EVIL}")

    @endpoint.command("cancel")
    async def cancel(metatiles: list[str]) -> Any:
        return {"command": "cancelled", "metatiles": len(metatiles), "withdrawn": 0}

    await forged.start()
    script = BIN / "toposm-render-list"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "services.tiles.render_list.main"]
    env = dict(
        os.environ,
        QBROKER_URL=amqp_url,
        TERM="xterm-256color",
        COLUMNS="200",
        PYTHONPATH=str(Path(__file__).resolve().parents[3]),
    )
    output = Output([*command, "--bbox=-10,-10,10,10", "--zooms", "0-1", "--window", "1"], env, terminal=terminal)
    code, data = await asyncio.to_thread(output.finish)
    assert code != 0 and asked == ["0/0/0", "0/0/0", "1/0/0"], (asked, data[-2000:])
    assert_inert(RICH_LIVE.sub(b"", data))
    for said in (b"renderer reason \\u001b]0;pwned", b"refused \\u001b]0;pwned"):
        assert said in SGR.sub(b"", data), (said, data[-2000:])
