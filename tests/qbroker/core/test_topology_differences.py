"""Reading a broker's refusal of a re-declare, and a listing of what exists, as differences from qbroker's
declarations (qbroker.topology): the texts are RabbitMQ 3.10's, as it words them."""

from __future__ import annotations

import pytest

from qbroker.cli.provision_topology import compare, definitions
from qbroker.config import Config
from qbroker.topology import ABSENT, read_difference, shared_topology

CONFIG = Config()
SHARED = {(item.kind, item.name): item for item in shared_topology(CONFIG, ("osm",))}
VHOST = "in vhost 'v'"


@pytest.mark.parametrize(
    ("kind", "name", "text", "setting", "theirs"),
    [
        (
            "exchange",
            "dead",
            f"inequivalent arg 'type' for exchange 'dead' {VHOST}: received 'fanout' but current is 'topic'",
            "type",
            "topic",
        ),
        (
            "exchange",
            "alert",
            f"inequivalent arg 'alternate-exchange' for exchange 'alert' {VHOST}: received the value "
            "'dead' of type 'longstr' but current is none",
            "alternate-exchange",
            ABSENT,
        ),
        (
            "exchange",
            "osm",
            f"inequivalent arg 'durable' for exchange 'osm' {VHOST}: received 'true' but current is 'false'",
            "durable",
            False,
        ),
        (
            "queue",
            "dead",
            f"inequivalent arg 'x-message-ttl' for queue 'dead' {VHOST}: received '86400000' but current is '1000'",
            "x-message-ttl",
            1000,
        ),
        (
            "queue",
            "dead",
            f"inequivalent arg 'x-queue-type' for queue 'dead' {VHOST}: received none but current is the "
            "value 'quorum' of type 'longstr'",
            "x-queue-type",
            "quorum",
        ),
        (
            "queue",
            "dead.kept",
            f"inequivalent arg 'x-max-length' for queue 'dead.kept' {VHOST}: received '10000' but current is '5'",
            "x-max-length",
            5,
        ),
    ],
)
def test_a_refusal_names_one_setting_and_its_existing_value(
    kind: str, name: str, text: str, setting: str, theirs: object
) -> None:
    shared = SHARED[(kind, name)]
    difference = read_difference(shared, "PRECONDITION_FAILED - " + text)
    assert difference is not None and difference.setting == setting and difference.theirs == theirs
    adopted = shared.adopt(difference)
    assert adopted.setting(setting) == theirs
    assert difference.cost()  # every difference is said with what it costs


def test_what_qbroker_cannot_use_is_required_and_others_are_not() -> None:
    rpc, dead = SHARED[("exchange", "rpc")], SHARED[("exchange", "dead")]
    fanout = read_difference(
        rpc, f"inequivalent arg 'type' for exchange 'rpc' {VHOST}: received 'topic' but current is 'fanout'"
    )
    topic_dead = read_difference(
        dead, f"inequivalent arg 'type' for exchange 'dead' {VHOST}: received 'fanout' but current is 'topic'"
    )
    assert fanout is not None and fanout.required
    assert topic_dead is not None and not topic_dead.required
    # another object's refusal, or a text that is not one, is not read as this object's difference
    assert (
        read_difference(rpc, f"inequivalent arg 'type' for exchange 'alert' {VHOST}: received 'a' but current is 'b'")
        is None
    )
    assert read_difference(rpc, "ACCESS_REFUSED - access to exchange 'rpc' refused") is None


def test_provision_declares_and_compares_what_units_declare() -> None:
    shared = list(SHARED.values())
    out = definitions(shared, "v")
    assert {e["name"]: e["type"] for e in out["exchanges"]} == {
        "dead": "fanout",
        "dead.kept.in": "fanout",
        "rpc": "topic",
        "reply": "direct",
        "alert": "topic",
        "osm": "topic",
    }
    assert {(b["source"], b["destination"], b["routing_key"]) for b in out["bindings"]} == {
        ("dead", "dead", "#"),
        ("dead.kept.in", "dead.kept", "#"),
    }
    exchanges = [
        {
            "name": e["name"],
            "type": e["type"],
            "durable": True,
            "auto_delete": False,
            "arguments": [[k, "longstr", v] for k, v in e["arguments"].items()],
        }
        for e in out["exchanges"]
    ]
    queues = [
        {
            "name": q["name"],
            "durable": True,
            "auto_delete": False,
            "arguments": [[k, "long", v] for k, v in q["arguments"].items()],
        }
        for q in out["queues"]
    ]
    assert compare(shared, exchanges, queues) == []
    assert compare(shared, exchanges[1:], queues) is None  # not all there yet
    exchanges[0] = {**exchanges[0], "type": "topic"}  # the original QBroker's `dead`
    queues[0] = {**queues[0], "durable": False}
    found = compare(shared, exchanges, queues)
    assert found is not None
    assert [str(d) for d in found] == [
        "exchange 'dead': type is 'topic' there, qbroker declares 'fanout'",
        "queue 'dead': durable is false there, qbroker declares true",
    ]
