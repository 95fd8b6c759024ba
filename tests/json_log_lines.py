"""What ``QBROKER_LOG_FORMAT=json`` promises of a program's output (docs/logging.md): every line one JSON
object with an event, a level and a timestamp; the program's service lines name its unit."""

from __future__ import annotations

import json
from typing import Any

FIELDS = ("event", "level", "timestamp")


def json_lines(text: str, source: str = "output") -> list[dict[str, Any]]:
    """Every non-blank line of ``text`` parsed; an AssertionError names the first line that is not a JSON
    object with the fields every line has."""
    lines: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            raise AssertionError(f"{source} line {number} is not JSON: {line!r}\n{text[-3000:]}") from None
        assert isinstance(value, dict) and all(key in value for key in FIELDS), f"{source} line {number}: {line!r}"
        lines.append(value)
    return lines


def service_lines(lines: list[dict[str, Any]], app: str, events: set[str]) -> list[dict[str, Any]]:
    """The lines among ``lines`` whose event is one of ``events``; each must carry ``app`` and a uuid, the
    same uuid on all of them (one unit per program)."""
    found = [line for line in lines if line["event"] in events]
    assert {line["event"] for line in found} == events, (events, lines)
    for line in found:
        assert line.get("app") == app and isinstance(line.get("uuid"), str) and line["uuid"], line
    assert len({line["uuid"] for line in found}) == 1, found
    return found
