"""Test fixtures: a real PostgreSQL server, and a fresh database per test.

Minimal version: DBOS_TEST_DATABASE_URL or a trusting server on 127.0.0.1:5432.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def _find_server() -> str:
    url = os.environ.get("DBOS_TEST_DATABASE_URL")
    if url:
        return url
    return "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(scope="session")
def admin_url() -> str:
    """URL of a database on the test server with rights to create databases."""
    return _find_server()


async def _admin(admin_url: str, sql: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
def database_url(admin_url: str) -> Iterator[str]:
    """URL of a new, empty database, dropped after the test."""
    name = f"dbos_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(admin_url, f'CREATE DATABASE "{name}"'))
    try:
        yield _with_database(admin_url, name)
    finally:
        asyncio.run(_admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
