"""A qbroker renderer on TopOSM's ``osm`` wire too: reachable as any program of the TopOSM protocol expects.

The protocol (docs/tiles.md, "The TopOSM protocol"): every program listens on ``toposm``; render threads listen on
every level of ``toposm.render.<host>.<pid>.<id>``; renderer -> queuemaster messages carry the renderer's *queue* as
``reply_to``. So the process declares one exclusive, broker-named queue on ``osm`` (gone with its connection: the
queuemaster's liveness check asks the broker about it), bound to ``toposm``, the levels above its threads and each
thread's own name, and uses it as ``reply_to`` of everything it sends there.

What it takes there, as the protocol defines it:

* ``queuemaster online``: register every thread on ``osm`` (a queuemaster that speaks only the ``osm`` wire
  hears nothing else). Our own queuemaster's announcement, which also comes over qbroker, is recognised by
  its ``app_id`` and left to the qbroker path, so a thread is not registered twice.
* ``render`` ``{"metatile"}``: to a thread's own name, that thread; to a level, one idle thread of this
  process. The render's ``rendered`` goes back on ``osm`` (the wire the work came by). A thread that is
  busy, or a process with none idle, takes nothing (logged): the protocol has no refusal.

Anything else (and anything that is not a JSON object with a string ``command``) is logged and dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import orjson
import structlog
from aio_pika.abc import AbstractIncomingMessage
from pydantic import ValidationError

from qbroker import ConnectionLost
from services.toposm.contract import ALL_PROGRAMS, QUEUEMASTER, Command
from services.toposm.messages import RenderCommand, UnregisterRequest
from services.toposm.seed_wire import OsmListener, seed_command

log = structlog.get_logger("toposm.renderer.osm")


class OsmSide:
    """``on_render(endpoint_or_level, metatile)`` hands a render to a thread (True if one took it);
    ``on_online()`` registers the threads here."""

    def __init__(
        self,
        keys: list[str],
        user: Callable[[], str | None],
        on_render: Callable[[str, str, str | None], bool],
        on_online: Callable[[], Awaitable[None]],
    ) -> None:
        # keys: toposm, the levels, each thread's name. Nothing heard there is retried: a failure is logged
        # (by the listener) and the message dropped.
        self.listener = OsmListener(keys, self._on_message)
        self.declare = self.listener.declare  # unit.on_connected(osm.declare)
        self.user = user  # our broker account: set as user_id, which RabbitMQ validates
        self.on_render = on_render
        self.on_online = on_online

    async def send(self, body: dict[str, Any]) -> None:
        """A renderer -> queuemaster message on ``osm``, with our queue as reply_to."""
        exchange, queue_name = self.listener.exchange, self.listener.queue_name
        if exchange is None or queue_name is None:
            raise ConnectionLost("the osm wire is not declared (not connected)")
        await exchange.publish(
            aio_pika.Message(
                orjson.dumps(body), content_type="application/json", reply_to=queue_name, user_id=self.user()
            ),
            routing_key=QUEUEMASTER,
        )

    async def unregister(self) -> None:
        """The protocol's bare ``unregister``: every thread behind our queue (on stop)."""
        try:
            await self.send(UnregisterRequest().body())
        except Exception as exc:  # stopping anyway; the queuemaster finds our queue gone
            log.info("unregister not delivered on osm", error=repr(exc))

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        body = seed_command(message.body)
        if body is None:
            log.info("osm message is not a TopOSM command; dropped", routing_key=message.routing_key)
            return
        command = body["command"]
        if command == Command.QUEUEMASTER_ONLINE:
            if message.app_id != QUEUEMASTER:  # ours (its app id is its name) is heard over qbroker as well
                await self.on_online()
        elif command == Command.RENDER and message.routing_key != ALL_PROGRAMS:
            try:
                metatile = RenderCommand.model_validate({"metatile": body.get("metatile")}).metatile
            except ValidationError:
                log.info("osm render with a bad metatile; dropped", routing_key=message.routing_key)
                return
            if not self.on_render(message.routing_key or "", metatile, message.user_id):
                log.info(
                    "osm render not taken: no idle thread there", routing_key=message.routing_key, metatile=metatile
                )
        # answers to what we sent: nothing to do
        elif command not in (Command.REGISTERED, Command.ACK, Command.UNREGISTERED):
            log.debug("osm message ignored", command=str(command)[:64], routing_key=message.routing_key)
