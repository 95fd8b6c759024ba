"""The RPC contenders of bench/peers.py: an echo server and a client for each, on one broker URL.

Every contender echoes ``{"text": "hello", "n": 1}``. Each gets its own vhost (its URL), so names never
collide and nothing is left behind. ``serve(url)`` starts an echo server and returns its stop function;
``connect(url)`` returns a client's ``call()`` and its stop function. The driver in bench/peers.py times
the calls the same way for everyone (same workers, same clock), so only the client and server differ.

- ``qbroker``: ``Unit.call`` to ``@unit.rpc`` (prefetch 256), the library as users get it.
- ``qbroker_metrics``: not a peer; ``qbroker`` with both units instrumented (``qbroker.metrics``): what the
  library's Prometheus metrics cost a call.
- ``aio_pika_rpc``: ``aio_pika.patterns.RPC`` (its own reply queue, confirms on, pickle bodies).
- ``faststream``: ``RabbitBroker.request()`` to a ``@broker.subscriber`` (direct reply-to).
- ``floor_seed``: raw aiormq with the QBroker structure (docs/wire-format.md): a topic request exchange, a
  direct reply exchange and a reply queue per client, publisher confirms on requests (pipelined: the reply is
  awaited, the confirm checked by a callback), the server acks each request after publishing its reply.
- ``floor_seed_queued``: not the goal's floor; floor_seed with its writes queued on the connection
  instead of awaited (aiormq's ``wait=False``), as qbroker writes them: what that one choice gives raw
  aiormq.
- ``floor_direct``: raw aiormq, direct reply-to, no acks, no confirms: the physical floor.
- ``qbroker_wire_aiormq``: not a peer; floor_seed carrying qbroker's whole envelope: what a
  hot path on aiormq directly could reach with the wire format unchanged.

The raw aiormq contenders (the floors and ``qbroker_wire_aiormq``) are in bench/peers_rpc_aiormq.py.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

import aio_pika
from aio_pika.patterns import RPC

from bench.peers_rpc_aiormq import (
    floor_direct_connect,
    floor_direct_serve,
    floor_seed_connect,
    floor_seed_queued_connect,
    floor_seed_queued_serve,
    floor_seed_serve,
    wire_connect,
    wire_serve,
)
from bench.peers_rpc_contender import PAYLOAD, Call, Contender, Stop
from qbroker import Config, Unit
from qbroker.metrics import instrument

# -- qbroker -------------------------------------------------------------------------------------------


async def _qbroker_serve(url: str, *, metrics: bool = False) -> Stop:
    unit = Unit("bench.server", config=Config(url=url))
    if metrics:
        instrument(unit)

    @unit.rpc("bench.echo", prefetch=256)
    async def echo(body: object) -> object:
        return body

    await unit.start()
    return unit.stop


async def _qbroker_connect(url: str, *, metrics: bool = False) -> tuple[Call, Stop]:
    unit = Unit("bench.client", config=Config(url=url))
    if metrics:
        instrument(unit)
    await unit.start()

    def call() -> Awaitable[object]:
        return unit.call("bench.echo", PAYLOAD, timeout=60)

    return call, unit.stop


async def _qbroker_metrics_serve(url: str) -> Stop:
    return await _qbroker_serve(url, metrics=True)


async def _qbroker_metrics_connect(url: str) -> tuple[Call, Stop]:
    return await _qbroker_connect(url, metrics=True)


# -- aio-pika patterns.RPC ---------------------------------------------------------------------------


async def _aio_pika_serve(url: str) -> Stop:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=256)
    rpc = await RPC.create(channel)

    async def echo(text: str, n: int) -> dict[str, Any]:
        return {"text": text, "n": n}

    await rpc.register("bench_echo", echo, auto_delete=True)
    return connection.close


async def _aio_pika_connect(url: str) -> tuple[Call, Stop]:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    rpc = await RPC.create(channel)

    def call() -> Awaitable[object]:
        return rpc.call("bench_echo", kwargs=PAYLOAD)

    return call, connection.close


# -- FastStream ------------------------------------------------------------------------------------------


def _faststream_broker(url: str) -> Any:
    from faststream.rabbit import RabbitBroker  # optional (the bench extra): imported only when run

    return RabbitBroker(url, logger=None, log_level=logging.WARNING)


async def _faststream_serve(url: str) -> Stop:
    broker = _faststream_broker(url)

    @broker.subscriber("bench-echo")  # type: ignore[misc]
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return body

    await broker.start()
    return broker.stop  # type: ignore[no-any-return]


async def _faststream_connect(url: str) -> tuple[Call, Stop]:
    broker = _faststream_broker(url)
    await broker.connect()

    async def call() -> object:
        response = await broker.request(PAYLOAD, "bench-echo", timeout=60)
        return await response.decode()

    return call, broker.stop  # type: ignore[no-any-return]


CONTENDERS: dict[str, Contender] = {
    c.name: c
    for c in (
        Contender("qbroker", _qbroker_serve, _qbroker_connect),
        Contender("qbroker_metrics", _qbroker_metrics_serve, _qbroker_metrics_connect),
        Contender("aio_pika_rpc", _aio_pika_serve, _aio_pika_connect),
        Contender("faststream", _faststream_serve, _faststream_connect),
        Contender("floor_seed", floor_seed_serve, floor_seed_connect),
        Contender("floor_seed_queued", floor_seed_queued_serve, floor_seed_queued_connect),
        Contender("floor_direct", floor_direct_serve, floor_direct_connect),
        Contender("qbroker_wire_aiormq", wire_serve, wire_connect),
    )
}
