"""Throwaway databases on a test server: one per test, created empty and dropped after,
so no test depends on what another left behind."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from dbos_async._database_url import with_database
from dbos_async.testing.servers import run_sync

DATABASE_PREFIX = "dbos_test_"


def new_database_name() -> str:
    """A database name no other test (or pytest-xdist worker) uses."""
    return f"{DATABASE_PREFIX}{uuid.uuid4().hex}"


def quoted_name(name: str) -> str:
    """``name`` as an SQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


async def create_database(admin_url: str, name: str) -> str:
    """Create the empty database ``name`` on the server of ``admin_url``; returns its URL."""
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        for attempt in range(5):
            try:
                await conn.execute(f"CREATE DATABASE {quoted_name(name)} TEMPLATE template0")
                break
            except asyncpg.ObjectInUseError:
                # "source database is being accessed by other users": another test's
                # CREATE DATABASE at the same moment; retry shortly.
                if attempt == 4:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
    finally:
        await conn.close()
    return with_database(admin_url, name)


async def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting whoever is still connected to it."""
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {quoted_name(name)} WITH (FORCE)")
    finally:
        await conn.close()


@contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """The URL of a new, empty database, dropped when the block ends (on a private event
    loop, so it works in sync fixtures next to pytest-asyncio's loop)."""
    name = new_database_name()
    url = run_sync(create_database(admin_url, name))
    try:
        yield url
    finally:
        run_sync(drop_database(admin_url, name))
