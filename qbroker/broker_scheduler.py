"""Schedules kept on the broker (EventMQ SCHEDULE/UNSCHEDULE), run by exactly one active scheduler.

The schedules live as persistent messages in one durable queue, ``<prefix>qbroker.schedules``, declared
with ``x-single-active-consumer``. Every ``BrokerScheduler`` consumes it; the broker delivers to one of
them only. That one holds every message *unacked* for as long as it runs them: the unacked messages are
its lease. When it dies (its connection closes) the broker puts them back and delivers them to the next
consumer, which takes over at once with the same schedules, run counts and last-run times. No process
keeps anything that the broker does not: RabbitMQ gives us both the store and the election.

Messages on the queue (JSON):

* ``{"op": "set", "schedule": {...}, "runs": n, "last_run": t, "created_at": t}``: add or replace. A
  schedule's identity is a hash of what it sends (kind, name, body), so setting the same again updates
  its timing instead of adding a second one. The active scheduler re-publishes a schedule after each send
  (its new run count and last-run time) and acks the older message when the newer one arrives.
* ``{"op": "remove", "id": "..."}``: the active scheduler acks it and the schedule's message.
* ``{"op": "lease"}``: each scheduler publishes one when it connects, so the active one always holds
  at least one message and knows it is active even with no schedules; extra leases are acked away.

Anyone who may publish to the queue may make the scheduler send casts and alerts under the scheduler's
own broker identity: grant write on it to operators only (docs/security.md), or list the accounts in
``owners``. ``list_schedules`` asks every scheduler over a gathered alert; standbys answer that they hold
nothing. The clock is injectable (``qbroker.testing.ManualClock``) so cron lines can be tested without
waiting for the minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

import aio_pika
import orjson
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from qbroker.config import Config
from qbroker.schedule import next_cron, valid_cron
from qbroker.transport import Connection
from qbroker.unit import Unit

LIST_ALERT = "qbroker.schedules"
MAX_SCHEDULE_BYTES = 64 * 1024  # one schedule message; a body bigger than this belongs in a real store
MAX_SCHEDULES = 10_000


def schedules_queue(config: Config) -> str:
    return f"{config.exchange_prefix}qbroker.schedules"


class ScheduleSpec(BaseModel):
    """What to send and when: exactly one of ``every`` (seconds) or ``cron`` (a five-field cron line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=255)
    kind: Literal["cast", "alert"] = "cast"
    body: Any = None
    every: float | None = Field(None, gt=0, le=366 * 86400)
    cron: str | None = Field(None, max_length=200)
    nohaste: bool = False  # EventMQ: the first send waits one interval instead of going at once
    run_count: int | None = Field(None, ge=1)  # stop after this many sends

    @field_validator("name")
    @classmethod
    def _plain_routing_key(cls, name: str) -> str:
        if "*" in name or "#" in name or any(not word for word in name.split(".")):
            raise ValueError("a schedule sends to one name: no wildcards or empty words")
        return name

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, cron: str | None) -> str | None:
        if cron is not None and not valid_cron(cron):
            raise ValueError(f"invalid cron line {cron!r}")
        return cron

    @model_validator(mode="after")
    def _one_timing(self) -> ScheduleSpec:
        if (self.every is None) == (self.cron is None):
            raise ValueError("give exactly one of every or cron")
        return self

    @property
    def id(self) -> str:
        """The identity: a hash of what is sent (kind, name, body), not of when."""
        what = orjson.dumps({"kind": self.kind, "name": self.name, "body": self.body}, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(what).hexdigest()[:16]


class _Set(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["set"]
    schedule: ScheduleSpec
    runs: int = Field(0, ge=0)
    last_run: float | None = None
    created_at: float


class _Remove(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["remove"]
    id: str = Field(min_length=1, max_length=64)


class _Lease(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["lease"]


_OP: TypeAdapter[_Set | _Remove | _Lease] = TypeAdapter(_Set | _Remove | _Lease)


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep_until(self, when: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    async def sleep_until(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - time.time()))


def next_due(spec: ScheduleSpec, *, now: float, last_run: float | None, created_at: float) -> float:
    """When the next send is due. Missed runs (no scheduler was up) are skipped, never sent as a burst."""
    if spec.cron is not None:
        return next_cron(spec.cron, max(now, last_run or 0.0))
    assert spec.every is not None
    if last_run is not None:
        return max(now, last_run + spec.every)
    return max(now, created_at + spec.every) if spec.nohaste else now


@dataclass
class _Running:
    state: _Set
    message: AbstractIncomingMessage  # held unacked: our lease on this schedule
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    due: float | None = None


class BrokerScheduler:
    """Runs the bus's persisted schedules while this unit is the queue's single active consumer.

    Create it before ``unit.start()`` (it registers a listener and a connect hook); it is a runner
    ``Service``: ``qbroker.runner.run_service(unit, BrokerScheduler(unit))``.
    """

    def __init__(self, unit: Unit, *, clock: Clock | None = None, owners: Iterable[str] | None = None) -> None:
        self.unit = unit
        self.clock: Clock = clock or SystemClock()
        self.owners = frozenset(owners) if owners is not None else None
        self.queue_name = schedules_queue(unit.config)
        self._running: dict[str, _Running] = {}
        # Removed schedules, with when: a re-publish of one that was in flight when it was removed must not
        # bring it back (a user's new `set` is newer than the removal and is taken).
        self._removed: dict[str, float] = {}
        self._lease: AbstractIncomingMessage | None = None
        self._channel: AbstractChannel | None = None
        self.dropped = 0  # unreadable, forged or refused schedule messages, acked away
        self.stale = 0  # re-publishes of removed schedules, acked away
        self.log = unit.log.bind(part="qbroker.scheduler")
        unit.on_connected(self._attach)
        unit.on_alert(LIST_ALERT)(self._answer_list)

    @property
    def active(self) -> bool:
        return self._lease is not None

    async def start(self) -> None:
        """Nothing to do: the connect hook consumes the queue."""

    async def stop(self) -> None:
        self._forget()

    # -- the queue -------------------------------------------------------------------------------------

    async def _attach(self, transport_connection: Connection) -> None:
        # A new connection: whatever we held went back to the queue with the old one.
        self._forget()
        channel = await self.unit.bus.channel(transport_connection, confirms=True)
        await channel.set_qos(prefetch_count=0)  # we must be able to hold every schedule at once
        queue = await declare_schedules_queue(cast(AbstractChannel, channel), self.unit.config)
        self._channel = cast(AbstractChannel, channel)
        await self.unit.bus.add_consumer(queue, self._on_message, part="qbroker.scheduler", answer=False)
        await _publish(self.unit, {"op": "lease"}, transport_connection)

    def _forget(self) -> None:
        for running in self._running.values():
            if running.task is not None:
                running.task.cancel()
        self._running.clear()
        self._lease = None

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            if len(message.body) > MAX_SCHEDULE_BYTES:
                raise ValueError(f"schedule message of {len(message.body)} bytes (limit {MAX_SCHEDULE_BYTES})")
            op = _OP.validate_json(message.body)
        except (ValueError, ValidationError) as exc:
            # A forged or corrupt message would come back to every future scheduler: drop it, loudly.
            self.log.warning("dropping unreadable schedule message", error=str(exc)[:300])
            self.dropped += 1
            await message.ack()
            return
        if not isinstance(op, _Lease) and self.owners is not None and message.user_id not in self.owners:
            self.log.warning("dropping schedule change from an account not in owners", user_id=message.user_id)
            self.dropped += 1
            await message.ack()
            return
        if isinstance(op, _Lease):
            if self._lease is None:
                self._lease = message
                self.log.info("active scheduler", schedules_held=len(self._running))
            else:
                await message.ack()
        elif isinstance(op, _Remove):
            await message.ack()
            self._removed[op.id] = time.time()
            await self._drop(op.id, "removed")
        else:
            await self._set(op, message)

    async def _set(self, op: _Set, message: AbstractIncomingMessage) -> None:
        spec = op.schedule
        removed_at = self._removed.get(spec.id)
        if removed_at is not None:
            if op.created_at <= removed_at:  # our own re-publish, overtaken by the removal
                self.stale += 1
                await message.ack()
                return
            del self._removed[spec.id]  # set again after its removal: a new schedule
        held = self._running.get(spec.id)
        if held is None and len(self._running) >= MAX_SCHEDULES:
            self.log.warning("too many schedules; dropping a new one", limit=MAX_SCHEDULES, name=spec.name)
            self.dropped += 1
            await message.ack()
            return
        if held is not None:
            if held.state.schedule == spec:
                # Our own re-publish after a send (or the same schedule set again): swap the messages.
                if op.runs < held.state.runs:
                    op = held.state.model_copy(update={"created_at": op.created_at})
                held.state, old = op, held.message
                held.message = message
                await old.ack()
                return
            # The same schedule with new timing: keep its history, restart its timer.
            op = op.model_copy(update={"runs": held.state.runs, "last_run": held.state.last_run})
            await self._drop(spec.id, "updated")
        running = _Running(op, message)
        self._running[spec.id] = running
        running.task = asyncio.create_task(self._run(running), name=f"qbroker-schedule-{spec.name}")

    async def _drop(self, schedule_id: str, why: str) -> None:
        running = self._running.pop(schedule_id, None)
        if running is None:
            return
        if running.task is not None and running.task is not asyncio.current_task():
            running.task.cancel()
        with contextlib.suppress(Exception):  # a closed channel requeued it; the next holder drops it
            await running.message.ack()
        self.log.info("schedule ended", id=schedule_id, name=running.state.schedule.name, why=why)

    # -- sending ---------------------------------------------------------------------------------------

    async def _run(self, running: _Running) -> None:
        spec = running.state.schedule
        while True:
            state = running.state
            running.due = next_due(spec, now=self.clock.now(), last_run=state.last_run, created_at=state.created_at)
            await self.clock.sleep_until(running.due)
            if self.unit.state != "started":
                return
            sent_at = self.clock.now()
            try:
                await self._send(spec, running)
            except Exception as exc:  # a lost broker must not end the schedule: the next due time retries
                self.log.warning("scheduled send failed", name=spec.name, error=str(exc) or type(exc).__name__)
            running.state = state = state.model_copy(update={"runs": state.runs + 1, "last_run": sent_at})
            if spec.run_count is not None and state.runs >= spec.run_count:
                await self._drop(spec.id, "run_count reached")
                return
            await self._persist(state)

    async def _send(self, spec: ScheduleSpec, running: _Running) -> None:
        if spec.kind == "alert":
            await self.unit.alert(spec.name, spec.body)
            return
        # A send is stale once the next one is due: that is its TTL (at most the unit's cast TTL).
        following = next_due(spec, now=self.clock.now(), last_run=self.clock.now(), created_at=0.0)
        ttl = max(0.001, min(following - self.clock.now(), self.unit.config.cast_ttl))
        await self.unit.cast(spec.name, spec.body, ttl=ttl)

    async def _persist(self, state: _Set) -> None:
        """Re-publish the schedule with its new run count; its older message is acked when this arrives."""
        channel = self._channel
        if channel is None or channel.is_closed:
            return  # not persisted: a failover repeats at most one send
        with contextlib.suppress(Exception):
            # On our own consuming channel (confirmed), no channel or declare per send.
            await channel.default_exchange.publish(
                _message(self.unit, state.model_dump(mode="json")), routing_key=self.queue_name
            )

    # -- listing ---------------------------------------------------------------------------------------

    async def _answer_list(self) -> dict[str, Any]:
        return {
            "uuid": self.unit.uuid,
            "app": self.unit.app,
            "active": self.active,
            "schedules": [self._describe(r) for r in self._running.values()] if self.active else [],
        }

    @staticmethod
    def _describe(running: _Running) -> dict[str, Any]:
        state = running.state
        return {
            "id": state.schedule.id,
            **state.schedule.model_dump(mode="json", exclude_none=True),
            "runs": state.runs,
            "last_run": state.last_run,
            "next_due": running.due,
            "created_at": state.created_at,
        }


# -- clients: add, remove, list ------------------------------------------------------------------------


async def declare_schedules_queue(channel: AbstractChannel, config: Config) -> aio_pika.abc.AbstractQueue:
    return await channel.declare_queue(
        schedules_queue(config),
        durable=True,
        arguments={"x-single-active-consumer": True, **config.durable_queue_type()},
    )


def _message(unit: Unit, op: dict[str, Any]) -> aio_pika.Message:
    body = orjson.dumps(op)
    if len(body) > MAX_SCHEDULE_BYTES:
        raise ValueError(f"schedule of {len(body)} bytes is over the {MAX_SCHEDULE_BYTES}-byte limit")
    # user-id: the broker checks it is our own account, so ``owners`` can trust it.
    return aio_pika.Message(
        body,
        content_type="application/json",
        user_id=unit.bus.supervisor.user,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


async def _publish(unit: Unit, op: dict[str, Any], connection: Connection | None = None) -> None:
    connection = connection or unit.connection
    if connection is None:
        raise RuntimeError("the unit is not connected: start it first")
    config = unit.config
    message = _message(unit, op)  # checks the size before a channel is opened
    # Plain AMQP (default exchange, persistent messages), beyond qbroker's narrow transport protocol.
    channel = cast(AbstractChannel, await connection.channel(publisher_confirms=True))
    try:
        await declare_schedules_queue(channel, config)
        await channel.default_exchange.publish(message, routing_key=schedules_queue(config))
    finally:
        await channel.close()


async def add_schedule(unit: Unit, spec: ScheduleSpec) -> str:
    """Persist ``spec`` on the broker (replacing the schedule with the same identity); return its id."""
    op = _Set(op="set", schedule=spec, created_at=time.time())
    await _publish(unit, op.model_dump(mode="json"))
    return spec.id


async def remove_schedule(unit: Unit, schedule_id: str) -> None:
    await _publish(unit, {"op": "remove", "id": schedule_id})


async def list_schedules(unit: Unit, *, timeout: float = 2.0) -> tuple[str | None, list[dict[str, Any]]]:
    """(the active scheduler's uuid or None, its schedules) from the schedulers on the bus."""
    replies = unit.gather(LIST_ALERT, timeout=timeout, gap=min(0.5, timeout))
    async with contextlib.aclosing(replies):  # type: ignore[type-var]
        async for reply in replies:
            answer = reply.body
            if isinstance(answer, dict) and answer.get("active"):
                return str(answer.get("uuid")), list(answer.get("schedules") or [])
    return None, []
