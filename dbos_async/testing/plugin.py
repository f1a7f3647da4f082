"""The pytest plugin (entry point ``pytest11``; install the ``testing`` extra).

Fixtures, all named ``dbos_*`` so they do not shadow a suite's own:

- ``dbos_postgres`` (session): the PostgreSQL server the tests use, found by
  :func:`dbos_async.testing.find_server`; without one the tests that need it are skipped
  with a message saying how to provide one (they fail under ``CI=true``);
- ``dbos_database_url``: the URL of a new, empty database, dropped after the test;
- ``dbos_app``: the application's :class:`~dbos_async.DBOS`, named by the ini option
  ``dbos_app = "package.module:attribute"`` (a DBOS, or a function returning one), or given
  by a fixture of that name in the suite's ``conftest.py``;
- ``dbos_settings``: extra settings for that DBOS during a test (``{}``; override it);
- ``dbos_executor`` (async): ``dbos_app`` configured on ``dbos_database_url`` and entered;
  left after the test, its settings restored;
- ``dbos_client`` (async): a :class:`~dbos_async.DBOSClient` on ``dbos_database_url``;
- ``dbos_crash``: a :class:`~dbos_async.testing.CrashSimulator` on ``dbos_executor``;
- ``dbos_clock``: a :class:`~dbos_async.testing.TestClock`; a test that uses it runs
  ``dbos_executor`` and ``dbos_client`` on it.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dbos_async._executor.dbos import DBOS
from dbos_async.testing.clock import TestClock
from dbos_async.testing.crash import CrashSimulator
from dbos_async.testing.databases import fresh_database
from dbos_async.testing.servers import HOW_TO_PROVIDE, NoServerError, PgServer, find_server

logger = logging.getLogger("dbos_async.testing")

APP_OPTION = "dbos_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare the ``dbos_app`` ini option."""
    parser.addini(APP_OPTION, "The application's DBOS for the dbos_executor fixture: "
                  "'package.module:attribute', a DBOS or a function returning one",
                  type="string", default="")


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def dbos_postgres() -> Iterator[PgServer]:
    """The PostgreSQL server of this test session (of this worker, under pytest-xdist)."""
    started = time.monotonic()
    try:
        server = find_server()
    except NoServerError as error:
        message = f"no PostgreSQL server for the tests ({error}). {HOW_TO_PROVIDE}"
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    logger.info("PostgreSQL for tests: %s: %s (ready in %.2fs)", server.branch,
                server.description, time.monotonic() - started)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def dbos_database_url(dbos_postgres: PgServer) -> Iterator[str]:
    """URL of a new, empty database on the test server, dropped after the test."""
    with fresh_database(dbos_postgres.url) as url:
        yield url


def load_app(spec: str) -> DBOS:
    """The DBOS that ``package.module:attribute`` names: the attribute itself, or what it
    returns when it is a function (an application factory)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise pytest.UsageError(f"{APP_OPTION} = {spec!r}: expected 'package.module:attribute'")
    try:
        found: Any = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise pytest.UsageError(f"{APP_OPTION} = {spec!r}: {error}") from error
    if callable(found) and not isinstance(found, DBOS):
        found = found()
    if not isinstance(found, DBOS):
        raise pytest.UsageError(f"{APP_OPTION} = {spec!r} is a {type(found).__name__}, "
                                "not a DBOS (or a function returning one)")
    return found


@pytest.fixture
def dbos_app(request: pytest.FixtureRequest) -> DBOS:
    """The application's DBOS (not entered): from the ``dbos_app`` ini option, unless the
    suite defines this fixture itself."""
    spec = str(request.config.getini(APP_OPTION)).strip()
    if not spec:
        pytest.fail(f"dbos_executor needs the application's DBOS: set `{APP_OPTION} = "
                    "\"package.module:attribute\"` in the pytest configuration, or define a "
                    f"`{APP_OPTION}` fixture returning it", pytrace=False)
    return load_app(spec)


@pytest.fixture
def dbos_settings() -> dict[str, Any]:
    """Settings ``dbos_executor`` gives the DBOS besides its database (override to add
    some, e.g. ``{"shutdown_grace_period": 0}``)."""
    return {}


@pytest.fixture
def dbos_clock() -> TestClock:
    """A clock the test moves (``await dbos_clock.advance(hours=1)``); ``dbos_executor`` and
    ``dbos_client`` run on it when the test uses it."""
    return TestClock()


@pytest.fixture
def dbos_crash(dbos_executor: DBOS) -> CrashSimulator:
    """Crash ``dbos_executor`` in the middle of a workflow and recover it (see
    :class:`~dbos_async.testing.CrashSimulator`)."""
    return CrashSimulator(dbos_executor)


class _NeedsPytestAsyncio:
    """Stands in for the async fixtures when pytest-asyncio is not installed, so that
    using one says what is missing."""

    MESSAGE = "needs pytest-asyncio: pip install 'dbos_async[testing]'"

    @pytest.fixture
    def dbos_executor(self) -> None:
        pytest.fail(f"dbos_executor {self.MESSAGE}", pytrace=False)

    @pytest.fixture
    def dbos_client(self) -> None:
        pytest.fail(f"dbos_client {self.MESSAGE}", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    """Load the async fixtures where pytest-asyncio is installed, else stand-ins that say
    what is missing."""
    try:
        from dbos_async.testing import async_fixtures
    except ImportError:  # no pytest-asyncio
        config.pluginmanager.register(_NeedsPytestAsyncio(), "dbos_async.testing.no_asyncio")
    else:
        config.pluginmanager.register(async_fixtures, "dbos_async.testing.async_fixtures")
