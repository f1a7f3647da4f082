"""What the storm and restart tests share: a connection killer, a recorder of how calls
ended, and the workflows the calls drive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg
import pytest

from dbos_async import DBOS, DBOSError

T = TypeVar("T")

STORM_INTERVAL = 0.1
TERMINAL = ("SUCCESS", "ERROR", "CANCELLED")

KILL_ALL_BACKENDS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


@contextlib.asynccontextmanager
async def connection_storm(url: str, figures: Counter[str]) -> AsyncIterator[None]:
    """While inside, terminate every backend of the database but the killer's own, every
    ``STORM_INTERVAL`` seconds (the first time at once)."""

    async def kill_loop(conn: asyncpg.Connection) -> None:
        while True:
            figures["storm_kills"] += int(await conn.fetchval(KILL_ALL_BACKENDS))
            await asyncio.sleep(STORM_INTERVAL)

    conn = await asyncpg.connect(url, timeout=10)
    killer = asyncio.create_task(kill_loop(conn))
    try:
        await asyncio.sleep(0)  # the first round starts before the body's first call
        yield
    finally:
        killer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await killer
        await conn.close()


@dataclass
class Calls:
    """How the calls made under faults ended: returned, raised a dbos_async error (a
    :class:`DBOSError`, documented in the README's error table), or raised anything else:
    a raw driver or OS error reaching the caller, which must never happen."""

    figures: Counter[str]
    raw: list[str] = field(default_factory=list)
    documented: list[str] = field(default_factory=list)

    async def __call__(self, what: str, call: Awaitable[T]) -> T | None:
        """``await call``; ``None`` if it raised (the error is recorded, not raised)."""
        self.figures["calls_under_faults"] += 1
        try:
            return await call
        except DBOSError as e:
            self.figures["documented_errors"] += 1
            self.documented.append(f"{what}: {type(e).__name__}: {e}")
        except Exception as e:
            self.figures["raw_driver_errors"] += 1
            self.raw.append(f"{what}: {type(e).__module__}.{type(e).__name__}: {e}")
        return None


async def unfinished_workflows(url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return await conn.fetch(
            "SELECT workflow_uuid, status, executor_id FROM dbos.workflow_status "
            "WHERE status <> ALL($1::text[]) ORDER BY workflow_uuid", list(TERMINAL))
    finally:
        await conn.close()




def failed_tasks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Background tasks of the executor that died (their owner logs each failure; a
    supervised task that is restarted logs "Background task ... restarting" instead)."""
    return [r.getMessage() for r in caplog.records
            if r.name == "dbos_async" and r.levelno >= logging.ERROR
            and r.getMessage().startswith("Task ")]


@dataclass
class App:
    """The workflows the fault tests drive, registered on one DBOS."""

    steps: Any
    receiver: Any
    publisher: Any
    streamer: Any
    blocker: Any
    sleeper: Any
    relay: Any
    event_waiter: Any


def register(dbos: DBOS) -> App:
    @dbos.step(name="chaos_add")
    async def add(i: int) -> int:
        await asyncio.sleep(0.01)
        return i

    @dbos.workflow(name="chaos_steps")
    async def steps(n: int) -> int:
        return sum([await add(i) for i in range(n)])

    @dbos.workflow(name="chaos_receiver")
    async def receiver(n: int, wait: float) -> list[Any]:
        return [await dbos.recv("chaos", timeout=wait) for _ in range(n)]

    @dbos.workflow(name="chaos_publisher")
    async def publisher(n: int) -> int:
        for i in range(n):
            await dbos.set_event(f"key-{i}", i)
            await add(i)
        return n

    @dbos.workflow(name="chaos_streamer")
    async def streamer(n: int) -> int:
        for i in range(n):
            await dbos.write_stream("values", i)
        await dbos.close_stream("values")
        return n

    @dbos.workflow(name="chaos_blocker")
    async def blocker(wait: float) -> Any:
        await add(1)
        return await dbos.recv("unblock", timeout=wait)

    @dbos.workflow(name="chaos_sleeper")
    async def sleeper(seconds: float) -> float:
        await add(1)
        await dbos.sleep(seconds)
        return seconds

    @dbos.workflow(name="chaos_relay")
    async def relay(wait: float) -> Any:
        """Publishes, as event ``relayed``, the first message it receives."""
        await add(1)
        message = await dbos.recv("chaos", timeout=wait)
        await dbos.set_event("relayed", message)
        return message

    @dbos.workflow(name="chaos_event_waiter")
    async def event_waiter(workflow_id: str, wait: float) -> Any:
        await add(1)
        return await dbos.get_event(workflow_id, "relayed", timeout=wait)

    return App(steps, receiver, publisher, streamer, blocker, sleeper, relay, event_waiter)
