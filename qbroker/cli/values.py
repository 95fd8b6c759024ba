"""Turning command-line words into a request body.

``key=value`` values parse as JSON when they can (``zoom=15``, ``tiles='["1/0/0"]'``, ``flag=true``)
and fall back to the literal string otherwise (``name=Berlin``). To force a string that looks like
JSON, quote it as a JSON string: ``zoom='"15"'``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

import orjson

from qbroker.cli.exit_codes import UsageProblem


def parse_value(text: str) -> Any:
    """A value as JSON if it is valid JSON, else the text itself."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def split_assignment(word: str) -> tuple[str, Any] | None:
    """``key=value`` -> (key, parsed value); None when ``word`` is not an assignment.

    A word whose part before the first ``=`` is empty or contains characters that cannot be a
    parameter name (spaces, quotes, braces) is not an assignment, so JSON-ish positional text is
    never silently split.
    """
    key, sep, value = word.partition("=")
    if not sep or not key or not _looks_like_key(key):
        return None
    return key, parse_value(value)


def _looks_like_key(key: str) -> bool:
    return all(ch.isalnum() or ch in "_-." for ch in key)


def parse_assignments(words: Sequence[str]) -> dict[str, Any]:
    """All words must be ``key=value``; a repeated key is a usage problem, not a silent overwrite."""
    body: dict[str, Any] = {}
    for word in words:
        pair = split_assignment(word)
        if pair is None:
            raise UsageProblem(f"expected key=value, got {word!r}")
        key, value = pair
        if key in body:
            raise UsageProblem(f"key {key!r} given twice")
        body[key] = value
    return body


def split_command_and_assignments(words: Sequence[str]) -> tuple[str | None, dict[str, Any]]:
    """``[COMMAND] [key=value ...]``: an optional leading bare word is the command."""
    command: str | None = None
    rest = list(words)
    if rest and split_assignment(rest[0]) is None:
        command = rest.pop(0)
    return command, parse_assignments(rest)


def load_json_option(source: str, stdin: TextIO | None = None) -> Any:
    """``--json '{...}'`` or ``--json -`` (read the whole body from stdin)."""
    if source == "-":
        text = (stdin or sys.stdin).read()
        where = "stdin"
    else:
        text = source
        where = "--json"
    if not text.strip():
        raise UsageProblem(f"{where} is empty; expected a JSON document")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise UsageProblem(f"{where} is not valid JSON: {exc}") from None


def build_body(
    json_source: str | None, words: Sequence[str], *, allow_command: bool, stdin: TextIO | None = None
) -> Any:
    """Assemble the request body from ``--json`` and positional words.

    ``--json`` gives the base body; a command and ``key=value`` pairs are merged into it when it is a
    dict (they win, so a saved body can be tweaked from the shell). With neither, the body is ``{}``.
    """
    if allow_command:
        command, pairs = split_command_and_assignments(words)
    else:
        command, pairs = None, parse_assignments(words)
    extra: dict[str, Any] = {}
    if command is not None:
        extra["command"] = command
    extra.update(pairs)
    if json_source is None:
        return extra
    body = load_json_option(json_source, stdin)
    if not extra:
        return body
    if not isinstance(body, dict):
        raise UsageProblem(
            f"cannot add {', '.join(sorted(extra))} to a --json body of type {type(body).__name__}; "
            "merging needs a JSON object"
        )
    return {**body, **extra}
