"""One line per event for people (coloured on a terminal), or one JSON object per line for tools.

Line columns: time, kind, name, from app/uuid, correlation id, status, size, latency (replies).
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any, TextIO

from qbroker.cli.output import printable, to_json
from qbroker.cli.snoop.events import Event

KIND_STYLE = {"alert": "magenta", "request": "cyan", "reply": "green", "dead": "red"}
STATUS_STYLE = {"ok": "green", "warn": "yellow", "error": "red", "fail": "bold red"}
SHORT_ID = 8
BODY_CHARS = 4000  # a body in a line view is cut here; --json always carries it whole


def _body_text(body: Any) -> str:
    text = to_json(body)
    if len(text) <= BODY_CHARS:
        return text
    return f"{text[:BODY_CHARS]}… ({len(text) - BODY_CHARS} more characters; --json shows all)"


def _short(value: str | None) -> str:
    return value[:SHORT_ID] if value else "-"


def _size(n: int) -> str:
    return f"{n}B" if n < 10_000 else f"{n / 1024:.1f}KiB"


def columns(event: Event) -> list[tuple[str, str | None]]:
    """(text, rich style) per column; kept separate from colouring so plain output is identical. Every
    text is escaped (``printable``): names, apps, statuses and error messages all come off the wire."""
    clock = datetime.fromtimestamp(event.time).strftime("%H:%M:%S.%f")[:-3]
    sender = f"{event.app or '?'}/{_short(event.uuid)}"
    if event.kind == "reply":
        sender += f" -> {event.to_app or '?'}/{_short(event.to_uuid)}"
    status = event.status or "-"
    if event.error_id and event.status != "ok":
        status += f":{event.error_id}"
    elif event.error_id:  # status ok with an id: the error state it names is over
        status += f":clears {event.error_id}"
    if event.kind == "dead":
        status = event.reason or "dead"
    latency = f"{event.latency_ms:.1f}ms" if event.latency_ms is not None else ""
    cols: list[tuple[str, str | None]] = [
        (clock, "dim"),
        (f"{event.kind:<7}", KIND_STYLE.get(event.kind)),
        (f"{event.name or '?':<28}", "bold"),
        (f"{sender:<34}", None),
        (f"cid={_short(event.correlation_id)}", "dim"),
        (f"{status:<8}", STATUS_STYLE.get(event.status or "", "red" if event.kind == "dead" else None)),
        (f"{_size(event.size):>8}", "dim"),
    ]
    if latency:
        cols.append((f"{latency:>9}", "yellow"))
    if event.kind == "dead" and event.via:
        cols.append((f"via {event.via}", "dim"))
    if event.error_message and event.status in ("warn", "error", "fail"):
        cols.append((event.error_message, STATUS_STYLE.get(event.status or "")))
    return [(printable(text), style) for text, style in cols]


class Renderer:
    def __init__(self, *, as_json: bool, with_body: bool, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.as_json = as_json
        self.with_body = with_body
        self._console: Any = None
        if not as_json and self.stream.isatty():
            from rich.console import Console

            self._console = Console(file=self.stream, highlight=False, soft_wrap=True)

    def show(self, event: Event) -> None:
        if self.as_json:
            self.stream.write(to_json(event.as_json(with_body=self.with_body)) + "\n")
            self.stream.flush()
            return
        cols = columns(event)
        if self._console is not None:
            from rich.text import Text

            line = Text(" ").join(Text(text, style=style or "") for text, style in cols)
            self._console.print(line)
            if self.with_body:
                self._console.print(Text("    " + _body_text(event.body), style="dim"))
            return
        self.stream.write(" ".join(text for text, _ in cols) + "\n")
        if self.with_body:
            self.stream.write("    " + _body_text(event.body) + "\n")
        self.stream.flush()
