"""A replication server on 127.0.0.1 (port 0) serving a directory as planet.openstreetmap.org does, with faults.

Faults, set by the test: ``down`` (the next N requests answer 503, as a server being restarted does),
``cut`` (the next download of that path stops half-way, its Content-Length promising the whole file) and
``answers`` (what the next requests of a path get instead of the file, one ``Answer`` each: a hostile or
broken server, a captive portal, or one that drips its answer a byte at a time).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Answer:
    """200 with ``body`` (its whole length as Content-Length); with ``drip``, one byte every ``drip`` seconds."""

    body: bytes
    content_type: str = "text/plain"
    drip: float | None = None


class ReplicationServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), partial(_Handler, directory=str(root)))
        self.down = 0
        self.cut: set[str] = set()
        self.answers: dict[str, list[Answer]] = {}
        self.log: list[tuple[str, str]] = []  # (path, what happened: a status, "cut", "answer", "drip ...")
        self.lock = threading.Lock()
        self.closing = threading.Event()  # ends the drips still going

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class _Handler(SimpleHTTPRequestHandler):
    server: ReplicationServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        srv = self.server
        with srv.lock:
            down = srv.down > 0
            srv.down -= 1 if down else 0
            cut = self.path in srv.cut
            srv.cut.discard(self.path)
            queued = srv.answers.get(self.path)
            answer = queued.pop(0) if queued else None
        if answer is not None:
            self._answer(answer)
            return
        if down:
            srv.log.append((self.path, "503"))
            self.send_error(503, "down for maintenance")
            return
        local = Path(self.translate_path(self.path))
        if cut and local.is_file():
            data = local.read_bytes()
            srv.log.append((self.path, "cut"))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        srv.log.append((self.path, "200" if local.is_file() else "404"))
        super().do_GET()

    def _answer(self, answer: Answer) -> None:
        srv = self.server
        self.send_response(200)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        if answer.drip is None:
            srv.log.append((self.path, "answer"))
            self.wfile.write(answer.body)
            return
        srv.log.append((self.path, "drip started"))
        self.close_connection = True
        try:
            for i in range(len(answer.body)):
                self.wfile.write(answer.body[i : i + 1])
                self.wfile.flush()
                if srv.closing.wait(answer.drip):
                    return
        except (BrokenPipeError, ConnectionResetError):
            srv.log.append((self.path, "drip abandoned by the client"))
            return
        srv.log.append((self.path, "drip finished"))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@contextmanager
def serving(root: Path) -> Iterator[ReplicationServer]:
    server = ReplicationServer(root)
    thread = threading.Thread(target=server.serve_forever, name="replication-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
