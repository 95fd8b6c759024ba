"""What the broker itself refuses, per account (docs/security.md): each attack is tried and must fail.

These use raw aio-pika where a well-behaved qbroker unit would never even try (binding a queue to
overhear a name, consuming another service's queue, forging user_id): a hostile client is not obliged
to use qbroker.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import aio_pika
import pytest
from aiormq.exceptions import ChannelAccessRefused, ChannelClosed, ChannelPreconditionFailed

from harness import HANG
from qbroker import QBrokerError, RequestContext, RequestError
from qbroker.cli.progress import progress_pattern
from qbroker.progress import owner_word


@contextlib.asynccontextmanager
async def raw(provisioned, role: str):
    connection = await aio_pika.connect(provisioned.url_with_password(role), timeout=HANG)
    try:
        yield connection
    finally:
        await connection.close()


async def _refused_publish(connection, exchange: str, routing_key: str, **props) -> BaseException:
    channel = await connection.channel(publisher_confirms=True)
    ex = await channel.get_exchange(exchange, ensure=False)
    with pytest.raises((ChannelAccessRefused, ChannelClosed, ChannelPreconditionFailed)) as info:
        await asyncio.wait_for(ex.publish(aio_pika.Message(b"{}", **props), routing_key=routing_key), HANG)
    return info.value


async def test_wrong_password_and_password_in_errors(provisioned, as_role) -> None:
    from qbroker import BrokerUnavailable, Config, Unit

    config = Config(
        url=f"amqp://{provisioned.names['client']}:wrong-secret@127.0.0.1:5672/{provisioned.deployment.vhost}",
        connect_timeout=5,
    )
    unit = Unit("test.badpw", config=config)
    with pytest.raises(BrokerUnavailable) as info:
        await unit.start()
    assert "wrong-secret" not in str(info.value) and "***" in str(info.value)
    # the provisioned password file works (the password is never in the URL)
    client = await as_role("client")
    assert client.bus.supervisor.user == provisioned.names["client"]


async def test_client_cannot_publish_where_it_may_not(provisioned) -> None:
    async with raw(provisioned, "client") as conn:
        # `render` straight to a render thread: only the queuemaster may
        await _refused_publish(conn, "rpc", "toposm.render.vader.1.0")
        # control alerts on the render hierarchy and on `toposm` (shutdown): only the operator
        await _refused_publish(conn, "alert", "toposm.render")
        await _refused_publish(conn, "alert", "toposm")
        # expirations: only the Spark bridge (and the operator)
        await _refused_publish(conn, "alert", "expire_toposm")
        # the seed wire's expirations and all-programs topic
        await _refused_publish(conn, "osm", "toposm")
        # pretending to be another account: RabbitMQ checks user_id against the connection's user
        err = await _refused_publish(conn, "rpc", "toposm.queuemaster", user_id=provisioned.names["renderer"])
        assert "user_id" in str(err)


async def test_client_cannot_overhear_or_serve_other_names(provisioned) -> None:
    async with raw(provisioned, "client") as conn:
        channel = await conn.channel()
        queue = await channel.declare_queue(exclusive=True)  # a server-named amq.gen-* queue: allowed
        rpc = await channel.get_exchange("rpc", ensure=False)
        for key in ("#", "toposm.queuemaster", "toposm.render.#", "spark.expire"):
            with pytest.raises((ChannelAccessRefused, ChannelClosed)):
                await asyncio.wait_for(queue.bind(rpc, routing_key=key), HANG)
            channel = await conn.channel()
            queue = await channel.declare_queue(exclusive=True)
            rpc = await channel.get_exchange("rpc", ensure=False)
        # consuming the queuemaster's own request queue (taking its requests): refused
        channel = await conn.channel()
        with pytest.raises((ChannelAccessRefused, ChannelClosed)):
            q = await channel.declare_queue("rpc_toposm.queuemaster", passive=True)
            await asyncio.wait_for(q.consume(lambda m: None), HANG)


async def test_only_operators_read_the_kept_dead_letters(provisioned, as_role) -> None:
    """dead.kept holds other accounts' requests: `qbroker provision` declares it, every role's unit binds it
    (collectors copy into it), only operators read it."""
    await as_role("client")  # a unit of any role binds it
    for role in ("client", "renderer", "spark_bridge"):
        async with raw(provisioned, role) as conn:
            channel = await conn.channel()
            with pytest.raises((ChannelAccessRefused, ChannelClosed)):
                queue = await channel.declare_queue("dead.kept", passive=True)
                await asyncio.wait_for(queue.get(fail=False), HANG)
    async with raw(provisioned, "operator") as conn:
        queue = await (await conn.channel()).declare_queue("dead.kept", passive=True)
        await asyncio.wait_for(queue.get(fail=False), HANG)


async def test_renderer_account_cannot_act_as_queuemaster_or_operator(provisioned) -> None:
    async with raw(provisioned, "renderer") as conn:
        await _refused_publish(conn, "rpc", "toposm.render.vader.1.0")  # render to another thread
        await _refused_publish(conn, "alert", "toposm")  # queuemaster online / shutdown
        await _refused_publish(conn, "alert", "expire_toposm")
        channel = await conn.channel()
        with pytest.raises((ChannelAccessRefused, ChannelClosed)):
            await channel.declare_queue("rpc_toposm.queuemaster", durable=True)


async def test_operator_cannot_send_render(provisioned) -> None:
    """Only the queuemaster dispatches renders; the operator can do everything else."""
    async with raw(provisioned, "operator") as conn:
        for key in ("toposm.render", "toposm.render.vader", "toposm.render.vader.1.0"):
            await _refused_publish(conn, "rpc", key)
        await _refused_publish(conn, "alert", "qbroker.broadcast.toposm.render")


async def test_spark_bridge_account_cannot_call_the_queuemaster(provisioned) -> None:
    async with raw(provisioned, "spark_bridge") as conn:
        await _refused_publish(conn, "rpc", "toposm.queuemaster")
        await _refused_publish(conn, "alert", "toposm")


async def test_each_role_runs_a_qbroker_unit(provisioned, as_role) -> None:
    """The permissions are not so tight that the legitimate programs break: every role connects, declares
    its exchanges and queues, and the client reaches a Spark-named endpoint served by the bridge account."""
    bridge = await as_role("spark_bridge", app="spark.bridge", start=False)

    @bridge.rpc("spark.stats")
    async def stats(paths: list[str], ctx: RequestContext) -> dict:
        return {"paths": paths, "sender": ctx.user_id}

    await bridge.start()
    client = await as_role("client")
    # qbroker stamps the connection's account as user_id; the broker vouches for it
    expected = {"paths": ["a"], "sender": provisioned.names["client"]}
    assert await client.call("spark.stats", {"paths": ["a"]}, timeout=HANG) == expected
    for role in ("queuemaster", "renderer", "operator"):
        await as_role(role)
    with pytest.raises(QBrokerError):  # a name the client may not call: the broker refuses the publish
        await client.call("toposm.render.vader.1.0", {"command": "ping"}, timeout=5)


async def _bind_refused(connection, exchange: str, key: str) -> None:
    channel = await connection.channel()
    # a queue name every role may declare (its own alert_<uuid>), so only the binding can be refused
    queue = await channel.declare_queue(f"alert_{uuid.uuid4().hex}", exclusive=True, auto_delete=True)
    ex = await channel.get_exchange(exchange, ensure=False)
    with pytest.raises((ChannelAccessRefused, ChannelClosed)):
        await asyncio.wait_for(queue.bind(ex, routing_key=key), HANG)


async def test_wildcard_bindings_cannot_widen_a_role(provisioned) -> None:
    """Topic read is checked on the binding key as written: wildcards must not sneak past the patterns."""
    async with raw(provisioned, "renderer") as conn:
        for key in ("toposm.render.*.1.0", "toposm.render.#", "#", "toposm.queuemaster"):
            await _bind_refused(conn, "rpc", key)
        await _bind_refused(conn, "alert", "toposm.render.#")
        await _bind_refused(conn, "alert", "qbroker.broadcast.toposm.queuemaster")
    async with raw(provisioned, "client") as conn:
        # a broadcast to the queuemaster is a request to it: a client must not hear (and answer) one
        await _bind_refused(conn, "alert", "qbroker.broadcast.toposm.queuemaster")
        await _bind_refused(conn, "alert", "qbroker.broadcast.#")
        # nor another account's job progress, nor every account's...
        other = owner_word(provisioned.names["operator"])
        for key in (
            "spark.progress.#",
            "spark.progress.*.#",
            f"spark.progress.{other}.#",
            "spark.progress.*.*",
            "#",
            "*.progress.#",
        ):
            await _bind_refused(conn, "alert", key)
        # ... but it follows its own jobs' progress, as `qbroker call` does while it waits (qbroker.progress)
        channel = await conn.channel()
        queue = await channel.declare_queue(f"alert_{uuid.uuid4().hex}", exclusive=True, auto_delete=True)
        for service in ("toposm", "spark"):
            own = progress_pattern(f"{service}.x", provisioned.names["client"])
            await queue.bind(await channel.get_exchange("alert", ensure=False), routing_key=own)
    async with raw(provisioned, "operator") as conn:  # the same bindings are the operator's debugger
        channel = await conn.channel()
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(await channel.get_exchange("rpc", ensure=False), routing_key="#")
        await queue.bind(await channel.get_exchange("alert", ensure=False), routing_key="#")


async def test_a_server_account_may_retry_its_own_requests(provisioned, as_role) -> None:
    """Endpoint retries park the request in the server's own qbroker.retry.* queue through `rpc`: allowed
    for the names it serves, so retries work under provisioned accounts (and only for those names)."""
    bridge = await as_role("spark_bridge", app="spark.bridge", start=False)
    tries: list[int] = []

    @bridge.rpc("spark.job", retries=2, retry_delay=0.05)
    async def job(command: str, ctx: RequestContext) -> dict:
        tries.append(int(ctx.headers.get("x-qbroker-retries", 0)))
        if len(tries) < 3:
            raise RequestError("not_yet", "try again")
        return {"command": command, "tries": tries}

    await bridge.start()
    client = await as_role("client")
    assert await client.call("spark.job", {"command": "list"}, timeout=HANG) == {"command": "list", "tries": [0, 1, 2]}
    async with raw(provisioned, "spark_bridge") as conn:  # not for a name it does not serve
        await _refused_publish(conn, "rpc", "qbroker.retry.50.toposm.queuemaster")
