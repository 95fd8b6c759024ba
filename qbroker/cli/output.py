"""Printing results: pretty, coloured JSON on a terminal, plain JSON when piped; messages on stderr.

Whatever came off the wire is hostile text: every text the CLI prints passes through ``printable``
(``qbroker.printable``, the one escaping function) or through ``to_json``, which applies it, piped or on a
terminal. The one exception is ``--raw`` of a binary body into a pipe, which is the body's bytes by request
(``qbroker call ... --raw > tile.png``).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import orjson

from qbroker.printable import printable


def _default(value: Any) -> Any:
    """orjson fallback for values the core may hand back (pydantic models, bytes, sets)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def to_json(value: Any, *, indent: bool = False) -> str:
    """JSON text safe to print: orjson escapes C0 inside strings, ``printable`` the C1 codes and DEL it
    leaves (the newlines it keeps are the indentation's: a string's own are escaped as ``\\n``)."""
    option = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
    return printable(orjson.dumps(value, default=_default, option=option).decode(), lines=True)


def json_renderable(value: Any) -> Any:
    """Pretty, highlighted JSON for rich, from ``to_json``'s text as it is (rich's own JSON view parses it
    again and would print the escaped characters raw)."""
    from rich.highlighter import JSONHighlighter
    from rich.text import Text

    return JSONHighlighter()(Text(to_json(value, indent=True)))


def print_result(value: Any, *, raw: bool = False, stream: TextIO | None = None) -> None:
    """Print one reply body to stdout.

    ``raw``: for pipes; a string body is printed as is (like ``jq -r``), anything else as one compact
    JSON line. Otherwise pretty JSON, coloured when the stream is a terminal.
    """
    out = stream or sys.stdout
    if raw:
        if isinstance(value, bytes | bytearray) and not out.isatty():
            out.flush()
            out.buffer.write(bytes(value))  # type: ignore[attr-defined]
            out.buffer.flush()  # type: ignore[attr-defined]
            return
        if isinstance(value, bytes | bytearray):  # binary on a terminal: shown, escaped
            value = bytes(value).decode("utf-8", "backslashreplace")
        out.write((printable(value, lines=True) if isinstance(value, str) else to_json(value)) + "\n")
        out.flush()
        return
    if out.isatty():
        from rich.console import Console

        Console(file=out).print(json_renderable(value))
        return
    out.write(to_json(value, indent=True) + "\n")
    out.flush()


def print_json_line(value: Any, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    out.write(to_json(value) + "\n")
    out.flush()


def say(message: str, *, style: str | None = None) -> None:
    """One line on stderr (coloured on a terminal); stdout stays clean for pipes. Messages quote the wire
    (error messages, app ids): escaped by ``printable``."""
    from qbroker.log import json_lines, operator_line  # here: `qbroker --help` loads no logging

    level = "error" if style and "red" in style else "warning" if style == "yellow" else "info"
    if json_lines() and operator_line(message, level):  # JSON logs: every stderr line is JSON
        return
    message = printable(message)
    if sys.stderr.isatty() and style:
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[{style}]{escape(message)}[/]")
        return
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
