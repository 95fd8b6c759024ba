"""The bus's shared exchanges and queues belong to no role: ``qbroker provision`` declares them,
no account may delete or re-declare them, and a unit that finds them missing says so and what declares them.

Before, every role could configure ``rpc``, ``reply``, ``alert``, ``dead``, ``dead.kept`` and ``osm``: a
``client`` deleted ``rpc`` (the next call re-created it without bindings: every call answered ``no_server``
until every process restarted) or ``dead.kept`` (the copies kept for operators gone).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest
from aiormq.exceptions import ChannelAccessRefused

from harness import HANG
from harness.broker import create_vhost, delete_vhost, rabbitmqctl
from harness.provisioned import HOST, ROLES, Provisioned
from qbroker import Config, NoServer, QBrokerError, Unit
from qbroker.cli.deployment import permissions_for
from qbroker.cli.roles import load_roles
from tests.qbroker.security.test_broker_permissions import raw

EXCHANGES = {
    "rpc": "topic",
    "reply": "direct",
    "alert": "topic",
    "dead": "fanout",
    "dead.kept.in": "fanout",
    "osm": "topic",
}
QUEUES = ("dead", "dead.kept")
BIN = Path(sys.executable).parent


async def _all_there(connection: aio_pika.abc.AbstractConnection) -> None:
    """Every shared object exists (passive declares: no permission needed)."""
    for name in EXCHANGES:
        await (await connection.channel()).declare_exchange(name, passive=True)
    for name in QUEUES:
        await (await connection.channel()).declare_queue(name, passive=True)


async def test_provision_declares_the_shared_topology(provisioned: Provisioned) -> None:
    async with raw(provisioned, "client") as conn:
        await _all_there(conn)
    listed = rabbitmqctl(
        "list_exchanges", "-p", provisioned.deployment.vhost, "name", "type", "arguments", "-q", "--no-table-headers"
    ).stdout
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in listed.splitlines()}
    assert {name: rows[name][0] for name in EXCHANGES} == EXCHANGES
    assert "alternate-exchange" in rows["rpc"][1] and "alternate-exchange" in rows["alert"][1]


@pytest.mark.parametrize("role", [role for role in ROLES if role != "renderer2"])
async def test_no_role_may_delete_or_redeclare_a_shared_exchange_or_queue(provisioned: Provisioned, role: str) -> None:
    async with raw(provisioned, role) as conn:
        for name in EXCHANGES:
            with pytest.raises(ChannelAccessRefused):
                await asyncio.wait_for((await conn.channel()).exchange_delete(name), HANG)
        for name in QUEUES:
            with pytest.raises(ChannelAccessRefused):
                await asyncio.wait_for((await conn.channel()).queue_delete(name), HANG)
        # re-declared otherwise (a non-durable fanout `rpc` stopped every service's start), or as it is
        with pytest.raises(ChannelAccessRefused):
            await (await conn.channel()).declare_exchange("rpc", aio_pika.ExchangeType.FANOUT)
        with pytest.raises(ChannelAccessRefused):
            await (await conn.channel()).declare_exchange(
                "rpc", aio_pika.ExchangeType.TOPIC, durable=True, arguments={"alternate-exchange": "dead"}
            )
        await _all_there(conn)


async def test_the_bus_still_works_for_every_role_after_the_attempts(provisioned: Provisioned, as_role) -> None:
    await as_role("client")  # a collector of dead letters
    operator = await as_role("operator", dead_letters=False)
    with pytest.raises(NoServer):  # `rpc` keeps its alternate exchange, `dead` its queue and collectors
        await operator.call("t.nobody", timeout=HANG)


@pytest.fixture
def bare_vhost(provisioned: Provisioned) -> tuple[str, str]:
    """A vhost without the shared topology, where the provisioned client account has its role's permissions."""
    vhost = create_vhost("qbroker-bare")
    roles = load_roles()
    account = provisioned.names["client"]
    perms = permissions_for(roles["client"], roles, "")  # no topic permissions set here: none needed
    rabbitmqctl("set_permissions", "-p", vhost, account, perms.configure, perms.write, perms.read)
    yield vhost, account
    delete_vhost(vhost)


async def test_a_unit_facing_a_missing_topology_names_it_and_the_command(
    provisioned: Provisioned, bare_vhost: tuple[str, str]
) -> None:
    vhost, _ = bare_vhost
    config = provisioned.config("client").model_copy(update={"url": f"amqp://{HOST}/{vhost}"})
    with pytest.raises(QBrokerError, match="topology_missing") as info:
        await asyncio.wait_for(Unit("test.client", config=config).start(), HANG)
    message = str(info.value)
    for name in (
        "exchange 'rpc'",
        "exchange 'reply'",
        "exchange 'alert'",
        "exchange 'dead'",
        "queue 'dead'",
        "exchange 'dead.kept.in'",
        "queue 'dead.kept'",
        "qbroker provision",
    ):
        assert name in message, message


async def test_a_service_facing_a_missing_topology_exits_saying_so(
    provisioned: Provisioned, bare_vhost: tuple[str, str]
) -> None:
    vhost, account = bare_vhost
    env = {
        **os.environ,
        "QBROKER_URL": f"amqp://{HOST}/{vhost}",
        "QBROKER_USERNAME": account,
        "QBROKER_PASSWORD_FILE": str(provisioned.passwords["client"]),
    }
    done = await asyncio.to_thread(
        subprocess.run, [str(BIN / "qbroker-dead-letter")], env=env, capture_output=True, text=True, timeout=HANG
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "qbroker.dead_letter: error/topology_missing: the bus's shared exchanges and queues "
        "are missing (exchange 'dead', queue 'dead', "
    ), last
    assert "`qbroker provision DEPLOYMENT.toml` declares them" in last
    # declared once by an account that may (here the development default, guest), the same unit starts
    declarer = Unit("test.declarer", config=Config(url=f"amqp://guest:guest@{HOST}/{vhost}"))
    await declarer.start()
    await declarer.stop()
    client = Unit(
        "test.client", config=provisioned.config("client").model_copy(update={"url": f"amqp://{HOST}/{vhost}"})
    )
    await asyncio.wait_for(client.start(), HANG)
    await client.stop()
