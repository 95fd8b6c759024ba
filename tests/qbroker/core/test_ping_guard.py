"""Pings are answered at a bounded rate per account (docs/security.md, "Ping reflection"): 200 pings of a few
bytes no longer bring 200 descriptions from every unit. What the guard remembers of who announced which uuid."""

from __future__ import annotations

from harness import eventually
from qbroker.presence import APP_ADDRESS, PING, UUID_ADDRESS, PingGuard
from qbroker.rpc import call
from tests.conftest import MakeUnit
from tests.pings import count_handled, count_stray_replies, ping_as


async def test_pings_are_answered_at_a_bounded_rate(make_unit: MakeUnit) -> None:
    server = await make_unit("test.rated", ping_burst=5, ping_rate=0.001)

    @server.on_alert("test.barrier")
    async def barrier() -> str:
        return "after the pings"

    handled = count_handled(server, PING)
    await server.start()
    pinger = await make_unit("test.pinger")
    await pinger.start()
    stray = count_stray_replies(pinger)
    await ping_as(pinger, pinger.uuid, 200)
    await eventually(lambda: len(handled) >= 200)
    # A unit's replies leave in order: once the barrier's answer is in, so are the pings' answers.
    assert [r.body async for r in pinger.gather("test.barrier", timeout=30, max_replies=1)] == ["after the pings"]
    answered = [r for r in stray if isinstance(r.body, dict) and r.body.get("uuid") == server.uuid]
    assert len(answered) == 5  # the burst, then a thousandth of a ping a second
    assert server.describe()["pings_refused"] >= 195


def test_a_uuid_is_the_first_claimants_until_it_stops() -> None:
    guard = PingGuard(rate=1000.0, burst=1000)
    assert guard.claim("u1", "alice")  # announced (qbroker.start) by alice's account
    assert guard.answer_ping("u1", "alice") and not guard.answer_ping("u1", "mallory")
    assert guard.answer_ping("u2", "mallory")  # its own uuid: its first ping claims it
    assert not guard.answer_ping("u2", "alice")
    guard.release("u1", "mallory")  # a stop from another account changes nothing
    assert not guard.answer_ping("u1", "mallory")
    guard.release("u1", "alice")
    assert guard.answer_ping("u1", "mallory")
    assert not guard.answer_ping(None, "alice") and not guard.claim(b"u3", "alice")  # type: ignore[arg-type]
    one_account = PingGuard(rate=1000.0, burst=1000)  # a bus with one shared account: nothing to tell apart
    assert one_account.claim("u1", "guest") and one_account.answer_ping("u1", "guest")


def test_claims_and_accounts_are_bounded() -> None:
    guard = PingGuard(rate=1000.0, burst=1000, max_claims=3)
    for n in range(10):
        guard.claim(f"u{n}", "mallory")
        guard.take(f"account{n}")
    assert len(guard._claims) == 3 and len(guard._buckets) == 3


async def test_the_originals_addressed_pings_are_answered_under_the_same_rate(make_unit: MakeUnit) -> None:
    """The original QBroker asks one unit (qbroker.uuid.<uuid>) or an app (qbroker.app.<app>) on rpc."""
    server = await make_unit("test.addressed", ping_burst=3, ping_rate=0.001)
    await server.start()
    client = await make_unit("test.asker")
    await client.start()
    for address in (f"{UUID_ADDRESS}{server.uuid}", f"{APP_ADDRESS}test.addressed", f"{UUID_ADDRESS}{server.uuid}"):
        reply = await call(client.bus, PING, {}, timeout=30, routing_key=address)
        assert reply.error is None and reply.body["uuid"] == server.uuid
    limited = await call(client.bus, PING, {}, timeout=30, routing_key=f"{APP_ADDRESS}test.addressed")
    assert limited.error is not None and limited.error.id == "ping_rate_limited"
