"""Pydantic models of the TopOSM messages at the wire boundary (the protocol's ``{"command": ...}`` shapes).

Requests are validated here before they reach the queuemaster; field validators turn malformed tile,
metatile and strategy strings into validation errors, which qbroker answers as ``fail``. Unknown fields are
forbidden so that a typo (``"tiles"`` for ``"tile"``) is reported instead of silently ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .contract import join_expiry_list, render_thread, split_expiry_list
from .strategy import parse_strategy
from .tilemath import parse_metatile, parse_tile

HOSTNAME_PATTERN = r"^[A-Za-z0-9_-]{1,63}$"  # one routing-key word: no dots, no wildcards


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RegisterRequest(Message):
    """renderer -> queuemaster: a render thread offers itself."""

    hostname: str = Field(pattern=HOSTNAME_PATTERN)
    pid: int = Field(ge=0)
    threadid: int = Field(ge=0)
    strategy: str = "by_work_available"
    metatile: str | None = None  # set when re-registering while rendering (queuemaster restarted)

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, value: str) -> str:
        return str(parse_strategy(value))

    @field_validator("metatile")
    @classmethod
    def _metatile(cls, value: str | None) -> str | None:
        return None if value is None else str(parse_metatile(value))

    @property
    def endpoint(self) -> str:
        return render_thread(self.hostname, self.pid, self.threadid)


# A failed render's reason is a renderer's words (Mapnik's error): kept to this many characters, cut rather than
# refused (a refused report would leave its metatile rendering). It goes into the render log, whose readers take
# it a line at a time, and into the answer of every request waiting for the metatile.
MAX_REASON = 2000


class RenderedRequest(Message):
    """renderer -> queuemaster: a metatile render finished (ok) or failed (error, with a reason)."""

    metatile: str
    status: Literal["ok", "error"] = "ok"
    reason: str | None = None
    duration: float | None = Field(default=None, ge=0)
    start: float | None = None
    hostname: str | None = None
    pid: int | None = None
    threadid: int | None = None
    # The reporting thread is idle now and takes its next metatile in the answer (`render`), if the queue
    # has one for its strategy: one round trip per metatile instead of two (our extension of the protocol).
    next: bool = False

    @field_validator("metatile")
    @classmethod
    def _metatile(cls, value: str) -> str:
        return str(parse_metatile(value))

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str | None) -> str | None:
        return value if value is None or len(value) <= MAX_REASON else value[: MAX_REASON - 1] + "…"


class UnregisterRequest(Message):
    """renderer -> queuemaster: a thread (or, without ids, every thread behind this reply_to) leaves."""

    hostname: str | None = None
    pid: int | None = None
    threadid: int | None = None


class RenderTileRequest(Message):
    """requester -> queuemaster: render the metatile holding ``tile`` and answer when it is done."""

    tile: str

    @field_validator("tile")
    @classmethod
    def _tile(cls, value: str) -> str:
        return str(parse_tile(value))


class ExpireRequest(Message):
    """The expiry list as a command (same effect as text on ``expire_toposm``)."""

    tiles: str | list[str]

    @property
    def text(self) -> str:
        return self.tiles if isinstance(self.tiles, str) else join_expiry_list(self.tiles)

    @field_validator("tiles")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        if not split_expiry_list(value if isinstance(value, str) else join_expiry_list(value)):
            raise ValueError("no tiles given")
        return value


class BulkRenderRequest(Message):
    """``toposm-render-list`` -> queuemaster: render a metatile at bulk (or background) priority and answer
    when it is rendered; with ``missing_only`` a metatile rendered before is answered ``skipped`` at once."""

    metatile: str
    missing_only: bool = False
    priority: Literal["bulk", "background"] = "bulk"

    @field_validator("metatile")
    @classmethod
    def _metatile(cls, value: str) -> str:
        return str(parse_metatile(value))


MAX_CANCEL = 10_000  # metatiles per `cancel`: a render-list window is far smaller


class CancelBulkRequest(Message):
    """``toposm-render-list`` stopping -> queuemaster: withdraw these metatiles if they are still queued for
    bulk pre-rendering (not raised by a request or an expiry, not rendering); their waiters are answered."""

    metatiles: list[str] = Field(min_length=1, max_length=MAX_CANCEL)

    @field_validator("metatiles")
    @classmethod
    def _metatiles(cls, value: list[str]) -> list[str]:
        return [str(parse_metatile(m)) for m in value]


class RenderCommand(Message):
    """queuemaster -> renderer thread."""

    metatile: str

    @field_validator("metatile")
    @classmethod
    def _metatile(cls, value: str) -> str:
        return str(parse_metatile(value))


class StatsRequest(Message):
    """anyone -> queuemaster: the queues, the render threads and the counters (no parameters)."""
