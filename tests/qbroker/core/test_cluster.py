"""A call survives the loss of a RabbitMQ node: a three-node cluster of private nodes on this
machine (harness/rabbitmq_cluster.py), qbroker's durable queues as quorum queues (``Config.queue_type``), and the
node holding the request and both units' connections SIGKILLed while the server works on it; and the same with
the caller's confirm of its request lost with the node (the caller publishes the request again).

Never the user's broker. Starting the cluster (three nodes booting together) is most of the test's time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from harness import HANG, eventually
from harness.pytest_plugin import heavy
from harness.rabbitmq_cluster import Cluster, start_cluster, stop_cluster
from harness.tcp_relay import TcpRelay
from qbroker import Config, RequestContext, Unit

pytestmark = pytest.mark.rabbitmq_only  # three private RabbitMQ nodes (heavy by the cluster fixture)
NAME = "test.cluster.work"
ECHO = "test.cluster.echo"


@pytest.fixture
@heavy("starts a three-node RabbitMQ cluster")
def cluster() -> Iterator[Cluster]:
    """A cluster per test: each kills a node of it."""
    cluster = start_cluster(3)
    yield cluster
    stop_cluster(cluster)


def _config(cluster: Cluster, first: int = 0, **extra: Any) -> Config:
    # Every unit lists the three nodes, node 1 first unless told: it connects there and fails over along the list.
    return Config(
        url=cluster.url(first), queue_type="quorum", heartbeat=5, reconnect_backoff_max=0.5, connect_timeout=2, **extra
    )


def _first_run_dies(server: Unit) -> tuple[list[str | None], asyncio.Event]:
    """``server`` serves NAME: its first run never answers (its node dies under it), the others answer their
    ``n`` and how many runs there were. Returns the message ids run, and the event set as the first starts."""
    runs: list[str | None] = []
    holding = asyncio.Event()

    @server.rpc(NAME)
    async def work(n: int, ctx: RequestContext) -> dict[str, int]:
        runs.append(ctx.message_id)
        if len(runs) == 1:
            holding.set()
            await asyncio.Event().wait()
        return {"n": n, "runs": len(runs)}

    return runs, holding


async def test_a_call_survives_the_loss_of_the_node_that_holds_its_request(cluster: Cluster) -> None:
    """The request sits in a quorum queue whose leader is on node 1, delivered to a server connected to node 1,
    the caller connected there too, when node 1 dies. The survivors elect a new leader; both units fail over
    to node 2 by their URL lists; the queue still has the request (unacked, so it is delivered again) and the
    caller's reply queue (durable, quorum) is still there: the call is answered.

    A third unit on node 2, which stays up, calls at once while the queues elect their leaders: the broker
    refuses (nacks) those publishes, and RabbitMQ 3.10 would go on refusing them on that channel for good;
    qbroker publishes on fresh channels from the first refusal on, so its calls are answered again."""
    server = Unit("test.cluster.server", config=_config(cluster))
    runs, holding = _first_run_dies(server)

    @server.rpc(ECHO)
    async def echo(n: int) -> int:
        return n

    client = Unit("test.cluster.client", config=_config(cluster, durable_reply_queue=True))
    bystander = Unit("test.cluster.bystander", config=_config(cluster, first=1))
    await server.start()
    await client.start()
    await bystander.start()
    try:
        leader = cluster.queue_leader(f"rpc_{NAME}")
        # Declared over node 1, so led from there (RabbitMQ's client-local leader placement)
        assert leader == cluster.nodes[0].name, (leader, cluster.nodes)
        call = asyncio.create_task(client.call(NAME, {"n": 7}, guarantee=True, timeout=HANG))
        await asyncio.wait_for(holding.wait(), HANG)
        await asyncio.to_thread(cluster.kill, 0)
        assert await eventually(lambda: bystander.call(ECHO, {"n": 9}, timeout=5)) == 9
        try:
            answer = await asyncio.wait_for(call, HANG)
        except Exception as exc:
            raise AssertionError(f"not answered: {exc!r}; queues: {cluster.queues()}") from exc
        assert answer["n"] == 7 and answer["runs"] >= 2
        # the same request again, from the replicated queue: not a second one sent by the caller (served once
        # more if its reply came while the reply queue was between leaders: qbroker.rpc.serve_request)
        assert len(set(runs)) == 1, runs
        survivors = {n.name for n in cluster.nodes[1:]}
        assert cluster.queue_leader(f"rpc_{NAME}") in survivors
        assert client.bus.supervisor.url_index != 0 and server.bus.supervisor.url_index != 0
        # and the bus works on as before: a new call, on two nodes of three
        assert await client.call(NAME, {"n": 8}, timeout=HANG) == {"n": 8, "runs": len(runs)}
    finally:
        await bystander.stop(drain_timeout=1)
        await client.stop(drain_timeout=1)
        await server.kill()


async def test_a_call_whose_confirm_died_with_its_node_is_published_again_and_answered_once(cluster: Cluster) -> None:
    """The race the test above meets now and then under load, made certain: node 1 delivers the guaranteed
    request to its server and dies before the caller has its confirm (a TCP relay between the caller and node 1
    holds back what node 1 sends, harness/tcp_relay.py). The caller fails over to node 2 and publishes the
    request again (same message id; the queue may nack it while it elects its leader); the server gets it twice
    (that copy, and the original from the replicated queue) and runs it once more than the run that died with
    node 1, not twice; the caller gets one answer."""
    relay = await TcpRelay(cluster.nodes[0].url).start()
    server = Unit("test.cluster.server", config=_config(cluster))
    runs, holding = _first_run_dies(server)

    client = Unit(
        "test.cluster.client",
        config=Config(
            url=",".join([relay.url, *cluster.urls(1)]),
            queue_type="quorum",
            heartbeat=5,
            reconnect_backoff_max=0.5,
            connect_timeout=2,
        ),
    )  # its reply queue exclusive: only the copy published again can be answered
    await server.start()
    await client.start()
    try:
        relay.hold_replies()
        call = asyncio.create_task(client.call(NAME, {"n": 7}, guarantee=True, timeout=HANG))
        await asyncio.wait_for(holding.wait(), HANG)
        await asyncio.to_thread(cluster.kill, 0)
        relay.reset()  # its link to node 1 is gone: the caller reads a reset, as from a killed node
        try:
            answer = await asyncio.wait_for(call, HANG)
        except Exception as exc:
            raise AssertionError(f"not answered: {exc!r}; queues: {cluster.queues()}") from exc
        assert answer["n"] == 7
        assert len(set(runs)) == 1 and len(runs) == 2, runs  # the dead run, then one run for both copies
        assert client.bus.supervisor.url_index != 0 and server.bus.supervisor.url_index != 0
        assert await client.call(NAME, {"n": 8}, timeout=HANG) == {"n": 8, "runs": 3}
    finally:
        await client.stop(drain_timeout=1)
        await server.kill()
        await relay.close()
