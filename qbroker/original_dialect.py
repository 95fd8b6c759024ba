"""The original QBroker's dialect (trio_qbroker): how it writes what the protocol leaves open, read here and, in
replies to it, written so that it reads them. See docs/interop.md.

What it writes differently:

- the request's name in the header ``routing-key`` (no ``name``); qbroker reads one for the other and sends both;
- its error element ``{_o: "m_err", s: status, m: message, c: class name, e: {_o: "exc", e: "module.Class",
  a0...}}``, read here into status, message and exception class (``python.<Class>``, raised by a qbroker
  caller as that type when it is one of the allowed built-ins: nothing named on the wire is ever imported here);
- its dead-letter collector's answer, the error of class ``DeadLettered``, read as ``no_server``.

What it reads: the protocol's error element means nothing to it (it decodes the header ``error`` with its own
object codec and takes a table without ``_o`` for a plain dict, on which its caller then fails), so a reply to
a request in its dialect carries, beside the protocol's keys, its own: status ``s``, message ``m``, class ``c``,
and for an allowed built-in exception or a dead letter the exception itself (``e``), which it raises as such
(``ValueError``, or its own ``DeadLettered`` for a request nobody served). Only in replies to it: everything
else qbroker sends stays the protocol's (docs/wire-format.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from qbroker.errors import NATIVE_EXCEPTIONS, ErrorInfo, NoServer, Status

ROUTING_KEY_HEADER = "routing-key"  # the original's name of the protocol's headers.name
ERROR_TAG = "m_err"  # the ``_o`` of its error element
EXCEPTION_TAG = "exc"  # the ``_o`` of an exception inside it
DEAD_LETTERED = "DeadLettered"  # the class of its dead-letter collector's answers
DEAD_LETTERED_PATH = "trio_qbroker.conn.DeadLettered"
DEAD_LETTER_PART = "original.dead_letter"
# Texts in the keys added for it: the protocol's keys carry the same at full length; these stay small so the
# header stays within a frame (qbroker.errors).
MAX_TEXT = 1000
MAX_CLASS_NAME = 100
_STATUSES: tuple[str, ...] = get_args(Status)
_NATIVE_NAMES = frozenset(cls.__name__ for cls in NATIVE_EXCEPTIONS)


def speaks_original(headers: Mapping[str, Any] | None) -> bool:
    """A message in the original's dialect: its name in ``routing-key``, none in ``name``."""
    return bool(headers) and ROUTING_KEY_HEADER in headers and "name" not in headers  # type: ignore[operator]


@dataclass(frozen=True)
class ForOriginal:
    """How to write a reply to a message in the original's dialect. ``dead_route`` (exchange, routing key):
    the reply is a dead-letter collector's answer, which the original raises as its own ``DeadLettered``."""

    dead_route: tuple[str, str] | None = None

    def error_keys(self, error: ErrorInfo) -> dict[str, Any]:
        return error_for_original(error, self.dead_route)


def for_original(headers: Mapping[str, Any] | None, dead_route: tuple[str, str] | None = None) -> ForOriginal | None:
    """A ForOriginal when ``headers`` (the message being answered) are in the original's dialect, else None."""
    return ForOriginal(dead_route) if speaks_original(headers) else None


def is_original_error(raw: Mapping[str, Any]) -> bool:
    return _text(raw.get("_o")) == ERROR_TAG and "status" not in raw


def _text(value: Any, limit: int | None = None) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    return value if limit is None else value[:limit]


def _class_name(raw: Mapping[str, Any]) -> str | None:
    """The exception's class as the original named it (``c``, else the last word of ``e.e``), if it is a name."""
    name = _text(raw.get("c"), MAX_CLASS_NAME)
    exc = raw.get("e")
    if not name and isinstance(exc, Mapping):
        path = _text(exc.get("e") or exc.get("b"), 300)
        name = path.rsplit(".", 1)[-1][:MAX_CLASS_NAME] if path else None
    return name if name and name.isidentifier() and name.isascii() else None


def read_original_error(raw: Mapping[str, Any]) -> ErrorInfo:
    """The original's error element as the protocol's: its DeadLettered as ``no_server``, any other exception as
    ``python.<Class>`` with the exception's text as message."""
    cls = _class_name(raw)
    exc = raw.get("e")
    text = _text(raw.get("m"), 4000) or (_text(exc.get("s"), 4000) if isinstance(exc, Mapping) else None) or ""
    if cls == DEAD_LETTERED:
        assert NoServer.summary is not None
        return ErrorInfo(
            status=NoServer.status,
            id=NoServer.error_id,
            part=DEAD_LETTER_PART,
            message=NoServer.summary,
            detail=text or None,
        )
    status = _text(raw.get("s"))
    return ErrorInfo(
        status=status if status in _STATUSES else "error",  # type: ignore[arg-type]
        id=f"python.{cls}" if cls else "error",
        message=text,
    )


def _exception(path: str, *args: str) -> dict[str, Any]:
    """An exception as the original's object codec encodes one: its class's import path and its arguments."""
    return {"_o": EXCEPTION_TAG, "e": path, **{f"a{n}": arg for n, arg in enumerate(args)}}


def error_for_original(error: ErrorInfo, dead_route: tuple[str, str] | None = None) -> dict[str, Any]:
    """The keys that let the original read ``error`` (added beside the protocol's in the same ``error`` table).

    ``dead_route`` (exchange, routing key): the answer of a dead-letter collector, which the original raises as
    its own ``DeadLettered``, as its collector's answer would be. An allowed built-in exception goes as itself,
    anything else as the original's generic remote error (class = the error id)."""
    text = (error.detail or error.message or error.id)[:MAX_TEXT]
    keys: dict[str, Any] = {"_o": ERROR_TAG, "s": error.status, "m": text}
    if dead_route is not None:
        exchange, routing_key = dead_route
        keys.update(
            s="error",
            c=DEAD_LETTERED,
            m=f"Dead: queue={exchange} route={routing_key}"[:MAX_TEXT],
            e=_exception(DEAD_LETTERED_PATH, exchange[:255], routing_key[:255]),
        )
        return keys
    native = error.id.removeprefix("python.")
    if error.id.startswith("python.") and native in _NATIVE_NAMES:
        keys.update(c=native, e=_exception(f"builtins.{native}", text))
    else:
        keys["c"] = error.id[:MAX_CLASS_NAME]
    return keys
