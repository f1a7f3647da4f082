"""Tests of the test-server finder (dbos_async/testing/servers.py, and the fixtures of the
pytest plugin and conftest.py built on it).

The branches that start servers run in subprocesses: a small pytest run that loads our
plugin and conftest, with ``DBOS_TEST_SKIP_BRANCHES`` forcing the branch, so the session
under test (and this one) are not disturbed. Each run connects to a fresh database, runs
``SELECT 1`` and a LISTEN/NOTIFY round trip, and afterwards we check that the server's
directory is gone and no process of it is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import processes_mentioning

from dbos_async import ConfigurationError
from dbos_async._sysdb.embedded import pid_alive
from dbos_async.testing import servers as pg_server
from dbos_async.testing import with_database

TESTS_DIR = Path(__file__).resolve().parents[1]

INNER_TEST = textwrap.dedent(
    """
    import asyncio
    import json
    import os
    from pathlib import Path

    import asyncpg


    def test_roundtrip(pg_server_info, database_url, make_database_url):
        async def main():
            conn = await asyncpg.connect(database_url, timeout=10)
            listener = await asyncpg.connect(database_url, timeout=10)
            try:
                assert await conn.fetchval("SELECT 1") == 1
                got = asyncio.get_running_loop().create_future()

                def on_notify(connection, pid, channel, payload):
                    if not got.done():
                        got.set_result((channel, payload))

                await listener.add_listener("dbos_test_chan", on_notify)
                await conn.execute("SELECT pg_notify('dbos_test_chan', 'hello')")
                assert await asyncio.wait_for(got, 10) == ("dbos_test_chan", "hello")
                return await conn.fetchval("SELECT current_database()")
            finally:
                await listener.close()
                await conn.close()

        database = asyncio.run(main())
        assert database.startswith("dbos_test_")
        assert make_database_url(database) == database_url
        Path(os.environ["DBOS_TEST_RESULT"]).write_text(json.dumps({
            "branch": pg_server_info.branch,
            "base_dir": str(pg_server_info.base_dir) if pg_server_info.base_dir else None,
            "pid": pg_server_info.pid,
        }))
    """
)


Result = tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]


def run_inner(tmp_path: Path, skip: str, *, ci: bool = True) -> Result:
    # Our own ini keeps the repo's config out; no plugin autoload keeps the run short.
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    result = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "DBOS_TEST_"))}  # fmt: skip
    env.update(
        DBOS_TEST_SKIP_BRANCHES=skip,
        DBOS_TEST_RESULT=str(result),
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        PYTHONPATH=os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    if ci:
        env["CI"] = "true"
    else:
        env.pop("CI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "dbos_async.testing.plugin", "-p",
         "conftest", "-p", "no:cacheprovider", "-p", "no:xdist", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    data = json.loads(result.read_text()) if result.exists() else None
    return proc, data


def assert_gone(data: dict[str, Any]) -> None:
    assert data["base_dir"] and data["pid"]
    assert not Path(data["base_dir"]).exists(), "the server's directory was not removed"
    assert not pid_alive(data["pid"]), "the postmaster is still running"
    assert processes_mentioning(data["base_dir"]) == [], "server processes left"


def test_local_binaries_branch(tmp_path: Path) -> None:
    try:
        pg_server._check_local()
    except pg_server.Unavailable as e:
        pytest.skip(f"local branch unavailable here: {e}")
    proc, data = run_inner(tmp_path, "env,localhost,docker")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PostgreSQL for tests: local (" in proc.stdout  # the header names the branch
    assert data is not None and data["branch"] == "local"
    assert_gone(data)


def test_embedded_branch(tmp_path: Path) -> None:
    try:
        pg_server._check_embedded()
    except pg_server.Unavailable as e:
        pytest.skip(f"embedded branch unavailable here: {e}")
    proc, data = run_inner(tmp_path, "env,localhost,docker,local")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PostgreSQL for tests: embedded (" in proc.stdout
    assert data is not None and data["branch"] == "embedded"
    assert_gone(data)


def test_no_server_fails_under_ci(tmp_path: Path) -> None:
    proc, data = run_inner(tmp_path, ",".join(pg_server.BRANCHES), ci=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no PostgreSQL server for the tests" in proc.stdout
    assert "DBOS_TEST_DATABASE_URL" in proc.stdout  # says how to provide one
    assert data is None


def test_no_server_skips_outside_ci(tmp_path: Path) -> None:
    proc, data = run_inner(tmp_path, ",".join(pg_server.BRANCHES), ci=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout
    assert "DBOS_TEST_DATABASE_URL" in proc.stdout
    assert data is None


def test_env_branch_is_used_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBOS_TEST_DATABASE_URL", "postgresql://u:secret@db.invalid:1/x")
    monkeypatch.delenv("DBOS_TEST_SKIP_BRANCHES", raising=False)
    server = pg_server.find_server()
    assert (server.branch, server.url) == ("env", "postgresql://u:secret@db.invalid:1/x")
    assert "secret" not in server.description


def test_skip_branches_rejects_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBOS_TEST_SKIP_BRANCHES", "localhost,dockr")
    with pytest.raises(ConfigurationError, match="dockr"):
        pg_server.skipped_branches()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://postgres@127.0.0.1:5432/postgres",
         "postgresql://postgres@127.0.0.1:5432/other"),
        ("postgresql://postgres:@/postgres?host=/tmp/x/data",
         "postgresql://postgres:@/other?host=/tmp/x/data"),
        ("postgresql://u:p@h:1/db?sslmode=disable", "postgresql://u:p@h:1/other?sslmode=disable"),
    ],
)  # fmt: skip
def test_url_with_database(url: str, expected: str) -> None:
    assert with_database(url, "other") == expected


async def test_database_url_is_a_fresh_database(database_url: str, admin_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        name = await conn.fetchval("SELECT current_database()")
        assert name != "postgres" and name.startswith("dbos_test_")
        assert (
            await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
        )
    finally:
        await conn.close()


async def test_create_database(create_database: Any, database_url: str) -> None:
    import asyncpg

    other = await create_database()
    assert other != database_url
    conn = await asyncpg.connect(other)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()
