"""A client behind a real PgBouncer in transaction mode, with the settings the README's
"Behind a transaction-mode pooler" gives: ``connect_options={"statement_cache_size": 0}``
and ``use_listen_notify=False``. The executor runs the workflows over a direct connection.

PgBouncer hands each transaction whichever server session is free, so a statement
prepared under a name in one transaction is missing in the next: the client's calls
below, many at once over more client connections than server sessions, fail with
asyncpg's default statement cache and pass without it.

Without /usr/sbin/pgbouncer the tests are skipped, except under CI=true, where they fail
(``make test`` installs Debian's package where apt can)."""

from __future__ import annotations

import asyncio
import os
import pwd
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from helpers import new_dbos

from dbos_async import DBOSClient, Queue

PGBOUNCER = Path("/usr/sbin/pgbouncer")
PATIENCE = 30.0

if not PGBOUNCER.exists():
    reason = f"{PGBOUNCER} is missing: install Debian's pgbouncer package (make test does)"
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"The PgBouncer tests cannot run under CI: {reason}")
    pytest.skip(reason, allow_module_level=True)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
    except OSError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def pooler_url(database_url: str) -> Iterator[str]:
    """A PgBouncer in transaction mode with two server sessions in front of the test
    database; yields the URL a client connects to."""
    with tempfile.TemporaryDirectory(prefix="pgbouncer-") as name:
        yield from _serve(database_url, Path(name))


def _serve(database_url: str, folder: Path) -> Iterator[str]:
    server = urlsplit(database_url)
    database = server.path.lstrip("/")
    user = server.username or "postgres"
    port = free_port()
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{database} = host={server.hostname or '127.0.0.1'} port={server.port or 5432} "
        f"dbname={database} user={user}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 2\nmax_client_conn = 100\n"
        # The session settings every connection of ours sends at start-up.
        "ignore_startup_parameters = statement_timeout,lock_timeout,"
        "idle_in_transaction_session_timeout,idle_session_timeout\n")
    # PgBouncer refuses to run as root; -u switches to an ordinary user.
    as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
    if as_user:
        postgres = pwd.getpwnam("postgres")
        for path in folder.iterdir():
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
        os.chown(folder, postgres.pw_uid, postgres.pw_gid)
    log = folder / "pgbouncer.log"
    with log.open("wb") as output:
        process = subprocess.Popen([str(PGBOUNCER), *as_user, str(ini)],
                                   stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + PATIENCE
        while not listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"pgbouncer did not start: {log.read_text()}")
            time.sleep(0.05)
        yield f"postgresql://{user}@127.0.0.1:{port}/{database}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
async def test_a_client_works_through_pgbouncer_in_transaction_mode(
        database_url: str, pooler_url: str, sharding: bool) -> None:
    dbos = new_dbos(database_url, sharding=sharding)
    dbos.register_queue(Queue("jobs", concurrency=20))

    @dbos.workflow(name="greet")
    async def greet(name: str) -> str:
        reply = await dbos.recv("go", timeout=PATIENCE)
        await dbos.set_event("greeted", name)
        return f"{reply}, {name}"

    keys = ["acme", "globex", "initech"]
    async with dbos, DBOSClient(
            system_database_url=pooler_url, sharding=sharding, pool_size=6,
            use_listen_notify=False, result_poll_interval=0.05,
            connect_options={"statement_cache_size": 0}) as client:
        await client.check_connection()

        async def one(i: int) -> str:
            key = keys[i % len(keys)] if sharding else None
            handle = await client.enqueue("jobs", "greet", f"n{i}", workflow_id=f"g-{i}",
                                          shard_key=key)
            await client.send(f"g-{i}", "hello", "go", shard_key=key)
            event = await client.get_event(f"g-{i}", "greeted", timeout=PATIENCE,
                                           shard_key=key)
            assert event == f"n{i}"
            result: str = await asyncio.wait_for(handle.get_result(), PATIENCE)
            return result

        results = await asyncio.gather(*(one(i) for i in range(24)))
        assert results == [f"hello, n{i}" for i in range(24)]
        listed = await client.list_workflows(name="greet")
        assert sorted(s.workflow_id for s in listed) == sorted(f"g-{i}" for i in range(24))
        assert {s.status for s in listed} == {"SUCCESS"}
