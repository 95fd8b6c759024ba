"""``qbroker.amqp_properties`` writes a property list byte for byte as pamqp does, for any properties,
and a message published with it reads back the same through pamqp's decoder (as every client does)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import encode
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from qbroker.amqp_properties import WireProperties, encode_properties, encode_table
from qbroker.envelope import OutgoingMessage, build_message, new_message_id
from qbroker.errors import ErrorInfo

short_text = st.text(max_size=40) | st.sampled_from(["", "application/json", "rpc", "reply", "guest", "é" * 127])
keys = st.text(min_size=1, max_size=20) | st.sampled_from(["version", "app", "name", "deadline", "k" * 129])
scalars = (
    st.text(max_size=30)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, width=32)
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.datetimes(timezones=st.just(datetime.UTC)).map(lambda d: d.replace(microsecond=0))
    | st.binary(max_size=10).map(bytearray)
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=8
)
tables = st.none() | st.dictionaries(keys, values, max_size=6)
timestamps = st.none() | st.datetimes(
    min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2200, 1, 1), timezones=st.just(datetime.UTC)
)


@settings(max_examples=300, deadline=None)
@given(
    content_type=st.none() | short_text,
    content_encoding=st.none() | short_text,
    headers=tables,
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | short_text,
    reply_to=st.none() | short_text,
    expiration=st.none() | st.integers(0, 10**9).map(str),
    message_id=st.none() | short_text,
    timestamp=timestamps,
    message_type=st.none() | short_text,
    user_id=st.none() | short_text,
    app_id=st.none() | short_text,
)
def test_property_lists_are_pamqps_byte_for_byte(**fields: Any) -> None:
    properties = Basic.Properties(**fields)
    try:
        expected = Basic.Properties.marshal(properties)
    except Exception as exc:  # pamqp refuses it: so must we, with the same words
        with pytest.raises(type(exc)) as ours:
            encode_properties(properties)
        assert str(ours.value) == str(exc)
        return
    assert encode_properties(properties) == expected
    # Twice: the second time the repeated values come from the memo.
    assert encode_properties(properties) == expected


@settings(max_examples=200, deadline=None)
@given(table=st.dictionaries(keys, values, max_size=8))
def test_tables_are_pamqps_byte_for_byte(table: dict[str, Any]) -> None:
    try:
        expected = encode.field_table(table)
    except Exception as exc:
        with pytest.raises(type(exc)) as ours:
            encode_table(table)
        assert str(ours.value) == str(exc)
        return
    assert encode_table(table) == expected == encode_table(table)


def test_true_and_one_are_not_confused_by_the_memo() -> None:
    # True == 1 and hash(True) == hash(1): a memo keyed on values alone would send one as the other.
    assert encode_table({"debug": True}) == encode.field_table({"debug": True})
    assert encode_table({"debug": 1}) == encode.field_table({"debug": 1})
    assert encode_table({"debug": "1"}) == encode.field_table({"debug": "1"})


def _envelopes() -> list[OutgoingMessage]:
    error = ErrorInfo(status="fail", id="bad_body", part="bench.echo", message="no", detail="n=1")
    return [
        build_message(
            {"text": "hello", "n": 1},
            kind="rpc",
            app_id="a" * 32,
            app="bench.client",
            message_id=new_message_id(),
            name="bench.echo",
            reply_to="b" * 32,
            deadline=1795500000.25,
            expiration_s=60,
            user_id="guest",
            persistent=True,
            notify=True,
            debug=True,
            priority=5,
        ),
        build_message(
            None,
            kind="reply",
            app_id="c" * 32,
            app="bench.server",
            message_id=new_message_id(),
            correlation_id="d" * 32,
            error=error,
            user_id="guest",
        ),
        build_message(
            {"x": 1},
            kind="alert",
            app_id="e" * 32,
            app="ä-app",
            message_id=new_message_id(),
            name="some.alert",
            expiration_s=0.001,
        ),
    ]


@pytest.mark.parametrize("message", _envelopes(), ids=["request", "error reply", "alert"])
def test_qbrokers_envelopes_decode_to_what_was_built(message: OutgoingMessage) -> None:
    properties = message.properties
    assert isinstance(properties, WireProperties)
    assert properties.marshal() == Basic.Properties.marshal(properties)
    frame = ContentHeader(body_size=len(message.body), properties=properties).marshal()
    decoded = ContentHeader()
    decoded.unmarshal(frame)
    got = decoded.properties
    assert got.message_id == message.message_id and got.message_type == message.type
    assert got.app_id == message.app_id and got.correlation_id == message.correlation_id
    assert got.delivery_mode == (None if message.delivery_mode == 1 else message.delivery_mode)
    assert got.expiration == (None if message.expiration is None else str(int(message.expiration * 1000)))
    assert got.timestamp is not None and message.timestamp is not None
    assert int(got.timestamp.timestamp()) == int(float(message.timestamp))  # type: ignore[arg-type]

    def text(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: text(v) for k, v in value.items()}
        return value.decode() if isinstance(value, bytes) else value

    assert text(got.headers) == message.headers


def test_a_property_set_after_building_is_sent() -> None:
    # aiormq gives a message without an id one by setting it on the properties before marshalling.
    message = OutgoingMessage(b"{}", content_type="application/json", timestamp=0.0)
    properties = message.properties
    properties.message_id = "set-late"
    assert properties.marshal() == Basic.Properties.marshal(properties)
    assert b"set-late" in properties.marshal()


def test_the_memo_stays_bounded() -> None:
    from qbroker import amqp_properties

    for n in range(3 * amqp_properties._MEMO_SIZE):
        properties = Basic.Properties(app_id=f"app-{n}", headers={"name": f"n{n}"})
        assert encode_properties(properties) == Basic.Properties.marshal(properties)
    assert len(amqp_properties._memo) <= amqp_properties._MEMO_SIZE


def test_a_received_non_utf8_header_can_be_published_again() -> None:
    # pamqp decodes a long string that is not UTF-8 to bytes and refuses bytes when encoding: a retry or
    # a kept dead letter of a foreign message carrying one must still publish, its bytes unchanged.
    from pamqp import decode

    from qbroker.amqp_properties import republishable

    received = {"x": b"'5\xbf\xed^", "nested": {"list": [b"\xff", "text", 3]}}
    with pytest.raises(TypeError):
        encode.field_table(received)
    _, decoded = decode.field_table(encode.field_table(republishable(received)))
    assert decoded == {"x": bytearray(b"'5\xbf\xed^"), "nested": {"list": [bytearray(b"\xff"), "text", 3]}}
