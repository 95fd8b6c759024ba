"""The floor under bench/rpc.py: bare aio-pika request/reply between two processes, no qbroker.

Same broker and pattern as bench/rpc.py (topic request exchange, direct reply exchange, a per-client
reply queue, 64 calls in flight), without the envelope, validation or dead-letter machinery. Prints JSON.

    .venv/bin/python bench/aio_pika_floor.py [--no-confirms]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
import uuid
from multiprocessing.synchronize import Event
from pathlib import Path

import aio_pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402

PREFIX = f"floor-{uuid.uuid4().hex[:6]}."


def _server(url: str, ready: Event, stop: Event, confirms: bool, prefix: str) -> None:
    async def main() -> None:
        connection = await aio_pika.connect(url)
        channel = await connection.channel(publisher_confirms=confirms)
        await channel.set_qos(256)
        requests = await channel.declare_exchange(prefix + "rpc", "topic", auto_delete=True)
        replies = await channel.declare_exchange(prefix + "reply", "direct", auto_delete=True)
        queue = await channel.declare_queue(prefix + "rpc_echo", auto_delete=True)
        await queue.bind(requests, "echo")

        async def echo(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            reply = aio_pika.Message(message.body, correlation_id=message.message_id)
            await replies.publish(reply, routing_key=message.reply_to or "")
            await message.ack()

        await queue.consume(echo)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await connection.close()

    asyncio.run(main())


async def _client(url: str, confirms: bool, prefix: str, n_seq: int, n_conc: int) -> dict[str, float]:
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=confirms)
    requests = await channel.get_exchange(prefix + "rpc")
    replies = await channel.get_exchange(prefix + "reply")
    me = uuid.uuid4().hex
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(replies, me)
    pending: dict[str, asyncio.Future[bytes]] = {}

    async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        future = pending.pop(message.correlation_id or "", None)
        if future is not None:
            future.set_result(message.body)

    await queue.consume(on_reply, no_ack=True)
    loop = asyncio.get_running_loop()

    async def call() -> bytes:
        message_id = uuid.uuid4().hex
        future: asyncio.Future[bytes] = loop.create_future()
        pending[message_id] = future
        message = aio_pika.Message(b'{"text": "hello", "n": 1}', message_id=message_id, reply_to=me)
        asyncio.ensure_future(requests.publish(message, "echo"))
        return await future

    for _ in range(300):
        await call()
    started = time.perf_counter()
    for _ in range(n_seq):
        await call()
    sequential = n_seq / (time.perf_counter() - started)
    limit = asyncio.Semaphore(64)

    async def limited() -> None:
        async with limit:
            await call()

    started = time.perf_counter()
    await asyncio.gather(*(limited() for _ in range(n_conc)))
    concurrent = n_conc / (time.perf_counter() - started)
    await connection.close()
    return {"sequential_calls_per_s": round(sequential, 1), "concurrent_calls_per_s": round(concurrent, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-confirms", action="store_true")
    parser.add_argument("--seq", type=int, default=3000)
    parser.add_argument("--conc", type=int, default=10000)
    args = parser.parse_args()
    confirms = not args.no_confirms
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    vhost = create_vhost("qbroker-bench")  # a throwaway vhost: nothing is left on the broker
    url = url_for_vhost(vhost)
    server = ctx.Process(target=_server, args=(url, ready, stop, confirms, PREFIX), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise SystemExit("floor server did not start")
        result = asyncio.run(_client(url, confirms, PREFIX, args.seq, args.conc))
    finally:
        stop.set()
        server.join(15)
        delete_vhost(vhost)
    print(json.dumps({"aio_pika_floor": result, "publisher_confirms": confirms, "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
