"""The pure parts, without a broker: value parsing, decoding, pairing, filters, directory, lines."""

from __future__ import annotations

import io
import time

import pytest

from qbroker.cli.exit_codes import ExitCode, UsageProblem, exit_code_for
from qbroker.cli.snoop.captured import Captured
from qbroker.cli.snoop.directory import DISCOVERY_ALERTS, UnitDirectory
from qbroker.cli.snoop.events import decode
from qbroker.cli.snoop.filters import EventFilter
from qbroker.cli.snoop.pairing import RequestTracker
from qbroker.cli.snoop.render import Renderer, columns
from qbroker.cli.values import build_body, parse_value, split_command_and_assignments

ROLES = {"rpc": "rpc", "reply": "reply", "alert": "alert", "dead": "dead"}


def test_values_parse_as_json_else_string() -> None:
    assert parse_value("15") == 15 and parse_value("1.5") == 1.5 and parse_value("true") is True
    assert parse_value('["1/0/0"]') == ["1/0/0"] and parse_value("null") is None
    assert parse_value("Berlin") == "Berlin" and parse_value("14/1/2") == "14/1/2"
    assert parse_value('"15"') == "15" and parse_value("") == ""


def test_command_and_assignments() -> None:
    assert split_command_and_assignments(["stats"]) == ("stats", {})
    assert split_command_and_assignments(["render", "zoom=15"]) == ("render", {"zoom": 15})
    assert split_command_and_assignments(["zoom=15"]) == (None, {"zoom": 15})
    with pytest.raises(UsageProblem, match="expected key=value"):
        split_command_and_assignments(["render", "now"])
    with pytest.raises(UsageProblem, match="twice"):
        split_command_and_assignments(["a=1", "a=2"])
    # A leading '=' or JSON-ish text is not an assignment, so it is (wrongly placed) positional text.
    with pytest.raises(UsageProblem):
        split_command_and_assignments(["x", '{"a=1}'])


def test_build_body_from_json_and_stdin() -> None:
    assert build_body(None, [], allow_command=True) == {}
    assert build_body("-", [], allow_command=True, stdin=io.StringIO('{"a": 1}')) == {"a": 1}
    assert build_body('{"a": 1, "b": 2}', ["b=3"], allow_command=True) == {"a": 1, "b": 3}
    assert build_body('"just text"', [], allow_command=False) == "just text"
    with pytest.raises(UsageProblem, match="stdin is empty"):
        build_body("-", [], allow_command=True, stdin=io.StringIO(""))
    with pytest.raises(UsageProblem, match="not valid JSON"):
        build_body("{", [], allow_command=True)
    with pytest.raises(UsageProblem, match="merging needs a JSON object"):
        build_body("[1]", ["a=1"], allow_command=True)


def test_exit_codes_for_core_errors() -> None:
    from qbroker import errors

    assert exit_code_for(errors.RequestError("db_down", "x")) == ExitCode.ERROR
    assert exit_code_for(errors.HandlerCrashed("boom")) == ExitCode.ERROR
    assert exit_code_for(errors.RequestFailed("bad", "x")) == ExitCode.FAIL
    assert exit_code_for(errors.NoServer("no server")) == ExitCode.FAIL
    assert exit_code_for(errors.CallTimeout("late")) == ExitCode.UNREACHABLE
    assert exit_code_for(errors.TimedOutInQueue("late")) == ExitCode.UNREACHABLE
    assert exit_code_for(errors.BrokerUnavailable("down")) == ExitCode.UNREACHABLE
    assert exit_code_for(UsageProblem("x")) == ExitCode.USAGE


def captured(exchange: str, routing_key: str, *, source: str = "traffic", at: float = 100.0, **kw: object) -> Captured:
    return Captured(
        source=source,
        exchange=exchange,
        routing_key=routing_key,
        body=kw.pop("body", b"{}"),  # type: ignore[arg-type]
        seen_at=at,
        **kw,
    )  # type: ignore[arg-type]


def test_decode_request_reply_and_pairing() -> None:
    request = decode(
        captured(
            "rpc",
            "svc.echo",
            app_id="u1",
            message_id="m1",
            reply_to="u1",
            headers={"version": 1, "name": "svc.echo", "app": "client"},
        ),
        ROLES,
    )
    reply = decode(
        captured(
            "reply",
            "u1",
            at=100.25,
            app_id="u2",
            message_id="m2",
            correlation_id="m1",
            body=b"",
            headers={"version": 1, "app": "server", "error": {"status": "warn", "id": "partial", "message": "half"}},
        ),
        ROLES,
    )
    assert request is not None and reply is not None
    assert (request.kind, request.name, request.app, request.correlation_id) == ("request", "svc.echo", "client", "m1")
    assert (reply.kind, reply.status, reply.error_id, reply.to_uuid, reply.name) == (
        "reply",
        "warn",
        "partial",
        "u1",
        None,
    )
    tracker = RequestTracker()
    tracker.observe(request)
    tracker.observe(reply)
    assert reply.name == "svc.echo" and reply.to_app == "client" and reply.latency_ms == 250.0
    assert len(tracker) == 0  # a request gets one reply and is forgotten
    assert decode(captured("elsewhere", "x"), ROLES) is None


def test_gather_alert_pairs_many_replies_and_tracker_is_bounded() -> None:
    tracker = RequestTracker(max_pending=2)
    ping = decode(
        captured("alert", "qbroker.ping", message_id="p", reply_to="me", headers={"name": "qbroker.ping"}), ROLES
    )
    assert ping is not None
    tracker.observe(ping)
    for n in range(3):
        reply = decode(captured("reply", "me", at=100.5, correlation_id="p", app_id=f"u{n}"), ROLES)
        assert reply is not None
        tracker.observe(reply)
        assert reply.name == "qbroker.ping" and reply.latency_ms == 500.0
    for n in range(3):
        req = decode(captured("rpc", "a", message_id=f"r{n}", reply_to="me", at=200.0 + n), ROLES)
        assert req is not None
        tracker.observe(req)
    assert len(tracker) == 2


def test_decode_dead_letters() -> None:
    expired = decode(
        captured(
            "dead",
            "",
            source="dead",
            message_id="m",
            headers={
                "name": "svc.slow",
                "x-death": [{"reason": b"expired", "exchange": b"rpc", "routing-keys": [b"svc.slow"]}],
            },
        ),
        ROLES,
    )
    assert expired is not None and (expired.kind, expired.reason, expired.via) == ("dead", "expired", "rpc:svc.slow")
    unroutable = decode(captured("rpc", "svc.none", source="dead", message_id="m2"), ROLES)
    assert unroutable is not None and (unroutable.reason, unroutable.via, unroutable.name) == (
        "unroutable",
        "rpc:svc.none",
        None,
    )


def test_filters() -> None:
    reply = decode(captured("reply", "u1", app_id="u2", correlation_id="m1", headers={"app": "server"}), ROLES)
    assert reply is not None
    reply.name, reply.to_app = "svc.echo", "client"
    assert EventFilter.build(names=["svc.*"])(reply)
    assert not EventFilter.build(names=["other.*"])(reply)
    assert EventFilter.build(apps=["client"])(reply) and EventFilter.build(apps=["serv*"])(reply)
    assert EventFilter.build(uuids=["u1"])(reply) and not EventFilter.build(uuids=["zz"])(reply)
    assert EventFilter.build(kinds=["request,reply"])(reply) and not EventFilter.build(kinds=["alert"])(reply)
    assert EventFilter.build(statuses=["ok"])(reply) and not EventFilter.build(statuses=["fail"])(reply)
    with pytest.raises(UsageProblem, match="--kind"):
        EventFilter.build(kinds=["replies"])


def test_directory_binds_only_announced_names() -> None:
    directory = UnitDirectory("me")
    assert directory.learn({"app": "me-myself", "uuid": "me"}) is None
    directory.learn({"app": "a", "uuid": "u1", "endpoints": ["svc.x"], "listeners": ["toposm.#"]})
    directory.learn({"app": "b", "uuid": "u2", "endpoints": {"svc.x": {}, "svc.y": {}}, "listeners": []})
    assert directory.follow_caller("c9") and not directory.follow_caller("u1") and not directory.follow_caller("me")
    desired = directory.desired()
    assert desired.rpc == {"svc.x", "svc.y"} and desired.alert == set(DISCOVERY_ALERTS) | {"toposm.#"}
    assert desired.reply == {"u1", "u2", "c9"}
    directory.forget("u2")
    assert directory.desired().rpc == {"svc.x"}
    assert UnitDirectory("me", everything=True).desired().rpc == {"#"}


def test_line_rendering_plain_and_json() -> None:
    reply = decode(
        captured(
            "reply",
            "u1",
            app_id="u2abcdefgh",
            correlation_id="m1abcdefgh",
            body=b'{"a":1}',
            headers={"app": "server", "error": {"status": "fail", "id": "bad", "message": "no"}},
        ),
        ROLES,
    )
    assert reply is not None
    reply.name, reply.to_app, reply.latency_ms = "svc.echo", "client", 12.5
    text = " ".join(t for t, _ in columns(reply))
    for part in (
        "reply",
        "svc.echo",
        "server/u2abcdef",
        "-> client/u1",
        "cid=m1abcdef",
        "fail:bad",
        "7B",
        "12.5ms",
        "no",
    ):
        assert part in text, part
    out = io.StringIO()
    Renderer(as_json=True, with_body=True, stream=out).show(reply)
    assert '"body":{"a":1}' in out.getvalue() and '"latency_ms":12.5' in out.getvalue()


async def test_reply_before_its_request_is_held_and_paired() -> None:
    """RabbitMQ orders per publisher only; a reply that overtakes its request is still paired."""
    import orjson

    from qbroker import Config, Unit
    from qbroker.cli.snoop.runner import REORDER_WINDOW, Debugger, DebugSettings

    out = io.StringIO()
    unit = Unit("test.debugger", config=Config(dead_letters=False))
    debugger = Debugger(unit, unit.config, DebugSettings(renderer=Renderer(as_json=True, with_body=False, stream=out)))
    reply = captured("reply", "u1", at=100.0, app_id="u2", correlation_id="m1", headers={"app": "server"})
    request = captured(
        "rpc",
        "svc.echo",
        at=100.001,
        app_id="u1",
        message_id="m1",
        reply_to="u1",
        headers={"app": "client", "name": "svc.echo"},
    )
    orphan = captured("reply", "u1", at=100.0, app_id="u2", correlation_id="gone", headers={"app": "server"})
    await debugger.handle(reply)
    await debugger.handle(orphan)
    assert out.getvalue() == ""  # held, waiting for their requests
    await debugger.handle(request)
    first, second = (orjson.loads(line) for line in out.getvalue().splitlines())
    assert (first["kind"], second["kind"]) == ("request", "reply")
    assert second["name"] == "svc.echo" and second["latency_ms"] == 0.0
    await debugger._release_held(time.monotonic() + 2 * REORDER_WINDOW)  # the orphan is shown unpaired
    third = orjson.loads(out.getvalue().splitlines()[2])
    assert third["correlation_id"] == "gone" and third["latency_ms"] is None and third["name"] is None


def test_long_bodies_are_cut_in_line_view_only() -> None:
    big = b'{"data": "' + b"x" * 10_000 + b'"}'
    event = decode(captured("alert", "big.one", message_id="m", body=big, headers={"name": "big.one"}), ROLES)
    assert event is not None
    lines, json_lines = io.StringIO(), io.StringIO()
    Renderer(as_json=False, with_body=True, stream=lines).show(event)
    Renderer(as_json=True, with_body=True, stream=json_lines).show(event)
    body_line = lines.getvalue().splitlines()[1]
    assert len(body_line) < 4200 and "more characters" in body_line
    assert "x" * 10_000 in json_lines.getvalue()
