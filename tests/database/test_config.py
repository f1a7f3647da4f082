"""Configuration at the edge: malformed URLs, an unreachable server, environment variables,
creating a missing database, and refusing an unmigrated one."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

import pytest
from helpers import (
    connections_named,
    execute,
    fetchval,
    new_dbos,
    other_tasks,
    unique_name,
    wait_no_connections,
    workflow_row,
)

from dbos_async import (
    DBOS,
    ConfigurationError,
    DatabaseUnavailableError,
    DBOSConfig,
    DBOSError,
    MigrationError,
)
from dbos_async.testing import with_database


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("mysql://root@127.0.0.1:3306/app", "scheme 'mysql'"),
        ("http://127.0.0.1:5432/app", "scheme 'http'"),
        ("postgresql://postgres@127.0.0.1:notaport/app", "invalid port"),
        ("postgresql://postgres@127.0.0.1:99999/app", "invalid port"),
        ("postgresql://postgres@127.0.0.1:0/app", "port 0"),
        ("postgresql:///app", "names no host"),
        ("postgresql://postgres@/app", "names no host"),
    ],
)
def test_malformed_url_is_a_configuration_error(url: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        DBOS(system_database_url=url)
    message = str(caught.value)
    assert "system_database_url" in message
    assert problem in message


def test_sqlalchemy_driver_suffix_is_accepted() -> None:
    dbos = DBOS(system_database_url="postgresql+psycopg://u@db.example:5433/app")
    assert dbos.config.system_database_url == "postgresql://u@db.example:5433/app"


def test_bad_setting_names_the_field() -> None:
    with pytest.raises(ConfigurationError, match="pool_size"):
        DBOS(system_database_url="postgresql://u@h/app", pool_size=0)
    with pytest.raises(ConfigurationError, match="no_such_setting"):
        DBOS(system_database_url="postgresql://u@h/app", no_such_setting=1)


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_unreachable_database_fails_on_enter(admin_url: str) -> None:
    port = closed_port()
    dbos = DBOS(system_database_url=f"postgresql://postgres@127.0.0.1:{port}/app",
                connect_timeout=2, db_retry_timeout=0, connection_name=unique_name("unreach"))
    assert other_tasks() == set()
    with pytest.raises(DatabaseUnavailableError) as caught:
        # The bound is a hang guard only; a refused connection fails at once.
        async with asyncio.timeout(30):
            async with dbos:
                pytest.fail("entered DBOS without a database")
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert other_tasks() == set()
    # Nothing of the failed entry is left; the instance can be entered again (and fails
    # the same way while the database is not there).
    with pytest.raises(DBOSError, match="enter it first"):
        await dbos.retrieve_workflow("anything")
    with pytest.raises(DatabaseUnavailableError):
        await dbos.__aenter__()
    assert other_tasks() == set()


async def test_environment_variables_are_read(database_url: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBOS_SYSTEM_DATABASE_URL", database_url)
    monkeypatch.setenv("DBOS__VMID", "vm-from-env")
    monkeypatch.setenv("DBOS__APPVERSION", "version-from-env")
    monkeypatch.setenv("DBOS_SHUTDOWN_GRACE_PERIOD", "2.5")
    name = unique_name("env")
    dbos = DBOS(connection_name=name)
    assert dbos.config.system_database_url == database_url
    assert dbos.config.executor_id == "vm-from-env"
    assert dbos.config.application_version == "version-from-env"
    assert dbos.config.shutdown_grace_period == 2.5

    @dbos.workflow(name="env_wf")
    async def env_wf() -> str:
        return "ok"

    async with dbos:
        handle = await dbos.start_workflow(env_wf)
        assert await handle.get_result() == "ok"
        assert await connections_named(database_url, name) >= 1
    row = await workflow_row(database_url, handle.workflow_id)
    assert row is not None
    assert row["executor_id"] == "vm-from-env"
    assert row["application_version"] == "version-from-env"

    # Arguments given in code win over the environment.
    assert DBOS(executor_id="explicit").config.executor_id == "explicit"
    # A malformed value from the environment is reported with its field.
    monkeypatch.setenv("DBOS_CONNECT_TIMEOUT", "soon")
    with pytest.raises(ConfigurationError, match="connect_timeout"):
        DBOS()


async def test_missing_database_is_created(admin_url: str) -> None:
    name = f"dbos_test_created_{uuid.uuid4().hex}"
    url = with_database(admin_url, name)
    exists = "SELECT count(*) FROM pg_database WHERE datname = $1"
    assert await fetchval(admin_url, exists, name) == 0
    connection_name = unique_name("create")
    try:
        dbos = new_dbos(url, connection_name=connection_name)

        @dbos.workflow(name="in_new_db")
        async def in_new_db() -> int:
            return 1

        async with dbos:
            assert await in_new_db() == 1
        assert await fetchval(admin_url, exists, name) == 1
        assert await fetchval(url, "SELECT count(*) FROM dbos.workflow_status") == 1
        await wait_no_connections(admin_url, connection_name)
    finally:
        await execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert await fetchval(admin_url, exists, name) == 0


async def test_run_migrations_false_on_empty_database(database_url: str) -> None:
    name = unique_name("nomigrate")
    dbos = new_dbos(database_url, run_migrations=False, connection_name=name)
    with pytest.raises(MigrationError, match="does not exist"):
        async with dbos:
            pytest.fail("entered DBOS without a system schema")
    assert other_tasks() == set()
    await wait_no_connections(database_url, name)
    # Nothing was created.
    assert await fetchval(
        database_url, "SELECT count(*) FROM pg_namespace WHERE nspname = 'dbos'"
    ) == 0


# ---- The configuration file ----


def test_settings_from_a_file_below_the_environment_and_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DBOS_CONFIG_FILE", raising=False)
    monkeypatch.delenv("DBOS_SYSTEM_DATABASE_URL", raising=False)
    monkeypatch.delenv("DBOS_SCHEMA_NAME", raising=False)
    monkeypatch.delenv("DBOS_POOL_SIZE", raising=False)
    file = tmp_path / "dbos_async.toml"
    file.write_text('system_database_url = "postgresql://u@file-host/app"\n'
                    'schema_name = "from_file"\npool_size = 3\nsharding = true\n')
    config = DBOSConfig.load(file)
    assert (config.system_database_url, config.schema_name, config.pool_size,
            config.sharding) == ("postgresql://u@file-host/app", "from_file", 3, True)
    monkeypatch.setenv("DBOS_SCHEMA_NAME", "from_env")
    config = DBOSConfig.load(file, pool_size=7)
    assert (config.schema_name, config.pool_size) == ("from_env", 7)
    assert DBOS(config_file=file).config.pool_size == 3
    # DBOS_CONFIG_FILE names it when code does not.
    monkeypatch.setenv("DBOS_CONFIG_FILE", str(file))
    assert DBOS().config.system_database_url == "postgresql://u@file-host/app"


def test_pyproject_table_is_read_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DBOS_CONFIG_FILE", raising=False)
    monkeypatch.delenv("DBOS_SYSTEM_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "app"\n')
    assert DBOSConfig.load().system_database_url is None  # no [tool.dbos_async]: nothing
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\n\n[tool.dbos_async]\n'
        'system_database_url = "postgresql://u@pyproject-host/app"\n')
    assert DBOSConfig.load().system_database_url == "postgresql://u@pyproject-host/app"
    # An explicit pyproject-style file is read from its table too.
    assert DBOSConfig.load(tmp_path / "pyproject.toml").system_database_url == (
        "postgresql://u@pyproject-host/app")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("pool_sise = 3\n", "unknown setting(s) pool_sise"),
        ("pool_size = \n", "not valid TOML"),
        ('[tool]\ndbos_async = "x"\n', "must be a table"),
        ("pool_size = 0\n", "pool_size"),
    ],
)
def test_bad_configuration_file_names_the_problem(tmp_path: Path, content: str,
                                                  problem: str) -> None:
    file = tmp_path / "bad.toml"
    file.write_text(content)
    with pytest.raises(ConfigurationError) as caught:
        DBOSConfig.load(file)
    assert problem in str(caught.value)


def test_missing_configuration_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="Cannot read the configuration file"):
        DBOSConfig.load(tmp_path / "nowhere.toml")
