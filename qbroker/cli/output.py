"""Printing results: pretty, coloured JSON on a terminal, plain JSON when piped; messages on stderr."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import orjson


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
    option = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
    return orjson.dumps(value, default=_default, option=option).decode()


def print_result(value: Any, *, raw: bool = False, stream: TextIO | None = None) -> None:
    """Print one reply body to stdout.

    ``raw``: for pipes; a string body is printed as is (like ``jq -r``), anything else as one compact
    JSON line. Otherwise pretty JSON, coloured when the stream is a terminal.
    """
    out = stream or sys.stdout
    if raw:
        if isinstance(value, bytes | bytearray):
            out.flush()
            out.buffer.write(bytes(value))  # type: ignore[attr-defined]
            out.buffer.flush()  # type: ignore[attr-defined]
            return
        out.write((value if isinstance(value, str) else to_json(value)) + "\n")
        out.flush()
        return
    if out.isatty():
        from rich.console import Console

        Console(file=out).print_json(to_json(value))
        return
    out.write(to_json(value, indent=True) + "\n")
    out.flush()


def print_json_line(value: Any, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    out.write(to_json(value) + "\n")
    out.flush()


def say(message: str, *, style: str | None = None) -> None:
    """One line on stderr (coloured on a terminal); stdout stays clean for pipes."""
    if sys.stderr.isatty() and style:
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[{style}]{escape(message)}[/]")
        return
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
