"""The plugin's async fixtures (see :mod:`dbos_async.testing.plugin`), run by pytest-asyncio
on the test's event loop: an executor or a client has to live on the loop of the test
that uses it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from dbos_async._executor.dbos import DBOS
from dbos_async._sysdb.setup import migrate
from dbos_async.client import DBOSClient


def _clock_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """``clock=`` the test's ``dbos_clock``, if it uses that fixture."""
    if "dbos_clock" not in request.fixturenames:
        return {}
    return {"clock": request.getfixturevalue("dbos_clock")}


@pytest_asyncio.fixture
async def dbos_executor(request: pytest.FixtureRequest, dbos_app: DBOS, dbos_database_url: str,
                        dbos_settings: dict[str, Any]) -> AsyncIterator[DBOS]:
    """``dbos_app`` entered on the test's database (on ``dbos_clock`` if the test uses it);
    left after the test, with the settings it had before."""
    before = dbos_app.config
    dbos_app.configure(system_database_url=dbos_database_url,
                       **{**_clock_settings(request), **dbos_settings})
    try:
        async with dbos_app:
            yield dbos_app
    finally:
        dbos_app.configure(**before.model_dump())


@pytest_asyncio.fixture
async def dbos_client(request: pytest.FixtureRequest,
                      dbos_database_url: str) -> AsyncIterator[DBOSClient]:
    """A client on the test's database (on ``dbos_clock`` if the test uses it), migrated
    first so that it needs no executor."""
    await migrate(dbos_database_url)
    async with DBOSClient(dbos_database_url, **_clock_settings(request)) as client:
        yield client
