"""Schedules persisted on the broker: one active scheduler, a standby that takes over, identity by what is
sent, run_count, cron on a controllable clock, and forged schedule messages dropped."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import aio_pika
import orjson
import pytest
from pydantic import ValidationError

from harness import HANG, eventually
from qbroker import Unit
from qbroker.broker_scheduler import (
    BrokerScheduler,
    ScheduleSpec,
    add_schedule,
    list_schedules,
    remove_schedule,
    schedules_queue,
)
from qbroker.testing import ManualClock
from tests.conftest import MakeUnit

pytestmark = pytest.mark.rabbitmq_only  # the scheduler's queue is plain AMQP (single active consumer)


async def _setup(make_unit: MakeUnit) -> tuple[str, asyncio.Queue[int], Unit]:
    """A fresh corner of the vhost (its own schedules queue), a server counting ticks, a started client."""
    prefix = f"sch{uuid.uuid4().hex[:8]}."
    ticks: asyncio.Queue[int] = asyncio.Queue()
    server = await make_unit("test.ticks", exchange_prefix=prefix)

    @server.rpc("test.tick")
    async def tick(n: int) -> None:
        await ticks.put(n)

    client = await make_unit("test.client", exchange_prefix=prefix)
    await server.start()
    await client.start()
    return prefix, ticks, client


async def _scheduler(make_unit: MakeUnit, prefix: str, app: str, **options: Any) -> tuple[Unit, BrokerScheduler]:
    unit = await make_unit(app, exchange_prefix=prefix)
    scheduler = BrokerScheduler(unit, **options)
    await unit.start()
    return unit, scheduler


async def _listed(client: Unit, predicate: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """The active scheduler's answer, once ``predicate(active_uuid, schedules)`` holds."""
    found: list[tuple[str | None, list[dict[str, Any]]]] = []

    async def check() -> bool:
        found.append(await list_schedules(client, timeout=1.0))
        return bool(predicate(*found[-1]))

    await eventually(check, HANG, 0.05)
    return found[-1]


async def test_one_scheduler_is_active_and_a_standby_takes_over_with_the_schedules(
    make_unit: MakeUnit, transport: str
) -> None:
    prefix, ticks, client = await _setup(make_unit)
    first, first_scheduler = await _scheduler(make_unit, prefix, "test.scheduler.a")
    second, second_scheduler = await _scheduler(make_unit, prefix, "test.scheduler.b")
    await eventually(lambda: first_scheduler.active or second_scheduler.active, timeout=HANG)
    active, standby = (first, second_scheduler) if first_scheduler.active else (second, first_scheduler)

    schedule_id = await add_schedule(client, ScheduleSpec(name="test.tick", body={"n": 1}, every=0.05))
    for _ in range(3):
        assert await asyncio.wait_for(ticks.get(), HANG) == 1
    _, before = await _listed(client, lambda uuid_, s: uuid_ == active.uuid and s and s[0]["runs"] >= 2)
    assert [s["id"] for s in before] == [schedule_id]
    assert not standby.active  # exactly one scheduler holds the schedules

    await active.kill()  # dies: its unacked schedule messages go back to the queue, to the standby
    await eventually(lambda: standby.active, timeout=HANG)
    for _ in range(3):
        assert await asyncio.wait_for(ticks.get(), HANG) == 1
    owner, after = await _listed(client, lambda uuid_, s: uuid_ == standby.unit.uuid and s)
    assert owner == standby.unit.uuid
    assert after[0]["runs"] > before[0]["runs"]  # the run count travelled with the schedule

    await standby.unit.kill()  # nobody left: the schedule waits on the broker, not in a process
    third, third_scheduler = await _scheduler(make_unit, prefix, "test.scheduler.c")
    await eventually(lambda: third_scheduler.active, timeout=HANG)
    _, kept = await _listed(client, lambda uuid_, s: uuid_ == third.uuid and s)
    assert [s["id"] for s in kept] == [schedule_id]
    await remove_schedule(client, schedule_id)
    await _listed(client, lambda uuid_, s: uuid_ == third.uuid and not s)


async def test_identity_is_what_is_sent_so_setting_it_again_updates_it(make_unit: MakeUnit, transport: str) -> None:
    prefix, _, client = await _setup(make_unit)
    unit, _ = await _scheduler(make_unit, prefix, "test.scheduler")
    slow = ScheduleSpec(name="test.tick", body={"n": 1}, every=3600, nohaste=True)
    faster = ScheduleSpec(name="test.tick", body={"n": 1}, every=1800, nohaste=True)
    other = ScheduleSpec(name="test.tick", body={"n": 2}, every=3600, nohaste=True)
    assert slow.id == faster.id != other.id
    await add_schedule(client, slow)
    await add_schedule(client, faster)
    await add_schedule(client, other)
    _, listed = await _listed(client, lambda _u, s: len(s) == 2 and {x["every"] for x in s} == {1800, 3600})
    by_id = {s["id"]: s for s in listed}
    assert by_id[slow.id]["every"] == 1800 and by_id[other.id]["body"] == {"n": 2}
    # nohaste: the first send is one interval after the schedule was made, not at once.
    assert by_id[slow.id]["next_due"] >= by_id[slow.id]["created_at"] + 1800 - 1
    assert all(s["runs"] == 0 for s in listed)


async def test_run_count_ends_the_schedule(make_unit: MakeUnit, transport: str) -> None:
    prefix, ticks, client = await _setup(make_unit)
    await _scheduler(make_unit, prefix, "test.scheduler")
    await add_schedule(client, ScheduleSpec(name="test.tick", body={"n": 7}, every=0.02, run_count=3))
    assert [await asyncio.wait_for(ticks.get(), HANG) for _ in range(3)] == [7, 7, 7]
    await _listed(client, lambda uuid_, s: uuid_ is not None and not s)  # gone after its third send
    assert ticks.empty()  # the schedule no longer exists, so no fourth send can ever come


async def test_cron_runs_on_the_minute_and_skips_missed_runs(make_unit: MakeUnit, transport: str) -> None:
    def at(hour: int, minute: int, second: int = 0) -> float:
        return datetime(2026, 1, 1, hour, minute, second, tzinfo=UTC).timestamp()

    prefix, ticks, client = await _setup(make_unit)
    clock = ManualClock(at(12, 0, 30))
    await _scheduler(make_unit, prefix, "test.scheduler", clock=clock)
    await add_schedule(client, ScheduleSpec(name="test.tick", body={"n": 3}, cron="* * * * *"))
    await _listed(client, lambda _u, s: s and s[0]["next_due"] == at(12, 1))

    clock.set(at(12, 1))
    assert await asyncio.wait_for(ticks.get(), HANG) == 3
    await _listed(client, lambda _u, s: s and s[0]["runs"] == 1 and s[0]["next_due"] == at(12, 2))

    clock.set(at(12, 3, 30))  # 12:02 and 12:03 were missed: one send now, not a burst of two
    assert await asyncio.wait_for(ticks.get(), HANG) == 3
    _, listed = await _listed(client, lambda _u, s: s and s[0]["next_due"] == at(12, 4))
    assert listed[0]["runs"] == 2 and listed[0]["last_run"] == at(12, 3, 30)
    assert ticks.empty()


async def test_forged_and_invalid_schedules_are_refused(make_unit: MakeUnit, transport: str) -> None:
    with pytest.raises(ValidationError):
        ScheduleSpec(name="test.#", every=1)
    with pytest.raises(ValidationError):
        ScheduleSpec(name="test.tick", every=1, cron="* * * * *")
    with pytest.raises(ValidationError):
        ScheduleSpec(name="test.tick", cron="every tuesday")

    prefix, ticks, client = await _setup(make_unit)
    _, scheduler = await _scheduler(make_unit, prefix, "test.scheduler")
    await eventually(lambda: scheduler.active, timeout=HANG)
    assert client.connection is not None
    channel = await client.connection.channel()  # a raw AMQP client writing to the queue directly
    forged = [
        b"not json",
        b'{"op": "set"}',
        b'{"op": "set", "created_at": 0, "schedule": {"name": "#", "every": 1}}',
        b'{"op": "drop table"}',
        b"[" * 100_000,
    ]
    for body in forged:
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=schedules_queue(client.config))
    await channel.close()
    await eventually(lambda: scheduler.dropped == len(forged), timeout=HANG)
    # The scheduler dropped each (acked, not held, not requeued) and still works.
    await add_schedule(client, ScheduleSpec(name="test.tick", body={"n": 5}, every=0.05, run_count=1))
    assert await asyncio.wait_for(ticks.get(), HANG) == 5
    await _listed(client, lambda uuid_, s: uuid_ is not None and not s)


async def test_owners_only(make_unit: MakeUnit, transport: str) -> None:
    prefix, ticks, client = await _setup(make_unit)
    _, scheduler = await _scheduler(make_unit, prefix, "test.scheduler", owners={"operator"})
    await eventually(lambda: scheduler.active, timeout=HANG)
    await add_schedule(client, ScheduleSpec(name="test.tick", body={"n": 1}, every=0.05))  # as guest
    await eventually(lambda: scheduler.dropped == 1, timeout=HANG)
    _, listed = await list_schedules(client)
    assert listed == [] and ticks.empty()


async def test_a_removed_schedule_stays_removed(make_unit: MakeUnit, transport: str) -> None:
    """A re-publish in flight when the schedule is removed (it runs every few ms) must not bring it back."""
    prefix, ticks, client = await _setup(make_unit)
    _, scheduler = await _scheduler(make_unit, prefix, "test.scheduler")
    spec = ScheduleSpec(name="test.tick", body={"n": 8}, every=0.01)
    await add_schedule(client, spec)
    assert await asyncio.wait_for(ticks.get(), HANG) == 8
    _, listed = await _listed(client, lambda _u, s: s)
    created_at = listed[0]["created_at"]
    await remove_schedule(client, spec.id)
    await _listed(client, lambda uuid_, s: uuid_ is not None and not s)
    # What a late re-publish looks like: the same schedule, made before the removal. It is dropped.
    stale_before = scheduler.stale
    assert client.connection is not None
    channel = await client.connection.channel()
    stale = {"op": "set", "schedule": spec.model_dump(mode="json"), "runs": 99, "created_at": created_at}
    await channel.default_exchange.publish(
        aio_pika.Message(orjson.dumps(stale)), routing_key=schedules_queue(client.config)
    )
    await channel.close()
    await eventually(lambda: scheduler.stale > stale_before, timeout=HANG)
    _, listed = await list_schedules(client)
    assert listed == []
