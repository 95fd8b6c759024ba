"""Decoding a captured delivery into the event that ``qbroker-debug`` prints.

Decoding is deliberately tolerant: a debugger must show malformed messages, not drop them. Bodies are
decoded only as JSON or UTF-8 text; anything else is shown by size and content type (nothing from the
wire is ever unpickled or imported).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from qbroker.cli.snoop.captured import Captured, text
from qbroker.codecs import JSON, JSON_OBJ
from qbroker.original_dialect import ROUTING_KEY_HEADER, is_original_error, read_original_error

Kind = Literal["alert", "request", "reply", "dead"]
KINDS: tuple[Kind, ...] = ("alert", "request", "reply", "dead")
STATUSES = ("ok", "warn", "error", "fail")
ROLE_KIND: dict[str, Kind] = {"rpc": "request", "reply": "reply", "alert": "alert", "dead": "dead"}


@dataclass
class Event:
    time: float
    kind: Kind
    name: str | None
    app: str | None  # sender's app name (header ``app``)
    uuid: str | None  # sender's unit uuid (AMQP app-id)
    message_id: str | None
    correlation_id: str | None  # for a request/alert: its own message id, which replies will carry
    reply_to: str | None
    status: str | None  # replies only: ok / warn / error / fail
    error_id: str | None
    error_message: str | None
    size: int
    content_type: str | None
    to_uuid: str | None = None  # replies: the caller's uuid (the routing key on ``reply``)
    to_app: str | None = None
    latency_ms: float | None = None
    reason: str | None = None  # dead messages: why (expired, rejected, unroutable, ...)
    via: str | None = None  # dead messages: the exchange and routing key it was published to
    body: Any = None

    def as_json(self, *, with_body: bool) -> dict[str, Any]:
        data = asdict(self)
        data["time"] = datetime.fromtimestamp(self.time, UTC).isoformat(timespec="milliseconds")
        if not with_body:
            data.pop("body")
        return data


def decode_body(data: bytes, content_type: str | None) -> Any:
    ctype = (content_type or JSON).split(";", 1)[0].strip().lower()
    if ctype in (JSON, JSON_OBJ):  # the original QBroker's json+obj is JSON (docs/interop.md)
        if not data:
            return None
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return f"<invalid JSON, {len(data)} bytes>"
    if ctype.startswith("text/"):
        return data.decode("utf-8", "replace")
    return f"<{len(data)} bytes of {ctype}>"


def _dead_details(captured: Captured) -> tuple[str, str]:
    """Why a message reached ``dead`` and where it was going.

    Dead-lettered messages (expired in a queue, rejected) carry ``x-death``; a message that reached
    ``dead`` as the alternate exchange of ``rpc``/``alert`` has none: nobody was bound to its name.
    """
    deaths = captured.headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        # Anyone can publish a forged x-death: every field may be missing or of any type.
        first = deaths[0]
        keys = first.get("routing-keys")
        key = _str(keys[0]) if isinstance(keys, list) and keys else None
        return _str(first.get("reason")) or "dead-lettered", f"{_str(first.get('exchange')) or ''}:{key or ''}"
    return "unroutable", f"{captured.exchange}:{captured.routing_key}"


def _str(value: Any) -> str | None:
    """A header value as text, or None when it is not text (a debugger shows forged messages too)."""
    value = text(value)
    return value if isinstance(value, str) else None


def decode(captured: Captured, roles: dict[str, str]) -> Event | None:
    """The event for a delivery, or None when it is not QBroker traffic (``roles``: exchange -> role)."""
    if captured.source == "dead":
        kind: Kind = "dead"
    else:
        role = roles.get(captured.exchange)
        if role is None:
            return None
        kind = ROLE_KIND[role]
    headers = captured.headers if isinstance(captured.headers, dict) else {}
    error = headers.get("error") if isinstance(headers.get("error"), dict) else None
    if error is not None and is_original_error(error):  # the original QBroker's element, in the protocol's terms
        error = read_original_error(error).model_dump()
    # The original QBroker names a request in ``routing-key`` only; its routing key may be an address.
    name = (
        _str(headers.get("name"))
        or _str(headers.get(ROUTING_KEY_HEADER))
        or (captured.routing_key if kind in ("request", "alert") else None)
    )
    event = Event(
        time=captured.seen_at,
        kind=kind,
        name=name,
        app=_str(headers.get("app")),
        uuid=captured.app_id,
        message_id=captured.message_id,
        correlation_id=captured.correlation_id if kind == "reply" else captured.message_id,
        reply_to=captured.reply_to,
        status=(_str(error.get("status")) if error else "ok") if kind == "reply" else None,
        error_id=_str(error.get("id")) if error else None,
        error_message=_str(error.get("message")) if error else None,
        size=len(captured.body),
        content_type=captured.content_type,
        to_uuid=captured.routing_key if kind == "reply" else None,
        body=decode_body(captured.body, captured.content_type),
    )
    if kind == "dead":
        event.reason, event.via = _dead_details(captured)
        if event.correlation_id is None:
            event.correlation_id = captured.correlation_id
    return event
