"""Helpers shared by the benchmark runners: scratch databases, the load driver, server facts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

import asyncpg

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


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
