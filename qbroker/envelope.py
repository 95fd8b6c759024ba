"""The message envelope: the QBroker header, body and error element, to and from AMQP messages.

Header fields live where the protocol puts them: AMQP properties (app-id, message-id, reply-to,
correlation-id, content-type, type) and AMQP headers (``version``, ``name``, ``debug``, ``error``, plus
our ``deadline`` and ``app``). See docs/wire-format.md.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from typing import Any, Literal

from aio_pika.abc import AbstractIncomingMessage
from pamqp.commands import Basic
from pydantic import BaseModel, ValidationError

from qbroker.amqp_properties import WireProperties
from qbroker.codecs import JSON, CodecError, CodecRegistry, default_codecs
from qbroker.errors import BadMessage, ErrorInfo
from qbroker.original_dialect import ROUTING_KEY_HEADER, is_original_error, read_original_error

PROTOCOL_VERSION = 1
# Headers of a request that qbroker re-published: deliveries that ended without an answer, and retries
# after an error (rpc); a request sent to `dead` with one of them ran out of them (dead_letter).
FAILURES = "x-qbroker-failures"
RETRIES = "x-qbroker-retries"
MessageKind = Literal["rpc", "reply", "alert"]
# On a copy a server of our account re-published: the account that sent the request first (trusted_sender).
SENDER_HEADER = "x-qbroker-sender"
# On a reply to a request with ``debug``: how it was handled (debug_info; docs/wire-format.md).
DEBUG_INFO_HEADER = "debug_info"
_HOST = socket.gethostname()


class Header(BaseModel):
    """The QBroker header of a message, as read from its AMQP properties and headers."""

    version: int = PROTOCOL_VERSION
    app_id: str | None = None
    message_id: str | None = None
    reply_to: str | None = None
    name: str | None = None
    correlation_id: str | None = None
    debug: bool = False
    content_type: str = JSON
    type: str | None = None
    deadline: float | None = None
    app: str | None = None
    # AMQP user-id: RabbitMQ refuses a message whose user-id is not the publishing connection's user,
    # so on a broker that enforces it this names the sender's account, which the body cannot forge.
    user_id: str | None = None


class _RandomPool(threading.local):
    data = b""
    offset = 0


_random = _RandomPool()


def new_message_id() -> str:
    """32 random hex digits, as ``uuid.uuid4().hex`` gives, from the OS's random source read 4 KiB at a
    time (a tenth of the cost; every message needs one). Unpredictable on purpose: a forged reply would
    have to guess the id of the request it answers. Per thread, so two threads never share a slice."""
    pool = _random
    start = pool.offset
    if start + 16 > len(pool.data):
        pool.data, start = os.urandom(4096), 0
    pool.offset = start + 16
    return pool.data[start : start + 16].hex()


class OutgoingMessage:
    """A message to publish: its body and AMQP properties under aio-pika's ``Message`` attribute names,
    so every transport reads it as it reads an ``aio_pika.Message``, and ``properties`` gives the pamqp
    properties aiormq publishes. Unlike ``aio_pika.Message`` it checks nothing per attribute: a request
    and its reply each build one (docs/performance.md)."""

    __slots__ = (
        "body",
        "headers",
        "content_type",
        "content_encoding",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    )

    def __init__(
        self,
        body: bytes,
        *,
        headers: dict[str, Any] | None = None,
        content_type: str | None = None,
        content_encoding: str | None = None,
        delivery_mode: int | None = 1,
        priority: int | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        expiration: float | None = None,
        message_id: str | None = None,
        timestamp: float | datetime.datetime | None = None,
        type: str | None = None,
        user_id: str | None = None,
        app_id: str | None = None,
    ) -> None:
        self.body = body
        self.headers = headers if headers is not None else {}
        self.content_type = content_type
        self.content_encoding = content_encoding
        self.delivery_mode = delivery_mode or 1  # AMQP's default: transient
        self.priority = priority
        self.correlation_id = correlation_id
        self.reply_to = reply_to
        self.expiration = expiration  # seconds, as aio-pika has it; milliseconds on the wire
        self.message_id = message_id
        self.timestamp = timestamp
        self.type = type
        self.user_id = user_id
        self.app_id = app_id

    @property
    def properties(self) -> Basic.Properties:
        return WireProperties(self)

    def __repr__(self) -> str:
        return f"<OutgoingMessage type={self.type!r} message_id={self.message_id!r} {len(self.body)} bytes>"


def build_message(
    body: Any,
    *,
    kind: MessageKind,
    app_id: str,
    app: str,
    message_id: str,
    name: str | None = None,
    reply_to: str | None = None,
    correlation_id: str | None = None,
    debug: bool = False,
    error: ErrorInfo | None = None,
    error_extra: dict[str, Any] | None = None,
    content_type: str = JSON,
    deadline: float | None = None,
    expiration_s: float | None = None,
    priority: int | None = None,
    user_id: str | None = None,
    persistent: bool = False,
    notify: bool = False,
    notice: str | None = None,
    extra_headers: dict[str, Any] | None = None,
    codecs: CodecRegistry = default_codecs,
) -> OutgoingMessage:
    headers: dict[str, Any] = {"version": PROTOCOL_VERSION, "app": app}
    if notify:  # RQ DELIVERED, opt-in: the server tells the caller when it picks the request up
        headers["notify"] = "delivered"
    if notice is not None:  # such a notice: not the reply, which still follows
        headers["notice"] = notice
    if name is not None:
        headers["name"] = name
        headers[ROUTING_KEY_HEADER] = name  # the original QBroker's name for it (docs/interop.md)
    if debug:
        headers["debug"] = True
    if deadline is not None:
        # Epoch milliseconds as an integer: AMQP tables carry Python floats as 32-bit floats.
        headers["deadline"] = int(deadline * 1000)
    if error is not None:
        # ``error_extra``: keys a peer needs beside the protocol's (the original's, in replies to it: original_dialect).
        headers["error"] = error.header() if error_extra is None else {**error.header(), **error_extra}
    if extra_headers:  # a middleware's (e.g. traceparent): never in place of the protocol's own
        for key, value in extra_headers.items():
            headers.setdefault(key, value)
    # A JSON body is JSON, always: ``null`` where there is nothing (an empty one kills a peer that decodes it).
    data = b"null" if body is None and content_type == JSON else codecs.encode(body, content_type)
    return OutgoingMessage(
        data,
        headers=headers,
        content_type=content_type,
        app_id=app_id,
        message_id=message_id,
        reply_to=reply_to,
        correlation_id=correlation_id,
        type=kind,
        expiration=expiration_s,
        priority=priority,
        user_id=user_id,
        timestamp=time.time(),
        # Persistent only when asked (a guaranteed request): written to disk, it survives a broker restart.
        delivery_mode=2 if persistent else 1,
    )


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _optional_text(value: Any) -> str | None:
    value = _text(value)
    return value if isinstance(value, str) else None


def _deadline(raw: Any) -> float | None:
    return raw / 1000 if isinstance(raw, int) and not isinstance(raw, bool) else None


def read_header(message: AbstractIncomingMessage, *, require: tuple[str, ...] = ()) -> Header:
    """The header of an incoming message; raises BadMessage naming what is wrong."""
    raw = message.headers or {}
    if "version" not in raw:
        raise BadMessage("bad_header", "missing header: version")
    try:
        header = Header(
            version=raw["version"],
            app_id=message.app_id,
            message_id=message.message_id,
            reply_to=message.reply_to,
            # The original QBroker names the destination in ``routing-key`` only (docs/interop.md).
            name=_text(raw["name"] if "name" in raw else raw.get(ROUTING_KEY_HEADER)),
            correlation_id=message.correlation_id,
            debug=bool(raw.get("debug", False)),
            content_type=message.content_type or JSON,
            type=message.type,
            deadline=_deadline(raw.get("deadline")),
            # Not a protocol field (our own, informative): a foreign client's odd value must not cost the request.
            app=_optional_text(raw.get("app")),
            user_id=_text(getattr(message, "user_id", None)),
        )
    except ValidationError as exc:
        fields = ", ".join(".".join(str(p) for p in err["loc"]) for err in exc.errors())
        raise BadMessage("bad_header", f"invalid header fields: {fields}") from exc
    if header.version != PROTOCOL_VERSION:
        raise BadMessage("bad_version", f"unsupported protocol version {header.version} (supported: 1)")
    missing = [field for field in require if getattr(header, field) in (None, "")]
    if missing:
        raise BadMessage("bad_header", f"missing header: {', '.join(missing)}")
    return header


def read_error(message: AbstractIncomingMessage) -> ErrorInfo | None:
    raw = (message.headers or {}).get("error")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise BadMessage("bad_header", "header error is not a table")
    if is_original_error(raw):
        return read_original_error(raw)
    try:
        return ErrorInfo.model_validate({k: _text(v) for k, v in raw.items()})
    except ValidationError as exc:
        raise BadMessage("bad_header", "header error is not a valid error element") from exc


def read_body(
    message: AbstractIncomingMessage, *, accept: list[str], max_bytes: int, codecs: CodecRegistry = default_codecs
) -> Any:
    if len(message.body) > max_bytes:
        raise BadMessage("too_large", f"body of {len(message.body)} bytes exceeds the limit of {max_bytes}")
    try:
        return codecs.decode(message.body, message.content_type, accept)
    except CodecError as exc:
        raise BadMessage("bad_body", str(exc)) from exc


def trusted_sender(message: AbstractIncomingMessage, own_user: str) -> str | None:
    """The account that sent ``message`` originally: its user-id, or, on a copy re-published by a server
    of our own account (a redelivered request), the sender that server saw. Never a header from others."""
    user_id = _optional_text(getattr(message, "user_id", None))
    forwarded = _text((message.headers or {}).get(SENDER_HEADER))
    if user_id is not None and user_id == own_user and isinstance(forwarded, str):
        return forwarded or None
    return user_id


def debug_info(app: str, uuid: str, part: str, **facts: Any) -> dict[str, Any]:
    """The protocol's "debugging information" in a reply to a request with ``debug`` (docs/wire-format.md):
    who answered it, from where, and ``facts`` about how (the handler's time, a dead letter's reason)."""
    return {"app": app, "uuid": uuid, "host": _HOST, "pid": os.getpid(), "part": part, **facts}
