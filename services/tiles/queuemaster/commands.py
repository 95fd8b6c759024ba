"""The queuemaster's commands, listed once.

Both ways in read this table: the qbroker command endpoint ``toposm.queuemaster`` (``service``) and the
TopOSM ``osm`` exchange's raw JSON (``osm_wire``). Each command names its request model (validated at the wire
boundary) and the state-machine method that answers it, so the two wires cannot drift apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from qbroker import InvalidParams, UnknownCommand
from services.toposm.contract import QUEUEMASTER, Command
from services.toposm.expiry_wires import expiry_text
from services.toposm.messages import (
    BulkRenderRequest,
    CancelBulkRequest,
    ExpireRequest,
    Message,
    RegisterRequest,
    RenderedRequest,
    RenderTileRequest,
    StatsRequest,
    UnregisterRequest,
)

from .bulk import bulk_render, cancel_bulk
from .state_machine import Queuemaster

log = structlog.get_logger("toposm.queuemaster")

# (queuemaster, validated request, reply_to, the sender's broker-validated account or None)
Answer = Callable[[Queuemaster, Any, str | None, str | None], Any]


@dataclass(frozen=True)
class QueuemasterCommand:
    request: type[Message]  # its word is the model's (``request.COMMAND``)
    answer: Answer
    # The answer may take minutes (a render): the endpoint must not hold a prefetch slot meanwhile.
    long_running: bool = False

    @property
    def name(self) -> str:
        return self.request.COMMAND.value

    async def run(self, qm: Queuemaster, request: Message, reply_to: str | None, user: str | None = None) -> Any:
        # Both wires come through here, so neither can skip the account check.
        qm.settings.access.check(self.name, user)
        abandoned = False
        try:
            result = self.answer(qm, request, reply_to, user)
            if isinstance(result, Awaitable):
                result = await result
        except asyncio.CancelledError:
            abandoned = True  # by a stop: nobody is answered, and the store may be closing
            raise
        finally:
            if not abandoned:
                # Group commits: what this command changed is on disk before either wire answers it.
                await qm.commits.durable()
        return result


async def _render(qm: Queuemaster, req: RenderTileRequest, reply_to: str | None, user: str | None) -> Any:
    return await qm.request(req.tile, user=user)


async def _expire(qm: Queuemaster, req: ExpireRequest, reply_to: str | None, user: str | None) -> Any:
    """Taken here, then told to every other expiry listener (tile servers, caches, programs on ``osm``), as if it
    had come on ``expire_toposm``: a list expired by command is no secret of the queuemaster's."""
    answer = {"command": Command.EXPIRED, **qm.expire(req.text, strict=True)}
    if qm.announce_expiry is not None:
        try:
            await qm.announce_expiry(req.text)
        except Exception as exc:  # taken and answered all the same; only the listeners miss it
            log.warning("expired by command but not broadcast", error=str(exc))
    return answer


COMMANDS: dict[str, QueuemasterCommand] = {
    c.name: c
    for c in (
        QueuemasterCommand(RegisterRequest, lambda qm, req, reply_to, user: qm.register(req, reply_to, user=user)),
        QueuemasterCommand(RenderedRequest, lambda qm, req, reply_to, user: qm.rendered(req, user=user)),
        QueuemasterCommand(UnregisterRequest, lambda qm, req, reply_to, user: qm.unregister(req, reply_to, user=user)),
        QueuemasterCommand(RenderTileRequest, _render, long_running=True),
        QueuemasterCommand(ExpireRequest, _expire),
        QueuemasterCommand(StatsRequest, lambda qm, req, reply_to, user: qm.describe()),
        QueuemasterCommand(
            BulkRenderRequest, lambda qm, req, reply_to, user: bulk_render(qm, req, user), long_running=True
        ),
        QueuemasterCommand(CancelBulkRequest, lambda qm, req, reply_to, user: cancel_bulk(qm, req, user)),
    )
}


def parse_command(name: Any, params: Any) -> tuple[QueuemasterCommand, Message]:
    """The command and its validated request, or UnknownCommand / InvalidParams (status ``fail``)."""
    command = COMMANDS.get(name) if isinstance(name, str) else None
    if command is None:
        known = ", ".join(sorted(COMMANDS))
        raise UnknownCommand(f"unknown command {name!r} for {QUEUEMASTER} (known: {known})")
    try:
        return command, command.request.model_validate(params)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        # Worded as qbroker words it on the endpoint, so both wires answer a bad request alike.
        raise InvalidParams(f"invalid parameters for {QUEUEMASTER}:{name}: {problems}") from None


async def expire_broadcast(qm: Queuemaster, body: Any) -> dict[str, Any] | None:
    """An expiry broadcast (``expire_toposm``): nobody to answer, so invalid items are logged and counted.
    Taken in chunks that each hold the loop a few milliseconds, whatever the list's size."""
    text = expiry_text(body)
    if text is None:
        qm.stats.count("invalid_expiry_messages")
        log.warning("expiry message is not text", body_type=type(body).__name__)
        return None
    totals = await qm.expire_in_chunks(text)
    await qm.commits.durable_soon()  # acked when this returns: committed by then (with others of this loop turn)
    return totals
