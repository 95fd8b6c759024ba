"""Ping reflection: anyone may publish ``qbroker.ping`` naming any reply-to, and ``reply`` is a direct
exchange, so every unit's answer would go to a uuid of the sender's choosing. A unit answers a ping only to a
uuid the pinging account announced itself (its ``qbroker.start``, or a ping of its own, first claim wins), and
answers each account at a bounded rate. Accounts are provisioned ones (``qbroker provision``)."""

from __future__ import annotations

from typing import Any

from harness import eventually
from qbroker.presence import PING
from tests.pings import count_handled, count_stray_replies, ping_as

ATTACK = 50


async def test_pings_are_answered_only_to_the_pinging_accounts_own_uuid(as_role: Any) -> None:
    server = await as_role("renderer", app="test.pinged")
    handled = count_handled(server, PING)
    victim = await as_role("client", app="test.victim")  # announces itself: its uuid is the client account's
    stray = count_stray_replies(victim)
    attacker = await as_role("web", app="test.attacker")
    await ping_as(attacker, victim.uuid, ATTACK)
    await eventually(lambda: len(handled) >= ATTACK)
    # Its own discovery still works, for both (each pings for its own uuid) ...
    assert server.uuid in {r.body["uuid"] async for r in victim.gather(PING, {}, timeout=10, gap=1.0)}
    assert server.uuid in {r.body["uuid"] async for r in attacker.gather(PING, {}, timeout=10, gap=1.0)}
    # ... and not one of the server's answers to the attacker's pings reached the victim (a unit's replies leave
    # in order: its answer to the victim's own ping came after them). The attacker's own unit answered its
    # pings to the victim: any unit may send anything to a uuid it knows, and did not hear the victim start.
    assert [r for r in stray if r.header.app_id == server.uuid] == []


async def test_the_ping_rate_is_per_account(as_role: Any) -> None:
    server = await as_role("renderer", app="test.rated", ping_burst=5, ping_rate=0.001)
    handled = count_handled(server, PING)
    pinger = await as_role("web", app="test.pinger")
    await ping_as(pinger, pinger.uuid, 20)  # its own uuid: only the rate stops these
    await eventually(lambda: len(handled) >= 20)
    other = await as_role("client", app="test.other")  # another account: answered all the same
    assert server.uuid in {r.body["uuid"] async for r in other.gather(PING, {}, timeout=10, gap=1.0)}
