"""``toposm-replicate`` against a hostile or broken replication server (the real process, a real HTTP server on
127.0.0.1): state files that are not one (``²``, 5,000 digits, ``abc``, a captive portal's page), a diff with
XML entities and an answer dripped a byte at a time are each logged, counted and backed off, and replication
goes on when the server answers well again; SIGTERM in the middle of a dripped download ends the process
within the drain timeout."""

# ruff: noqa: F811 - the fixtures are imported by name and then requested as parameters
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness import HANG, eventually
from harness.osm import Extract, osc, publish, read_extract
from harness.private_node import free_port
from services.osmstore.geometry import GeometryStore
from services.osmstore.replication import STATE_BYTES, ReplicationError, parse_state
from services.replicate.source import HttpSource, SourceUnavailable
from tests.prometheus_text import scrape, value
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data, store  # noqa: F401 - fixtures
from tests.services.spark_bridge.replicate_helpers import renamed, store_bridge  # noqa: F401 - store_bridge is a fixture
from tests.services.spark_bridge.replication_server import Answer, serving

BIN = Path(sys.executable).parent
STATE = "/replication/minute/state.txt"
DIFF_1 = "/replication/minute/000/000/001.osc.gz"
DRAIN = 2.0  # QBROKER_DRAIN_TIMEOUT of the processes started here
# What a hostile or broken server answers for a state file, none of which is one.
NOT_A_STATE = [
    b"#now\nsequenceNumber=\xc2\xb2\ntimestamp=2026-11-24T00\\:01\\:00Z\n",  # superscript two
    b"sequenceNumber=" + b"7" * 5000 + b"\n",  # past int()'s 4,300 digits
    b"sequenceNumber=abc\n",
]
PORTAL = b"<!doctype html><html><head><title>Hotel Wi-Fi</title></head><body><form>Log in</form></body></html>"
ENTITIES = (
    b'<?xml version="1.0"?>\n<!DOCTYPE osmChange [<!ENTITY a "aaaaaaaaaa">'
    b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>\n<osmChange version="0.6"><modify>'
    b'<node id="1" version="2" lat="60.17" lon="24.94"><tag k="name" v="&b;"/></node></modify></osmChange>\n'
)


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:
    return read_extract(helsinki)


@contextmanager
def replicate(url: str, store: Path, amqp_url: str, log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``toposm-replicate`` as an operator runs it, in a session of its own; killed with it if still running."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(BIN / "toposm-replicate"),
                "--source",
                url,
                "--store",
                str(store),
                "--start",
                "1",
                "--min-zoom",
                "14",
                "--max-zoom",
                "16",
                *args,
            ],
            stdout=out,
            stderr=out,
            env={**os.environ, "QBROKER_URL": amqp_url, "QBROKER_DRAIN_TIMEOUT": str(DRAIN)},
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    "answer",
    [*NOT_A_STATE, PORTAL, b"", b"sequenceNumber=-1\n", b"sequenceNumber=1e3\n", b"sequenceNumber=1000000000\n"],
)
def test_what_is_not_a_state_file_is_refused_as_one(answer: bytes) -> None:
    """A ReplicationError naming the URL, never a ValueError (which ended the follower with a traceback)."""
    with pytest.raises(ReplicationError, match=r"^http://mirror/state\.txt: no valid sequenceNumber$"):
        parse_state(answer, "http://mirror/state.txt")
    assert parse_state(b"sequenceNumber=0000042\n", "x").sequence == 42
    assert parse_state(b"sequenceNumber=999999999\n", "x").sequence == 999_999_999


async def test_a_download_is_bounded_in_size_and_in_total_time(tmp_path) -> None:
    publish(tmp_path / "replication" / "minute", 1, osc())
    with serving(tmp_path) as server:
        source = HttpSource(server.url + "replication/minute/", timeout=30, deadline=0.5, retries=0)
        try:
            server.answers[STATE] = [Answer(b"#" * (STATE_BYTES + 1)), Answer(b"#" * 1000, drip=0.05)]
            with pytest.raises(ReplicationError, match=rf"state\.txt: over {STATE_BYTES} bytes"):
                await source.latest()
            with pytest.raises(SourceUnavailable, match=r"state\.txt: not read within 0\.5 s \(--http-deadline\)"):
                await source.latest()  # each read well within the 30 s timeout
            assert (await source.latest()).sequence == 1  # as published, on the same session
        finally:
            await source.close()
        await eventually(lambda: (STATE, "drip abandoned by the client") in server.log)


async def test_bad_answers_are_counted_and_backed_off_until_the_server_answers_well(
    store_bridge, store, extract, amqp_url, tmp_path
) -> None:
    mirror = tmp_path / "mirror"
    publish(mirror / "replication" / "minute", 1, osc(modify=[renamed(extract, "Hostilinkatu", 2)]))
    metrics, log = free_port(), tmp_path / "replicate.log"
    with serving(mirror) as server:
        # Five bad answers (four state files, then a good one with a diff that has XML entities) and a state
        # file dripped a byte every 0.2 s (its 70 bytes in 14 s), past the 1 s --http-deadline; then the files
        # as published.
        server.answers[STATE] = [
            *(Answer(bad) for bad in NOT_A_STATE),
            Answer(PORTAL, "text/html"),
            Answer((mirror / "replication/minute/state.txt").read_bytes(), drip=0.2),
        ]
        server.answers[DIFF_1] = [Answer(ENTITIES, "application/xml")]
        args = ("--interval", "0.05", "--max-backoff", "0.2", "--http-deadline", "1", "--metrics-port", str(metrics))
        with replicate(server.url + "replication/minute/", store, amqp_url, log, *args) as proc:

            async def caught_up() -> bool:
                assert proc.poll() is None, "a bad answer ended replication"
                return GeometryStore.of_store(store).sequence == 1

            await eventually(caught_up, timeout=3 * HANG, interval=0.1, context=lambda: tail(log))

            def round_done() -> str | None:  # the store holds diff 1 a moment before its round ends and says so
                text = scrape(metrics)
                done = (
                    value(text, "toposm_replicate_failures_in_a_row") == 0
                    and value(text, 'toposm_replicate_sequence{store="store"}') == 1
                )
                return text if done else None

            text = await eventually(round_done, timeout=HANG, interval=0.1, context=lambda: tail(log))
            assert value(text, 'toposm_replicate_failures_total{what="answer"}') == 5, text
            assert value(text, 'toposm_replicate_failures_total{what="source"}') >= 1  # the drip, not read in time
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=HANG) == 0, tail(log)
    out = log.read_text()
    assert "Traceback" not in out and "replication stopped" not in out
    assert out.count("source answered badly; backing off") == 5
    assert "no valid sequenceNumber" in out and "XML entities are not supported" in out
    assert "not read within 1 s (--http-deadline)" in out


async def test_sigterm_in_the_middle_of_a_download_ends_the_process_within_the_drain_timeout(
    store, amqp_url, tmp_path
) -> None:
    """A server that drips state.txt for ever, well within --http-timeout per read and before --http-deadline:
    SIGTERM cancels the download; the process exits 0 and leaves nothing behind."""
    mirror = tmp_path / "mirror"
    publish(mirror / "replication" / "minute", 1, osc())
    log = tmp_path / "replicate.log"
    with serving(mirror) as server:
        server.answers[STATE] = [Answer(b"#" * 100_000, drip=0.1)]
        with replicate(server.url + "replication/minute/", store, amqp_url, log) as proc:
            await eventually(lambda: (STATE, "drip started") in server.log, context=lambda: tail(log))
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=HANG / 2)  # a ceiling for a hang: the drain timeout is DRAIN
            except subprocess.TimeoutExpired:
                raise AssertionError("still running after SIGTERM:\n" + tail(log)) from None
            assert code == 0, tail(log)
            assert group_gone(proc.pid)  # no child left in its session
            await eventually(lambda: (STATE, "drip abandoned by the client") in server.log)
    assert "unit stopped" in log.read_text()


def test_once_reports_a_bad_answer_without_a_traceback(store, amqp_url, tmp_path) -> None:
    mirror = tmp_path / "mirror"
    publish(mirror / "replication" / "minute", 1, osc())
    log = tmp_path / "replicate.log"
    with serving(mirror) as server:
        server.answers[STATE] = [Answer(NOT_A_STATE[0])]
        with replicate(server.url + "replication/minute/", store, amqp_url, log, "--once") as proc:
            assert proc.wait(timeout=HANG) == 1
    out = log.read_text()
    assert (
        f"toposm-replicate: the source answered badly: {server.url}replication/minute/state.txt: "
        "no valid sequenceNumber" in out
    )
    assert "Traceback" not in out
