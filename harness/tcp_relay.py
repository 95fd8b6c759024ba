"""A TCP relay between clients and a real broker that a test can make fail the way a dying RabbitMQ node does:
``hold_replies`` keeps what the broker sends from reaching the clients already connected (their publisher
confirms, replies and heartbeats never arrive), ``reset`` then cuts those connections with a TCP reset (what a
client reads when its node was SIGKILLed: ``Server connection reset``). Connections made afterwards are relayed
whole. Everything the clients send still reaches the broker, so a message published meanwhile is taken,
delivered and answered there, and only its publisher does not hear of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit


@dataclass(eq=False)
class _Relayed:
    client: asyncio.StreamWriter
    broker: asyncio.StreamWriter
    held: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class TcpRelay:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._url = parts
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 5672
        self._server: asyncio.Server | None = None
        self._relayed: set[_Relayed] = set()
        self.port = 0

    @property
    def url(self) -> str:
        """The broker URL (vhost, account and all) with the relay in the broker's place."""
        auth = self._url.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        return urlunsplit((self._url.scheme, netloc, self._url.path, self._url.query, self._url.fragment))

    async def start(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def hold_replies(self) -> None:
        """From now on, what the broker sends on the connections relayed now is dropped, never delivered."""
        for relayed in self._relayed:
            relayed.held = True

    def reset(self) -> int:
        """Cut every connection relayed now: a TCP reset to the client, a close to the broker. Returns how many."""
        relayed, self._relayed = self._relayed, set()
        for pair in relayed:
            _cut(pair)
        return len(relayed)

    async def close(self) -> None:
        self.reset()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            broker_reader, broker_writer = await asyncio.open_connection(self._host, self._port)
        except OSError:
            client_writer.transport.abort()
            return
        pair = _Relayed(client_writer, broker_writer)
        self._relayed.add(pair)
        pair.tasks = [
            asyncio.ensure_future(_pipe(client_reader, broker_writer, pair, towards_client=False)),
            asyncio.ensure_future(_pipe(broker_reader, client_writer, pair, towards_client=True)),
        ]
        await asyncio.gather(*pair.tasks, return_exceptions=True)
        self._relayed.discard(pair)


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pair: _Relayed, *, towards_client: bool
) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            if towards_client and pair.held:
                continue
            writer.write(data)
            await writer.drain()
    # One side ended (the broker's died): so does the client's, with a reset as from a killed node.
    _cut(pair)


def _cut(pair: _Relayed) -> None:
    sock = pair.client.get_extra_info("socket")
    if sock is not None and not pair.client.transport.is_closing():
        with contextlib.suppress(OSError):  # linger 0: the close sends a reset instead of a FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    pair.client.transport.abort()
    pair.broker.transport.abort()
