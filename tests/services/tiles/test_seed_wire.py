"""Programs written from the seed's text alone work beside ours on the ``osm`` wire."""

import asyncio

import aio_pika
import orjson

from harness import eventually
from qbroker import Config
from services.toposm.seed_wire import ReplyQueues
from tests.prometheus_text import scrape, value
from tests.services.web.conftest import free_port

from .conftest import alert_listener, stats, wait_renderers
from .seed_programs import SeedRenderThread, ask, osm_client, osm_listener, osm_wire_ready


async def _counter(client, name):
    return (await stats(client))["counters"].get(name, 0)


async def test_an_idle_seed_thread_is_kept_while_connected_and_dropped_when_gone(bus):
    """Liveness of a seed-wire thread asks nothing of it: many liveness periods later it is still registered
    (it answers no `ping`), renders what is requested, and is dropped as soon as its connection closes."""
    bus.queuemaster("--ping-interval", "0.1", "--ping-misses", "2")
    client = await bus.client()
    raw = SeedRenderThread(bus.tile_root)
    await raw.start(bus.url)
    try:
        s = await wait_renderers(client, 1)
        assert s["renderers"][0]["renderer"] == raw.name
        first = await _counter(client, "liveness_checks")

        async def many_rounds():  # far past ping_misses periods (and past the ping timeout of 5 s)
            return await _counter(client, "liveness_checks") >= first + 60

        await eventually(many_rounds, timeout=60)
        s = await stats(client)
        assert [r["renderer"] for r in s["renderers"]] == [raw.name]
        assert s["counters"].get("renderers_lost", 0) == 0
        reply = await client.call("toposm.queuemaster", {"command": "render", "tile": "9/10/20"}, timeout=30)
        assert reply["metatile"] == "9/1/2" and raw.rendered == ["9/1/2"]
        assert raw.unknown == []  # nothing outside the seed was sent to it
    finally:
        await raw.close()

    async def dropped():
        s = await stats(client)
        return not s["renderers"] and s["counters"].get("renderers_lost") == 1

    await eventually(dropped)


async def test_a_seed_thread_works_next_to_qbroker_renderers(bus):
    bus.queuemaster()
    client = await bus.client()
    raw = SeedRenderThread(bus.tile_root)
    await raw.start(bus.url)
    try:
        await wait_renderers(client, 1)
        bus.renderer()  # a qbroker renderer beside it
        await wait_renderers(client, 2)
        tiles = [f"12/{8 * i}/{8 * i}" for i in range(1, 7)]
        replies = await asyncio.gather(
            *(client.call("toposm.queuemaster", {"command": "render", "tile": t}, timeout=60) for t in tiles)
        )
        assert all(r["command"] == "rendered" for r in replies)
        by = {line["renderer"] for line in bus.render_log_lines()}
        assert raw.name in by and any(name != raw.name for name in by), by
        assert raw.unknown == []
    finally:
        await raw.close()


async def test_osm_answers_go_only_to_client_reply_queues(bus):
    """reply_to on the osm wire is the requester's own queue, named as it likes (the seed
    says only "the renderer's queue"): `myprogram` is answered like a broker-named `amq.gen-*` queue or
    `toposm.reply.<word>`. A command naming a queue of the bus's own (dead, dead.kept, rpc_*, reply_<uuid>,
    alert_<uuid>, a retry queue, the queuemaster's and render threads' names) is refused whole: nothing is
    published there, and it is logged and counted, in the stats and as a Prometheus counter."""
    metrics_port = free_port()
    bus.queuemaster("--metrics-port", str(metrics_port))
    client = await bus.client()
    connection, exchange, replies = await osm_client(bus.url)
    try:
        await osm_wire_ready(connection)
        channel = exchange.channel
        targets = [
            "rpc_spark.job",
            "reply_0123456789abcdef0123456789abcdef",
            "alert_0123456789abcdef0123456789abcdef",
            "qbroker.retry.spark.job.100",
            "toposm.render.h.1.0",
        ]
        for name in targets:  # queues of the bus's shapes, nobody consuming: whatever lands stays countable
            await channel.declare_queue(name, durable=True)
        # and the bus's own `dead` (its collectors take whatever lands), `dead.kept`, the queuemaster's own queue
        for name in [*targets, "dead", "dead.kept", "toposm.queuemaster.osm"]:
            await exchange.publish(
                aio_pika.Message(b'{"command": "stats"}', reply_to=name, correlation_id="x"),
                routing_key="toposm.queuemaster",
            )

        async def refused():
            return await _counter(client, "osm_reply_to_refused") == len(targets) + 3

        await eventually(refused)
        for name in targets:
            queue = await channel.declare_queue(name, passive=True)
            assert queue.declaration_result.message_count == 0, name
            await queue.delete(if_unused=False)
        # the requester's own queues are answered: broker-named, the documented prefix, any other name
        assert (await ask(exchange, replies, b'{"command": "stats"}'))["command"] == "stats"
        for own in ("toposm.reply.test-client", "myprogram", "deadline-watch"):
            named = await channel.declare_queue(own, exclusive=True)
            assert (await ask(exchange, named, b'{"command": "stats"}'))["command"] == "stats", own
        log = (bus.tmp / "queuemaster.log").read_text()
        assert "reply_to names a queue of the bus" in log and "queue_kind=dead.kept" in log

        def scraped() -> bool:
            return (
                value(scrape(metrics_port), 'toposm_queuemaster_osm_wire_total{event="reply_to_refused"}')
                == len(targets) + 3
            )

        await eventually(scraped)
    finally:
        await connection.close()


def test_the_bus_queues_a_reply_may_not_name_take_the_deployments_prefix():
    """The bus's own queues, with the deployment's exchange prefix and without it (the default bus may share
    the vhost); every other name is a queue a requester could have declared itself."""
    queues = ReplyQueues(Config(exchange_prefix="tiles."))
    bus_own = {
        "tiles.rpc_toposm.queuemaster": "rpc",
        "rpc_x": "rpc",
        "tiles.reply_ab12": "reply",
        "tiles.alert_ab12": "alert",
        "tiles.dead": "dead",
        "dead": "dead",
        "tiles.dead.kept": "dead.kept",
        "dead.kept": "dead.kept",
        "tiles.qbroker.retry.x.100": "qbroker",
        "qbroker.schedules": "qbroker",
        "toposm.queuemaster.osm": "toposm",
        "toposm.render.h.1.0": "toposm",
        "toposm": "toposm",
    }
    assert {name: queues.bus_queue(name) for name in bus_own} == bus_own
    for name in (
        "myprogram",
        "amq.gen-Xy_1",
        "toposm.reply.me",
        "tiles.myprogram",
        "deadline",
        "rpc",
        "toposmic",
        "amq.rabbitmq.reply-to.g1h2AA",
        "dead.kept.old",
        "tiles.dead.letters",
    ):
        assert queues.bus_queue(name) is None, name


async def test_a_seed_thread_named_and_saying_more_than_we_know_is_taken(bus):
    """A render thread from the seed's text whose queue has a name of its own, whose `register`
    carries fields the project does not know (the text: `{"command": ..., <parameters>}`), registers and
    renders; the fields it does not know are ignored and counted, and it hears nothing the text does not
    define (no `registered`, no `ack`). A sender that asks for an answer (a correlation_id) still gets it."""
    bus.queuemaster()
    client = await bus.client()
    raw = SeedRenderThread(
        bus.tile_root, queue_name="seedthread-vader", extra={"version": "2.1", "capabilities": ["png", "meta"]}
    )
    await raw.start(bus.url)
    try:
        s = await wait_renderers(client, 1)
        assert [r["renderer"] for r in s["renderers"]] == [raw.name]
        assert s["counters"]["osm_unknown_fields"] >= 2
        reply = await client.call("toposm.queuemaster", {"command": "render", "tile": "9/10/20"}, timeout=30)
        assert reply["metatile"] == "9/1/2" and raw.rendered == ["9/1/2"]
        connection, exchange, replies = await osm_client(bus.url, reply_queue="asks-for-answers")
        try:
            answer = await ask(
                exchange,
                replies,
                orjson.dumps({"command": "register", "hostname": "other", "pid": 1, "threadid": 0, "color": 1}),
            )
            assert answer["command"] == "registered" and answer["renderer"] == "toposm.render.other.1.0"
            bad = await ask(exchange, replies, b'{"command": "register", "hostname": "a.b", "pid": 1, "threadid": 0}')
            assert bad["error"] == "invalid_params" and "hostname" in bad["detail"]  # what we know is checked
        finally:
            await connection.close()
    finally:
        await raw.close()
    assert raw.unknown == [], raw.unknown


async def test_expirations_reach_both_wires_once(bus):
    """A list published on one wire only (a seed program on `osm`, `qbroker alert expire_toposm`) reaches the
    other wire's listeners too, once (relayed by the queuemaster, never back), and is taken once."""
    bus.queuemaster()
    client = await bus.client()
    heard_on_alert = await alert_listener(bus, "expire_toposm")
    connection, exchange, _ = await osm_client(bus.url)
    try:
        heard_on_osm = await osm_listener(exchange, "expire_toposm")  # bound to expire_toposm on osm only
        await osm_wire_ready(connection)
        await exchange.publish(aio_pika.Message(b"9/10/20;9/11/21"), routing_key="expire_toposm")  # seed producer
        await client.alert("expire_toposm", "10/1/2", content_type="text/plain")  # alert-only producer

        async def both_heard():
            return len(heard_on_alert) == 2 and len(heard_on_osm) == 2

        await eventually(both_heard)
        assert sorted(heard_on_alert) == sorted(heard_on_osm) == ["10/1/2", "9/10/20;9/11/21"]
        counters = (await stats(client))["counters"]
        # taken once each (3 tiles), though the queuemaster heard each list on both wires
        assert counters["expired"] == 3 and counters["expiry_twins"] == 2
        # a marker published after them comes after any echo would have: none came
        await client.alert("expire_toposm", "11/1/1", content_type="text/plain")
        await eventually(lambda: "11/1/1" in heard_on_osm and "11/1/1" in heard_on_alert)
        assert len(heard_on_alert) == len(heard_on_osm) == 3
    finally:
        await connection.close()


async def test_seed_programs_reach_qbroker_render_threads_by_hierarchy(bus):
    """On `osm`, a qbroker renderer listens on `toposm` and every level of its threads'
    hierarchy, and talks to the queuemaster with its own queue as reply_to."""
    bus.queuemaster()
    bus.renderer()
    client = await bus.client()
    s = await wait_renderers(client, 1)
    endpoint = s["renderers"][0]["renderer"]
    host = endpoint.split(".")[2]
    connection, exchange, _ = await osm_client(bus.url)
    try:
        # `render` addressed to the host level: one of its threads draws it and reports `rendered` on osm
        await exchange.publish(
            aio_pika.Message(b'{"command": "render", "metatile": "9/3/3"}'), routing_key=f"toposm.render.{host}"
        )
        await eventually(lambda: (bus.tile_root / "9/24/24.png").exists())

        async def reported():
            return await _counter(client, "rendered_unexpected") == 1  # not dispatched by the queuemaster

        await eventually(reported)
        # `queuemaster online` from a program of the seed: the renderer registers on osm, its queue as reply_to
        before = await _counter(client, "registrations")
        await exchange.publish(aio_pika.Message(b'{"command": "queuemaster online"}'), routing_key="toposm")

        async def registered_again():
            return await _counter(client, "registrations") > before

        await eventually(registered_again)
        reply = await client.call("toposm.queuemaster", {"command": "render", "tile": "10/80/80"}, timeout=30)
        assert reply["metatile"] == "10/10/10"
        assert [r["renderer"] for r in (await stats(client))["renderers"]] == [endpoint]
        assert await _counter(client, "osm_reply_to_refused") == 0
    finally:
        await connection.close()


async def test_waiting_clients_cannot_shut_render_threads_out_of_the_osm_wire(bus):
    """A client fills the osm wire's command slots with `render` requests that wait (the seed's wire has no
    deadline: they wait until rendered). The render threads' own commands (`register`, `rendered`) must still
    be taken, or nothing is ever rendered again and every waiting request waits for good."""
    from services.tiles.queuemaster.osm_wire import MAX_COMMANDS

    # One account (this bus has one) may hold fewer waits than the wire's slots: let it fill them here.
    bus.queuemaster("--max-waits-per-account", str(2 * MAX_COMMANDS))
    client = await bus.client()
    connection, exchange, replies = await osm_client(bus.url)
    raw = SeedRenderThread(bus.tile_root)
    try:
        await osm_wire_ready(connection)
        for i in range(MAX_COMMANDS + 10):  # distinct metatiles nobody has rendered: each one waits
            await exchange.publish(
                aio_pika.Message(
                    f'{{"command": "render", "tile": "14/{8 * (i % 1024)}/{8 * (i // 1024)}"}}'.encode(),
                    content_type="application/json",
                    reply_to=replies.name,
                    correlation_id=str(i),
                ),
                routing_key="toposm.queuemaster",
            )

        async def all_waiting():
            return (await stats(client))["waiting_requests"] >= MAX_COMMANDS

        await eventually(all_waiting)
        await raw.start(bus.url)  # registers on osm, renders and reports there
        await wait_renderers(client, 1)

        async def some_rendered():
            return len(raw.rendered) >= 3 and (await stats(client))["waiting_requests"] <= MAX_COMMANDS - 2

        await eventually(some_rendered)
    finally:
        await raw.close()
        await connection.close()


async def test_a_render_thread_cannot_write_megabyte_lines_into_the_render_log(bus):
    """A render thread reports a failure whose reason is 2 MiB (the body limit is 16): the render log's line
    (which toposm-web reads a MiB at a time, a line at a time: a longer line stopped its reading for good) and
    the error the waiting client gets are cut to the reason's bound."""
    from services.toposm.messages import MAX_REASON

    class Failing(SeedRenderThread):
        async def send(self, body):
            if body.get("command") == "rendered":
                body = {**body, "status": "error", "reason": "x" * (2 << 20)}
            await super().send(body)

    bus.queuemaster()
    client = await bus.client()
    raw = Failing(bus.tile_root)
    await raw.start(bus.url)
    try:
        await wait_renderers(client, 1)
        try:
            await client.call("toposm.queuemaster", {"command": "render", "tile": "9/10/20"}, timeout=60)
        except Exception as exc:  # render_failed, quoting the reason
            failure = str(exc)
        else:
            raise AssertionError("a failed render answered as rendered")
        assert "render_failed" in failure and len(failure) < MAX_REASON + 1000, len(failure)
        lines = bus.render_log.read_bytes().splitlines()
        assert lines and all(len(line) < MAX_REASON + 1000 for line in lines), [len(line) for line in lines]
    finally:
        await raw.close()
