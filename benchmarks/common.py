"""Helpers shared by the benchmark runners: scratch databases, the load driver, server facts."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MARKER = "BENCH_RESULT "
"""What a child process prints before its result's JSON, on one line."""


def with_database(url: str, database: str) -> str:
    """``url`` pointing at another database on the same server."""
    return urlunsplit(urlsplit(url)._replace(path="/" + database))


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def recreate_database(url: str, name: str) -> str:
    """Drop (forcibly) and create the scratch database ``name``; return its URL."""
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {quote_ident(name)}")
    finally:
        await admin.close()
    return with_database(url, name)


async def drop_database(url: str, name: str) -> None:
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
    finally:
        await admin.close()


async def server_facts(url: str) -> dict[str, str]:
    """Version and the settings that decide what a commit costs."""
    conn = await asyncpg.connect(url)
    try:
        facts = {"version": await conn.fetchval("SELECT version()")}
        for setting in ("server_version", "synchronous_commit", "fsync", "max_connections",
                        "shared_buffers"):
            facts[setting] = await conn.fetchval(f"SHOW {setting}")
        return facts
    finally:
        await conn.close()


def table(rows: list[tuple[str, ...]], align: str) -> list[str]:
    """``rows`` as an indented text table, the first row its header; ``align`` has one
    character per column: ``<`` left, anything else right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.ljust(w) if a == "<" else cell.rjust(w)
                 for cell, w, a in zip(row, widths, align, strict=True)]
        lines.append("  " + "  ".join(cells).rstrip())
        if index == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return lines


async def drive(total: int, concurrency: int, job: Callable[[int], Awaitable[None]]) -> float:
    """Run ``job(0..total-1)`` with at most ``concurrency`` in flight; return elapsed seconds.

    ``concurrency`` workers pull the next index from a shared iterator, which is the same
    bound as a semaphore around each job without creating ``total`` tasks up front.
    """
    indexes = iter(range(total))

    async def worker() -> None:
        for i in indexes:
            await job(i)

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, total)):
            group.create_task(worker())
    return time.perf_counter() - started


# ---- transactions per unit of work, from the server's statistics ----

UNFINISHED_SQL = ("SELECT EXISTS (SELECT 1 FROM dbos.workflow_status "
                  "WHERE queue_name = $1 AND status IN ('ENQUEUED', 'PENDING'))")
"""Whether a queue still holds a workflow to run: an index probe (the in-flight index)
that stops at the first row, so that polling for a drain's end costs the server next to
nothing (a count over the table, every few milliseconds, cost it more than the drain)."""

FLUSH_SQL = "SELECT pg_stat_force_next_flush()"
TRANSACTIONS_SQL = ("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                    "WHERE datname = current_database()")


@dataclass(frozen=True)
class TransactionReading:
    """``xact_commit + xact_rollback`` of one database, read once every connection given
    had published its statistics, and what the reading itself added around it.

    A backend publishes its counts lazily (at most once a second while busy, ten seconds
    after it goes idle, and at exit); ``pg_stat_force_next_flush()`` makes it publish at the
    end of that statement's own transaction, before the statement returns. So a reading
    flushes every connection it is given, then reads on the first: the flushes (one
    transaction each) are in the figure; the reading's own transaction and the pool's reset
    on release are not, and count in the next reading.
    """

    published: int
    flushes: int
    trailing: int


def transactions_between(before: TransactionReading, after: TransactionReading) -> int:
    """Transactions the workload ended between two readings, the readings' own taken off."""
    return after.published - before.published - before.trailing - after.flushes


async def flush_statistics(connections: Sequence[Any]) -> None:
    """Make each connection's backend publish its statistics now (one transaction each;
    idle connections, none in a transaction)."""
    for conn in connections:
        await conn.execute(FLUSH_SQL)


async def read_transactions(connections: Sequence[Any]) -> TransactionReading:
    """Flush every connection's statistics, then read on the first."""
    await flush_statistics(connections)
    published = await connections[0].fetchval(TRANSACTIONS_SQL)
    return TransactionReading(int(published), len(connections), 1)


async def read_pool_transactions(pool: asyncpg.Pool, *,
                                 resets_on_release: bool = False) -> TransactionReading:
    """:func:`read_transactions` on every connection of an idle pool, holding them all so
    none is busy elsewhere. ``resets_on_release``: the pool sends a reset query (one
    transaction) as each goes back, which trails the reading."""
    conns = [await pool.acquire() for _ in range(pool.get_size())]
    try:
        reading = await read_transactions(conns)
    finally:
        for conn in conns:
            await pool.release(conn)
    return TransactionReading(reading.published, reading.flushes,
                              reading.trailing + (len(conns) if resets_on_release else 0))


async def backends_gone(url: str, application_name: str, within: float = 30.0) -> None:
    """Wait until no backend of ``application_name`` is connected to ``url``'s database: a
    backend publishes its statistics as it exits."""
    conn = await asyncpg.connect(url)
    try:
        deadline = time.monotonic() + within
        while await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = $1", application_name):
            if time.monotonic() > deadline:
                raise RuntimeError(f"backends of {application_name} still connected")
            await asyncio.sleep(0.02)
    finally:
        await conn.close()


class CollectorTime:
    """The garbage collector's share of a stretch of time in this process (``with``): its
    collections by generation, and the seconds they took. cProfile does not see them: they
    run inside whatever allocation crossed a threshold."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1

    def __enter__(self) -> CollectorTime:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._observe)

    def per(self, workflows: int) -> str:
        """The figures, per workflow of ``workflows``."""
        young, middle, full = self.collections
        return (f"{self.seconds / workflows * 1e6:.1f} µs per workflow in the garbage "
                f"collector ({young + middle + full} collections, {full} of them full)")
