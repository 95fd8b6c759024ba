"""A published message's AMQP properties, encoded in one pass, byte for byte as pamqp encodes them.

pamqp encodes a property list generically: for each of the 14 properties it looks the type up by name,
dispatches on it and checks it, then does the same for every entry of the header table. For qbroker's
envelope (9 properties and a 4-entry table on a request) that was about as much per message as all of
qbroker's own work on a reply (docs/performance.md, "Against the peers (morning, before the afternoon's
changes)"). Here the property list is written in one loop over the properties, with fast paths for the table
values qbroker itself sends (text, small and large integers, flags, nested tables: the error element) and
pamqp's own encoder for anything else, so the bytes are pamqp's for every property list
(tests/qbroker/core/test_amqp_properties.py checks that against pamqp for generated properties).

``WireProperties``, an ``OutgoingMessage``'s properties, is a ``pamqp.commands.Basic.Properties`` whose
``marshal()`` uses it: aiormq keeps its whole publish path (channel lock, delivery tags, confirms,
rollback) and only the encoding changes.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import encode
from pamqp.commands import Basic

if TYPE_CHECKING:
    from qbroker.envelope import OutgoingMessage

_ULONG = struct.Struct(">I")
_FLAGS = struct.Struct(">H")
_TIMESTAMP = struct.Struct(">Q")
_EMPTY_TABLE = b"\x00\x00\x00\x00"
_MAX_KEY = 128  # pamqp truncates longer table keys (with a warning): its own encoder does that
_MEMO_SIZE = 1024

# Encodings of the values that repeat from message to message (content type, app-id, user-id, a
# client's reply-to, the default expiration, the ``version``, ``app`` and ``name`` header entries):
# a dict lookup instead of encoding them again. Bounded: cleared when full, so a stream of distinct
# values (copies of foreign requests) costs a re-encode, never memory.
_memo: dict[object, bytes] = {}


def _remember(key: object, encoded: bytes) -> bytes:
    if len(_memo) >= _MEMO_SIZE:
        _memo.clear()
    _memo[key] = encoded
    return encoded


def _short_string(text: str) -> bytes:
    data = text.encode() if type(text) is str else None  # noqa: E721 - exactly str, as pamqp requires
    if data is None or len(data) > 255:
        return encode.short_string(text)  # raises pamqp's TypeError
    return bytes((len(data),)) + data


def _repeated_short_string(text: str) -> bytes:
    encoded = _memo.get(text)
    return encoded if encoded is not None else _remember(text, _short_string(text))


def _table_entry(key: str, value: Any) -> bytes | None:
    """One entry of a table, or None for a key pamqp would truncate (its own encoder does that)."""
    if len(key) > _MAX_KEY // 4 and len(key.encode()) > _MAX_KEY:  # 4 bytes per character at most
        return None
    encoded_key = _repeated_short_string(key)  # a table key is written as a short string
    kind = type(value)
    if kind is str:
        data = value.encode()
        return encoded_key + b"S" + _ULONG.pack(len(data)) + data
    if kind is int:
        return encoded_key + encode.table_integer(value)
    if kind is bool:
        return encoded_key + (b"t\x01" if value else b"t\x00")
    if kind is dict:
        return encoded_key + b"F" + encode_table(value)
    try:
        return encoded_key + encode.encode_table_value(value)
    except TypeError as exc:  # pamqp's message, as its field_table words it
        raise TypeError(f"{key} error: {exc}") from exc


def encode_table(table: dict[str, Any] | None) -> bytes:
    """An AMQP field table, as ``pamqp.encode.field_table`` writes it (keys sorted)."""
    if not table:
        return _EMPTY_TABLE
    if type(table) is not dict:  # noqa: E721
        return encode.field_table(table)
    parts: list[bytes] = []
    for item in sorted(table.items()):
        # A text entry is remembered whole, keyed by its (key, value) pair: never an int's or a flag's,
        # as ("debug", True) == ("debug", 1) would send one as the other.
        entry = _memo.get(item) if type(item[1]) is str else None  # noqa: E721
        if entry is None:
            entry = _table_entry(*item)
            if entry is None:
                return encode.field_table(table)
            if type(item[1]) is str:  # noqa: E721
                _remember(item, entry)
        parts.append(entry)
    data = b"".join(parts)
    return _ULONG.pack(len(data)) + data


def _timestamp(value: Any) -> bytes:
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return _TIMESTAMP.pack(int(value.timestamp()))
    return encode.timestamp(value)  # naive (taken as UTC) or a struct_time, as pamqp takes them


# (attribute, flag, encoder) in the order of the property list: AMQP 0-9-1, basic class.
_PROPERTIES: tuple[tuple[str, int, Callable[[Any], bytes]], ...] = (
    ("content_type", 0x8000, _repeated_short_string),
    ("content_encoding", 0x4000, _repeated_short_string),
    ("headers", 0x2000, encode_table),
    ("delivery_mode", 0x1000, encode.octet),
    ("priority", 0x0800, encode.octet),
    ("correlation_id", 0x0400, _short_string),
    ("reply_to", 0x0200, _repeated_short_string),
    ("expiration", 0x0100, _repeated_short_string),
    ("message_id", 0x0080, _short_string),
    ("timestamp", 0x0040, _timestamp),
    ("message_type", 0x0020, _repeated_short_string),
    ("user_id", 0x0010, _repeated_short_string),
    ("app_id", 0x0008, _repeated_short_string),
    ("cluster_id", 0x0004, _repeated_short_string),
)


def encode_properties(properties: Basic.Properties) -> bytes:
    """The property flags and list of a content header, as ``Basic.Properties.marshal()`` writes them:
    a property that is None or empty text is left out."""
    flags = 0
    parts: list[bytes] = []
    for name, flag, encoder in _PROPERTIES:
        value = getattr(properties, name)
        if value is not None and value != "":
            flags |= flag
            parts.append(encoder(value))
    return _FLAGS.pack(flags) + b"".join(parts)


def expiration_ms(seconds: float) -> str:
    """aio-pika's expiration in seconds, as the wire carries it: whole milliseconds, as text."""
    return str(int(seconds * 1000))


class WireProperties(Basic.Properties):
    """pamqp properties of an ``OutgoingMessage``: every attribute as pamqp has it, for whoever reads
    or sets them (aiormq gives a message without an id one), and ``marshal()`` through
    ``encode_properties``.

    No ``__slots__`` of its own on purpose: pamqp iterates ``self.__slots__`` (``__iter__``, ``__eq__``),
    which must stay the 14 properties."""

    def __init__(self, message: OutgoingMessage) -> None:  # no validate(): the values are our own
        self.content_type = message.content_type
        self.content_encoding = message.content_encoding
        self.headers = message.headers
        # Absent means transient in AMQP: one property less to encode and decode per message.
        self.delivery_mode = message.delivery_mode if message.delivery_mode != 1 else None
        self.priority = message.priority
        self.correlation_id = message.correlation_id
        self.reply_to = message.reply_to
        self.expiration = expiration_ms(message.expiration) if message.expiration is not None else None
        self.message_id = message.message_id
        timestamp = message.timestamp
        self.timestamp = (
            datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
            if isinstance(timestamp, int | float)
            else timestamp
        )
        self.message_type = message.type
        self.user_id = message.user_id
        self.app_id = message.app_id
        self.cluster_id = ""

    def marshal(self) -> bytes:
        return encode_properties(self)


def republishable(value: Any) -> Any:
    """A received header value as it can be published again. pamqp decodes a long string that is not
    UTF-8 to ``bytes`` but encodes only ``str`` and ``bytearray``: a copy of a foreign message (a retry, a
    kept dead letter) keeps such a value as a byte array, byte for byte, instead of failing to publish."""
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, dict):
        return {key: republishable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [republishable(item) for item in value]
    return value


# The properties travel in one content header frame, which must fit frame_max (RabbitMQ's default is 128 KiB);
# the broker closes the connection of a publisher that sends a bigger one. A copy of a received message (a
# retry, a redelivery count, a kept dead letter) adds headers to ones its sender may have filled to the brim:
# past this budget the copy leaves the largest of the received ones out (counted in LEFT_OUT_HEADER).
COPY_HEADERS_BUDGET = 96 * 1024
LEFT_OUT_HEADER = "x-qbroker-headers-left-out"


def _table_size(table: dict[str, Any]) -> int:
    return len(encode.field_table(table))


def copy_headers(received: dict[str, Any], added: dict[str, Any], budget: int = COPY_HEADERS_BUDGET) -> dict[str, Any]:
    """The headers of a copy of a received message: ``received`` with ``added`` over them, republishable, and
    within ``budget`` encoded bytes (``added`` always kept; received ones left out largest first)."""
    table = republishable({**received, **added})
    try:
        if _table_size(table) <= budget:
            return table  # the usual case: one encoding, nothing left out
        kept = republishable(dict(added))
        size = _table_size(kept)
        others = [(key, value) for key, value in table.items() if key not in kept]
        sized = sorted(((_table_size({key: value}) - 4, key, value) for key, value in others), key=lambda s: s[0])
    except TypeError:  # a value pamqp cannot encode: the publish says so, as it always did
        return table
    left_out = 0
    for item, key, value in sized:  # smallest first: the protocol's own headers are a few bytes each
        if size + item <= budget:
            kept[key] = value
            size += item
        else:
            left_out += 1
    kept[LEFT_OUT_HEADER] = left_out
    return kept
