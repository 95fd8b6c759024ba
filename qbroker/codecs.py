"""Body codecs keyed by content type, with an accept allow-list (after kombu's registry)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel


class CodecError(ValueError):
    """A body could not be encoded or decoded with its content type."""


@dataclass(frozen=True)
class Codec:
    content_type: str
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _encode_json(value: Any) -> bytes:
    try:
        return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        raise CodecError(str(exc)) from exc


def _decode_json(data: bytes) -> Any:
    if not data:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"body is not valid JSON: {exc}") from exc


def _encode_text(value: Any) -> bytes:
    if not isinstance(value, str):
        raise CodecError(f"text/plain body must be a str, not {type(value).__name__}")
    return value.encode("utf-8")


def _decode_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodecError(f"text/plain body is not UTF-8: {exc}") from exc


def _encode_bytes(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise CodecError(f"a binary body must be bytes, not {type(value).__name__}")
    return bytes(value)


JSON = "application/json"
# The original QBroker's names (docs/interop.md): its default body codec, JSON with objects it tags ``_o`` (read
# here as the JSON it is, tags and all), and its bytes. Read, and written when a caller asks for them.
JSON_OBJ = "application/json+obj"
BINARY = "application/binary"
OCTET_STREAM = "application/octet-stream"


class CodecRegistry:
    """Codecs by content type. Only types in ``accept`` are decoded; anything else is refused."""

    def __init__(self, codecs: Iterable[Codec] = ()) -> None:
        self._codecs: dict[str, Codec] = {}
        for codec in codecs:
            self.register(codec)

    def register(self, codec: Codec) -> None:
        self._codecs[codec.content_type] = codec

    def encode(self, value: Any, content_type: str = JSON) -> bytes:
        codec = self._codecs.get(_base_type(content_type))
        if codec is None:
            raise CodecError(f"no codec for content type {content_type!r}")
        return codec.encode(value)

    def decode(self, data: bytes, content_type: str | None, accept: Iterable[str]) -> Any:
        ctype = _base_type(content_type or JSON)
        if ctype not in accept:
            raise CodecError(f"content type {ctype!r} is not accepted (accepted: {', '.join(accept)})")
        codec = self._codecs.get(ctype)
        if codec is None:
            raise CodecError(f"no codec for content type {ctype!r}")
        return codec.decode(data)


def _base_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


default_codecs = CodecRegistry(
    [
        Codec(JSON, _encode_json, _decode_json),
        Codec("text/plain", _encode_text, _decode_text),
        Codec(OCTET_STREAM, _encode_bytes, bytes),
        Codec(JSON_OBJ, _encode_json, _decode_json),
        Codec(BINARY, _encode_bytes, bytes),
    ]
)
