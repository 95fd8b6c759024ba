"""Hypothesis strategies for malformed AMQP messages, and a raw publisher that sends them.

Messages are generated in a thread before (or beside) the units under test, never on their event loop:
hypothesis is synchronous. The same seed gives the same messages (``derandomize``), so a failure is
reproducible from the test's parameters.
"""

from __future__ import annotations

import datetime
import string
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
import pamqp.encode
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pamqp.commands import Basic


class RawString(bytes):
    """A long string whose bytes go on the wire as they are (invalid UTF-8 included), as pika sends a
    ``bytes`` header value; pamqp alone would refuse it."""


_encode_table_value = pamqp.encode.encode_table_value


def _encode_with_raw(value: Any) -> bytes:
    if isinstance(value, RawString):
        return b"S" + len(value).to_bytes(4, "big") + bytes(value)
    return _encode_table_value(value)


pamqp.encode.encode_table_value = _encode_with_raw  # only RawString values take the new path

# RabbitMQ closes the connection (INTERNAL_ERROR) on some exotic table keys: keys stay printable ASCII,
# the values carry the garbage.
_key = st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=12)

# Values an AMQP table may carry (pamqp encodes these; RabbitMQ accepts them).
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=40),
    st.binary(max_size=40).map(bytearray),
    st.binary(max_size=40).map(RawString),
    st.datetimes(min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2100, 1, 1)),
)
table_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_key, inner, max_size=4)),
    max_leaves=12,
)
_forged_death = st.fixed_dictionaries(
    {},
    optional={
        "exchange": st.one_of(st.sampled_from(["rpc", "alert", "reply", "dead"]), table_value),
        "reason": st.one_of(st.sampled_from(["expired", "rejected", "maxlen"]), table_value),
        "queue": table_value,
        "count": table_value,
        "routing-keys": table_value,
    },
)
headers = st.fixed_dictionaries(
    {},
    optional={
        # Mostly well-formed version and name, so the fuzz reaches past the header checks.
        "version": st.one_of(st.just(1), st.just(1), st.just(1), table_value),
        "name": st.one_of(st.sampled_from(["t.fuzz", "fuzz.x"]), st.sampled_from(["t.fuzz", "t.cmd"]), table_value),
        "debug": table_value,
        "deadline": st.one_of(st.integers(0, 2**62), table_value),
        "error": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "status": st.one_of(st.sampled_from(["ok", "warn", "error", "fail"]), table_value),
                    "id": table_value,
                    "part": table_value,
                    "message": table_value,
                },
            ),
            table_value,
        ),
        "x-death": st.one_of(st.lists(st.one_of(_forged_death, table_value), max_size=3), table_value),
        "x-qbroker-failures": table_value,
        "app": table_value,
    },
).flatmap(lambda fixed: st.dictionaries(_key, table_value, max_size=3).map(lambda extra: {**extra, **fixed}))
shortstr = st.one_of(st.none(), st.text(max_size=30))
content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/json",
            "text/plain",
            "application/octet-stream",
            "application/x-python-pickle",
            "application/json; charset=utf-8",
            "APPLICATION/JSON",
            "",
        ]
    ),
    st.text(max_size=20),
)
json_bodies = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10,
).map(orjson.dumps)
bodies = st.one_of(
    st.binary(max_size=200),
    json_bodies,
    st.fixed_dictionaries({"n": st.one_of(st.integers(-(2**63), 2**63 - 1), table_value.map(repr))}).map(orjson.dumps),
    st.sampled_from([b'{"command": "stats"}', b'{"n": 1}', b"", b"\xff\xfe", b"null"]),
)


@dataclass
class Fuzzed:
    body: bytes
    headers: dict[str, Any]
    content_type: str | None
    message_id: str | None
    app_id: str | None
    correlation_id: str | None
    type: str | None
    priority: int | None
    wants_reply: bool
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def properties(self, reply_to: str) -> Basic.Properties:
        # The message-id we track is ours (unique): a fuzzed one is kept in the correlation-id instead.
        return Basic.Properties(
            content_type=self.content_type,
            headers=self.headers,
            message_id=self.token,
            app_id=self.app_id,
            correlation_id=self.correlation_id or self.message_id,
            message_type=self.type,
            priority=self.priority,
            reply_to=reply_to if self.wants_reply else None,
        )


messages = st.builds(
    Fuzzed,
    body=bodies,
    headers=headers,
    content_type=content_types,
    message_id=shortstr,
    app_id=shortstr,
    correlation_id=shortstr,
    type=st.one_of(st.none(), st.sampled_from(["rpc", "alert", "reply"]), st.text(max_size=8)),
    priority=st.one_of(st.none(), st.integers(0, 9)),
    wants_reply=st.sampled_from([True, True, False]),
)


def generate(count: int, seed: int = 0) -> list[Fuzzed]:
    """``count`` fuzzed messages (hypothesis's generation phase only: no shrinking, no database)."""
    out: list[Fuzzed] = []

    @settings(
        max_examples=count,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(messages)
    def collect(message: Fuzzed) -> None:
        out.append(message)

    collect()
    return out
