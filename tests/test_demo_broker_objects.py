"""What a demo run declared on the broker is removed when it ends (demo/broker_objects.py): its ``demo.``
exchanges and queues, and the unprefixed ``osm`` exchange and ``toposm.queuemaster.osm`` queue only when the run
found them absent and nothing else uses them; what its account may not delete, or what another program still
uses, is named with the command that removes it. Each test on a vhost of its own (tests/test_demo.py runs the
whole demo and checks its vhost after)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from demo.accounts import demo_accounts
from demo.broker_objects import CLEAN_COMMAND, RECORD_FILE, BrokerObject, claim, owned_after, remove
from harness import HANG
from harness.broker import create_vhost, delete_vhost, rabbitmqctl, url_for_vhost
from qbroker import Config, Unit
from services.toposm.contract import OSM_EXCHANGE, QUEUEMASTER_OSM_QUEUE

PREFIX_EXCHANGES = {"demo.rpc", "demo.reply", "demo.alert", "demo.dead", "demo.dead.kept.in"}
PREFIX_QUEUES = {"demo.dead", "demo.dead.kept"}
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def url() -> Iterator[str]:
    vhost = create_vhost("qbroker-demo-objects")
    yield url_for_vhost(vhost)
    delete_vhost(vhost)


def listed(url: str) -> tuple[set[str], set[str]]:
    """The vhost's exchanges (not the broker's own) and queues, as rabbitmqctl lists them."""
    vhost = url.rsplit("/", 1)[1]
    exchanges = rabbitmqctl("list_exchanges", "-p", vhost, "name", "-q", "--no-table-headers").stdout.split()
    queues = rabbitmqctl("list_queues", "-p", vhost, "name", "-q", "--no-table-headers").stdout.split()
    return {name for name in exchanges if not name.startswith("amq.")}, set(queues)  # the default one: no name


async def declare_as_the_services_do(url: str) -> None:
    """What a demo's services leave: the shared topology (a first unit on a bus without accounts declares it),
    dead letters in ``demo.dead``, a request queue, ``osm`` and the queuemaster's durable queue on it."""
    async with Unit("test.first", config=Config(url=url, exchange_prefix="demo.")):
        pass
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        dead = await channel.get_exchange("demo.dead", ensure=False)
        await dead.publish(aio_pika.Message(b"a dead request nobody collected"), "x")
        osm = await channel.declare_exchange(OSM_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(QUEUEMASTER_OSM_QUEUE, durable=True)
        await queue.bind(osm, "toposm")
        rpc = await channel.declare_queue("demo.rpc_toposm.queuemaster", durable=True)
        await rpc.bind("demo.rpc", "toposm.queuemaster")


async def test_what_a_run_declared_is_removed_and_named(url: str, tmp_path: Path) -> None:
    config = Config(url=url, exchange_prefix="demo.")
    claimed = await claim(config, tmp_path)  # before anything is declared: osm and the osm queue are the run's
    assert {BrokerObject("exchange", OSM_EXCHANGE), BrokerObject("queue", QUEUEMASTER_OSM_QUEUE)} <= set(claimed)
    assert (tmp_path / RECORD_FILE).exists()
    await declare_as_the_services_do(url)

    removal = await remove(config, owned_after(config, tmp_path, claimed, ["toposm.queuemaster"]), tmp_path)

    assert removal.complete, removal.lines(tmp_path)
    assert listed(url) == (set(), set())  # nothing of the demo's is left
    text = "\n".join(removal.lines(tmp_path))
    for name in [*PREFIX_EXCHANGES, OSM_EXCHANGE, "demo.rpc_toposm.queuemaster", QUEUEMASTER_OSM_QUEUE]:
        assert name in text
    assert re.search(r"queue demo\.dead \([1-9][0-9]* messages?\)", text), text  # what went with it
    assert not (tmp_path / RECORD_FILE).exists()


async def test_another_programs_osm_and_a_corner_in_use_are_kept(url: str, tmp_path: Path) -> None:
    # another TopOSM program had `osm` before the demo started, and listens on it
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        osm = await channel.declare_exchange(OSM_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        theirs = await channel.declare_queue("their.queue", durable=True)
        await theirs.bind(osm, "toposm")
    config = Config(url=url, exchange_prefix="demo.")
    claimed = await claim(config, tmp_path)
    assert BrokerObject("exchange", OSM_EXCHANGE) not in claimed
    # another program runs in the demo's corner: it consumes demo.dead, as every unit does
    async with Unit("test.other", config=Config(url=url, exchange_prefix="demo.")):
        removal = await remove(config, owned_after(config, tmp_path, claimed), tmp_path)
        assert not removal.complete and not removal.removed
        assert set(removal.kept) >= {BrokerObject("exchange", name) for name in PREFIX_EXCHANGES}
        text = "\n".join(removal.lines(tmp_path))
        assert "consumers of demo.dead" in text and f"{CLEAN_COMMAND} --workdir {tmp_path}" in text
        assert (tmp_path / RECORD_FILE).exists()  # for the next run or `bin/demo --clean`
    removal = await remove(config, owned_after(config, tmp_path), tmp_path)  # it has stopped: all goes
    assert removal.complete, removal.lines(tmp_path)
    assert listed(url) == ({OSM_EXCHANGE}, {"their.queue"})


async def test_an_unprefixed_exchange_still_bound_is_kept(url: str, tmp_path: Path) -> None:
    config = Config(url=url, exchange_prefix="demo.")
    claimed = await claim(config, tmp_path)  # osm is the run's: it was absent
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        osm = await channel.declare_exchange(OSM_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        theirs = await channel.declare_queue("their.queue", durable=True)  # a program that came meanwhile
        await theirs.bind(osm, "toposm")
    removal = await remove(config, owned_after(config, tmp_path, claimed), tmp_path)
    assert removal.kept == {BrokerObject("exchange", OSM_EXCHANGE): "queues of other programs are bound to it"}
    assert OSM_EXCHANGE in listed(url)[0]


async def test_what_the_account_may_not_delete_is_named_with_the_command(url: str, tmp_path: Path) -> None:
    config = Config(url=url, exchange_prefix="demo.")
    claimed = await claim(config, tmp_path)
    with demo_accounts(tmp_path, url, "demo.") as accounts:  # declares the shared topology, as the demo does
        client = Config(
            url=url,
            exchange_prefix="demo.",
            username=accounts.names["client"],
            password_file=accounts.files[accounts.names["client"]],
        )
        removal = await remove(client, owned_after(config, tmp_path, claimed), tmp_path)
    assert not removal.removed and not removal.complete
    assert {item.name for item in removal.refused} == PREFIX_EXCHANGES | PREFIX_QUEUES | {OSM_EXCHANGE}
    lines = removal.lines(tmp_path)
    assert f"the account {accounts.names['client']!r} may not delete them" in "\n".join(lines)
    for item in removal.refused:
        assert f"    {item}" in lines
    assert lines[-1].endswith(f"{CLEAN_COMMAND} --workdir {tmp_path}")
    assert (tmp_path / RECORD_FILE).exists()
    removal = await remove(config, owned_after(config, tmp_path), tmp_path)  # what --clean does, as guest
    assert removal.complete and listed(url) == (set(), set())


async def test_an_unreachable_broker_is_said_with_what_stays(tmp_path: Path) -> None:
    config = Config(url="amqp://guest:secret@127.0.0.1:1/", exchange_prefix="demo.", connect_timeout=2)
    removal = await remove(config, owned_after(config, tmp_path), tmp_path)
    text = "\n".join(removal.lines(tmp_path))
    assert removal.unreachable and "secret" not in text
    assert "exchange demo.rpc" in text and CLEAN_COMMAND in text


def test_bin_demo_clean_removes_them_and_says_what(url: str, tmp_path: Path) -> None:
    config = Config(url=url, exchange_prefix="demo.")
    asyncio.run(claim(config, tmp_path))
    asyncio.run(declare_as_the_services_do(url))
    env = dict(os.environ, QBROKER_URL=url)
    done = subprocess.run(
        [sys.executable, "-m", "demo", "--clean", "--no-accounts", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=HANG,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"removed from the broker: queue demo\.dead \([1-9][0-9]* messages?\)", done.stdout), done.stdout
    assert "exchange osm" in done.stdout and "queue toposm.queuemaster.osm" in done.stdout
    assert listed(url) == (set(), set()) and not (tmp_path / RECORD_FILE).exists()
    again = subprocess.run(
        [sys.executable, "-m", "demo", "--clean", "--no-accounts", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=HANG,
    )
    assert again.returncode == 0 and "nothing of the demo's was left" in again.stdout
