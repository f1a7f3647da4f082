"""Bad input is refused at the API boundary with a dbos_async error naming the argument,
before anything is written: NUL characters, lone surrogates and oversized values in names,
IDs, keys and topics; infinite, NaN and negative durations; values JSON cannot carry into
PostgreSQL; and connection failures name the server and the cause.

Each case calls the public API with the bad value and checks the error and that no table of
the system schema changed.
"""

from __future__ import annotations

import codecs
import math
import secrets
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import fetch, fetchval, new_dbos, unique_name, workflow_row

from dbos_async import (
    DBOS,
    ConfigurationError,
    DatabaseAuthenticationError,
    DatabaseUnavailableError,
    DBOSClient,
    InvalidArgumentError,
    Queue,
    ScheduleError,
    SerializationError,
    SetEnqueueOptions,
    SetShardKey,
    SetWorkflowAttributes,
    SetWorkflowID,
    SetWorkflowTimeout,
)
from dbos_async._validation import MAX_IDENTIFIER_BYTES
from dbos_async.testing.servers import _run_as_user, find_bindir, start_local_cluster

NUL = "ab\x00cd"
SURROGATE = "ab\ud800cd"
ONE_MEGABYTE = "x" * 1_000_000

BAD_STRINGS = [
    pytest.param(NUL, "NUL character", id="nul"),
    pytest.param(SURROGATE, "lone surrogate", id="surrogate"),
    pytest.param(ONE_MEGABYTE, "over the limit", id="1MB"),
]
"""A stored name, ID, key or topic: refused for each of these."""

BAD_LOOKUPS = BAD_STRINGS[:2]
"""A name, ID or key only looked up: no length limit (nothing is stored)."""

TABLES = ("workflow_status", "workflow_input", "workflow_output", "operation_outputs",
          "notifications", "workflow_events", "workflow_events_history", "streams",
          "workflow_schedules", "queues", "application_versions")


async def table_counts(url: str) -> dict[str, int]:
    return {table: int(await fetchval(url, f"SELECT count(*) FROM dbos.{table}"))
            for table in TABLES}


class App:
    """An executor with a workflow per primitive whose key or duration comes as an
    argument, a partitioned queue, and a client."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dbos = dbos = new_dbos(url, application_version="v1")
        self.jobs = dbos.queue("jobs")
        self.parts = dbos.queue("parts", partition_queue=True)

        @dbos.workflow(name="echo")
        async def echo(value: Any) -> Any:
            return value

        # The key comes escaped: a bad one could not be an argument itself.
        @dbos.workflow(name="set_event")
        async def set_event(escaped_key: str) -> None:
            await dbos.set_event(codecs.decode(escaped_key, "unicode_escape"), 1)

        @dbos.workflow(name="write_stream")
        async def write_stream(escaped_key: str) -> None:
            await dbos.write_stream(codecs.decode(escaped_key, "unicode_escape"), 1)

        @dbos.workflow(name="tick")
        async def tick(scheduled_time: datetime, context: Any) -> None:
            del scheduled_time, context

        @dbos.step(name="surrogate_step")
        async def surrogate_step() -> str:
            return "\ud83d"

        @dbos.workflow(name="surrogate")
        async def surrogate() -> str:
            return await surrogate_step()

        @dbos.workflow(name="timed")
        async def timed(primitive: str, seconds: str) -> Any:
            # The duration comes as text: JSON has no infinity or NaN.
            waits: dict[str, Callable[[float], Awaitable[Any]]] = {
                "recv": lambda s: dbos.recv("t", s),
                "sleep": dbos.sleep,
                "get_event": lambda s: dbos.get_event("target", "k", s),
            }
            return await waits[primitive](float(seconds))

        self.echo, self.set_event, self.write_stream = echo, set_event, write_stream
        self.surrogate, self.timed = surrogate, timed

    async def __aenter__(self) -> App:
        await self.dbos.__aenter__()
        self.client = await DBOSClient(system_database_url=self.url).__aenter__()
        # A finished workflow to address, and the rows the entry wrote.
        with SetWorkflowID("target"):
            await self.echo(0)
        self.before = await table_counts(self.url)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(None, None, None)
        await self.dbos.__aexit__(None, None, None)

    async def wrote_nothing(self, but_workflows: bool = False) -> None:
        """No table changed (``but_workflows``: but the rows of workflows that ran)."""
        skipped = {"workflow_status", "workflow_input", "workflow_output"} \
            if but_workflows else set()
        now = await table_counts(self.url)
        assert {t: n for t, n in now.items() if t not in skipped} \
            == {t: n for t, n in self.before.items() if t not in skipped}


@pytest.fixture
async def app(database_url: str) -> Any:
    async with App(database_url) as entered:
        yield entered


# ---- Names, IDs, keys and topics that are stored ----


async def _start_with_id(app: App, bad: str) -> Any:
    with SetWorkflowID(bad):
        return await app.echo(1)


async def _start_workflow_with_id(app: App, bad: str) -> Any:
    with SetWorkflowID(bad):
        return await app.dbos.start_workflow(app.echo, 1)


async def _enqueue_with_id(app: App, bad: str) -> Any:
    with SetEnqueueOptions(workflow_id=bad):
        return await app.jobs.enqueue(app.echo, 1)


STORED: dict[str, tuple[str, Callable[[App, str], Awaitable[Any]]]] = {
    "workflow ID (SetWorkflowID)": ("workflow ID", _start_with_id),
    "workflow ID (start_workflow)": ("workflow ID", _start_workflow_with_id),
    "workflow ID (SetEnqueueOptions)": ("workflow_id", _enqueue_with_id),
    "workflow ID (client)": (
        "workflow_id", lambda app, bad: app.client.enqueue("jobs", "echo", 1, workflow_id=bad)),
    "workflow ID (fork)": (
        "new_workflow_id", lambda app, bad: app.dbos.fork_workflow(
            "target", 0, new_workflow_id=bad)),
    "topic (executor)": ("topic", lambda app, bad: app.dbos.send("target", 1, bad)),
    "topic (client)": ("topic", lambda app, bad: app.client.send("target", 1, bad)),
    "idempotency key": (
        "idempotency key", lambda app, bad: app.dbos.send("target", 1, "t", bad)),
    "event key": ("event key", lambda app, bad: app.set_event(escaped(bad))),
    "stream key": ("stream key", lambda app, bad: app.write_stream(escaped(bad))),
    "queue name (client)": ("queue_name", lambda app, bad: app.client.enqueue(bad, "echo")),
    "workflow name (client)": (
        "workflow_name", lambda app, bad: app.client.enqueue("jobs", bad)),
    "application version (client)": (
        "application_version", lambda app, bad: app.client.enqueue(
            "jobs", "echo", application_version=bad)),
    "deduplication ID": (
        "deduplication_id", lambda app, bad: _enqueue_with(app, deduplication_id=bad)),
    "partition key": (
        "partition_key", lambda app, bad: _enqueue_with(app, partition_key=bad)),
    "deduplication ID (client)": (
        "deduplication_id", lambda app, bad: app.client.enqueue(
            "jobs", "echo", deduplication_id=bad)),
    "partition key (client)": (
        "partition_key", lambda app, bad: app.client.enqueue(
            "parts", "echo", partition_key=bad)),
    "shard key": ("shard key", lambda app, bad: _start_with_key(app, bad)),
    "latest application version": (
        "application version name",
        lambda app, bad: app.client.set_latest_application_version(bad)),
}


def escaped(text: str) -> str:
    return text.encode("unicode_escape", "backslashreplace").decode("ascii")


IN_WORKFLOW = {"event key", "stream key"}


async def _enqueue_with(app: App, **options: Any) -> Any:
    queue = app.parts if "partition_key" in options else app.jobs
    with SetEnqueueOptions(**options):
        return await queue.enqueue(app.echo, 1)


async def _start_with_key(app: App, bad: str) -> Any:
    with SetShardKey(bad):
        return await app.echo(1)


@pytest.mark.parametrize(("bad", "problem"), BAD_STRINGS)
@pytest.mark.parametrize("case", list(STORED))
async def test_a_stored_name_id_key_or_topic_is_refused(app: App, case: str, bad: str,
                                                        problem: str) -> None:
    argument, call = STORED[case]
    with pytest.raises(InvalidArgumentError, match=problem) as caught:
        await call(app, bad)
    assert f"Invalid {argument}" in str(caught.value)
    # A key refused in a workflow body fails that workflow (its own rows), nothing else.
    await app.wrote_nothing(but_workflows=case in IN_WORKFLOW)


async def test_the_longest_values_are_stored(app: App) -> None:
    """At the limit everything is accepted (and the index rows fit)."""
    longest = "é" * (MAX_IDENTIFIER_BYTES // 2)
    with SetWorkflowID(longest):
        assert await app.echo(longest) == longest
    assert await app.client.enqueue("jobs", "echo", 1, workflow_id=longest) is not None
    await app.dbos.send(longest, 1, longest)
    with pytest.raises(InvalidArgumentError, match=f"{MAX_IDENTIFIER_BYTES + 1} bytes"):
        SetWorkflowID(longest + "x")


# ---- Names, IDs and keys that are looked up ----

LOOKUPS: dict[str, Callable[[App, str], Awaitable[Any]]] = {
    "retrieve_workflow": lambda app, bad: app.dbos.retrieve_workflow(bad),
    "get_workflow_status": lambda app, bad: app.client.get_workflow_status(bad),
    "get_event workflow": lambda app, bad: app.dbos.get_event(bad, "k", 0),
    "get_event key": lambda app, bad: app.client.get_event("target", bad, 0),
    "cancel_workflow": lambda app, bad: app.dbos.cancel_workflow(bad),
    "delete_workflow": lambda app, bad: app.client.delete_workflow(bad),
    "send destination": lambda app, bad: app.dbos.send(bad, 1),
    "list_workflows": lambda app, bad: app.dbos.list_workflows(workflow_id_prefix=[bad]),
    "list_workflow_steps": lambda app, bad: app.dbos.list_workflow_steps(bad),
    "get_queue_definition": lambda app, bad: app.client.get_queue_definition(bad),
    "get_schedule": lambda app, bad: app.dbos.get_schedule(bad),
    "read_stream": lambda app, bad: _read_all(app, bad),
}


async def _read_all(app: App, key: str) -> list[Any]:
    return [value async for value in app.dbos.read_stream("target", key)]


@pytest.mark.parametrize(("bad", "problem"), BAD_LOOKUPS)
@pytest.mark.parametrize("case", list(LOOKUPS))
async def test_a_looked_up_name_id_or_key_that_no_row_can_hold_is_refused(
        app: App, case: str, bad: str, problem: str) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        await LOOKUPS[case](app, bad)
    await app.wrote_nothing()


# ---- Declarations refused where they are made ----

DECLARATIONS: dict[str, tuple[type[Exception], Callable[[DBOS, str], Any]]] = {
    "queue": (ConfigurationError, lambda dbos, bad: dbos.queue(bad)),
    "queue object": (ConfigurationError, lambda dbos, bad: Queue(bad)),
    "workflow name": (InvalidArgumentError,
                      lambda dbos, bad: dbos.workflow(name=bad)(_workflow_body)),
    "step name": (InvalidArgumentError,
                  lambda dbos, bad: dbos.step(name=bad)(_workflow_body)),
    "listened queue": (InvalidArgumentError, lambda dbos, bad: dbos.listen(bad)),
    "executor ID": (ConfigurationError, lambda dbos, bad: dbos.configure(executor_id=bad)),
    "application version": (
        ConfigurationError, lambda dbos, bad: dbos.configure(application_version=bad)),
    "application name": (
        ConfigurationError, lambda dbos, bad: dbos.configure(application_name=bad)),
    "SetShardKey": (InvalidArgumentError, lambda dbos, bad: SetShardKey(bad)),
    "SetEnqueueOptions deduplication_id": (
        InvalidArgumentError, lambda dbos, bad: SetEnqueueOptions(deduplication_id=bad)),
    "SetEnqueueOptions partition_key": (
        InvalidArgumentError, lambda dbos, bad: SetEnqueueOptions(partition_key=bad)),
    "register_instance": (
        InvalidArgumentError, lambda dbos, bad: dbos.register_instance(object(), bad)),
}


async def _workflow_body() -> None:
    pass


@pytest.mark.parametrize(("bad", "problem"), BAD_STRINGS)
@pytest.mark.parametrize("case", list(DECLARATIONS))
def test_a_bad_name_is_refused_where_it_is_declared(case: str, bad: str,
                                                    problem: str) -> None:
    """Before, a queue named with a NUL was accepted here and entering failed; a workflow
    named with a lone surrogate failed entering with a UnicodeEncodeError."""
    error_type, declare = DECLARATIONS[case]
    dbos = DBOS(system_database_url="postgresql://postgres@127.0.0.1:1/never")
    with pytest.raises(error_type, match=problem):
        declare(dbos, bad)


@pytest.mark.parametrize(("bad", "problem"), BAD_STRINGS)
async def test_a_bad_schedule_name_is_refused_and_nothing_is_stored(
        app: App, bad: str, problem: str) -> None:
    with pytest.raises(ScheduleError, match=problem):
        await app.dbos.create_schedule(bad, "tick", "* * * * *")
    with pytest.raises(ScheduleError, match=problem):
        await app.client.create_schedule("fine", bad, "* * * * *")
    await app.wrote_nothing()


async def test_a_queue_with_a_bad_name_never_reaches_the_database(database_url: str) -> None:
    """It used to be accepted at declaration, then entering failed in the driver."""
    dbos = new_dbos(database_url)
    with pytest.raises(ConfigurationError, match="NUL character"):
        dbos.queue("jobs\x00")
    async with dbos:
        pass
    assert await fetch(database_url, "SELECT name FROM dbos.queues") == []


# ---- Values that cannot be serialized ----


async def assert_failed_with(url: str, name: str, error_name: str) -> None:
    """The one workflow named ``name`` recorded an error of type ``error_name``."""
    [workflow_id] = [r["workflow_uuid"] for r in await fetch(
        url, "SELECT workflow_uuid FROM dbos.workflow_status WHERE name = $1", name)]
    row = await workflow_row(url, workflow_id)
    assert row is not None and row["status"] == "ERROR"
    assert error_name in row["stored_error"]

UNSERIALIZABLE = [
    pytest.param("a\udc80b", "lone surrogate", id="surrogate"),
    pytest.param({"key\ud800": 1}, "surrogate", id="surrogate-key"),
    pytest.param([1.5, math.nan], "Out of range float", id="nan"),
    pytest.param(math.inf, "Out of range float", id="inf"),
]


@pytest.mark.parametrize(("value", "problem"), UNSERIALIZABLE)
async def test_a_value_that_cannot_be_serialized_raises_serialization_error(
        app: App, value: Any, problem: str) -> None:
    """An argument with a lone surrogate used to reach the driver (a DataError)."""
    with pytest.raises(SerializationError, match=problem):
        await app.echo(value)
    with pytest.raises(SerializationError, match=problem):
        await app.client.enqueue("jobs", "echo", value)
    with pytest.raises(SerializationError, match=problem):
        await app.dbos.send("target", value)
    with pytest.raises(SerializationError, match=problem):
        await app.client.send("target", value)
    await app.wrote_nothing()


async def test_a_result_that_cannot_be_serialized_is_the_workflows_error(app: App) -> None:
    with pytest.raises(SerializationError, match="lone surrogate"):
        await app.surrogate()
    await assert_failed_with(app.url, "surrogate", "SerializationError")
    assert await fetchval(app.url, "SELECT count(*) FROM dbos.operation_outputs "
                                   "WHERE function_name = 'surrogate_step'") == 0


async def test_nul_characters_in_values_round_trip(app: App) -> None:
    """JSON escapes a NUL inside a string, so values (unlike names) may hold one."""
    value = {"a\x00b": ["\x00", "tab\there"]}
    assert await app.echo(value) == value


async def test_attributes_jsonb_cannot_hold_are_refused(app: App) -> None:
    for bad in ({"k": "a\x00"}, {"k\ud800": 1}):
        with pytest.raises(InvalidArgumentError, match="workflow attributes"):
            SetWorkflowAttributes(bad)
        with pytest.raises(InvalidArgumentError, match="workflow attributes"):
            await app.client.enqueue("jobs", "echo", attributes=bad)
    await app.wrote_nothing()


# ---- Durations ----

BAD_SECONDS = [
    pytest.param(math.inf, "is infinite", id="inf"),
    pytest.param(math.nan, "is NaN", id="nan"),
    pytest.param(-1.0, "must be (zero or more|positive)", id="negative"),
    pytest.param(1e300, "at most", id="huge"),
]


DURATIONS: dict[str, tuple[str, Callable[[App, float], Awaitable[Any]]]] = {
    "get_event": ("get_event timeout",
                  lambda app, s: app.dbos.get_event("target", "k", s)),
    "get_event (client)": ("get_event timeout",
                           lambda app, s: app.client.get_event("target", "k", s)),
    "sleep": ("sleep duration", lambda app, s: app.dbos.sleep(s)),
    "read_stream": ("read_stream timeout", lambda app, s: _read_with_timeout(app, s)),
    "SetWorkflowTimeout": ("workflow timeout given to SetWorkflowTimeout",
                           lambda app, s: _start_with_timeout(app, s)),
    "enqueue delay": ("delay", lambda app, s: _enqueue_with(app, delay=s)),
    "enqueue timeout (client)": (
        "timeout", lambda app, s: app.client.enqueue("jobs", "echo", timeout=s)),
    "fork timeout": ("workflow_timeout", lambda app, s: app.dbos.fork_workflow(
        "target", 0, workflow_timeout=s)),
    "set_workflow_delay": ("delay", lambda app, s: app.client.set_workflow_delay(
        "target", delay_seconds=s)),
}


async def _read_with_timeout(app: App, seconds: float) -> list[Any]:
    return [v async for v in app.dbos.read_stream("target", "k", timeout=seconds)]


async def _start_with_timeout(app: App, seconds: float) -> Any:
    with SetWorkflowTimeout(seconds):
        return await app.echo(1)


@pytest.mark.parametrize(("seconds", "problem"), BAD_SECONDS)
@pytest.mark.parametrize("case", list(DURATIONS))
async def test_a_duration_that_is_not_finite_and_non_negative_is_refused(
        app: App, case: str, seconds: float, problem: str) -> None:
    """An infinite timeout used to raise OverflowError; NaN slept or waited 0 s."""
    argument, call = DURATIONS[case]
    with pytest.raises(InvalidArgumentError, match=problem) as caught:
        await call(app, seconds)
    assert caught.value.argument == argument
    await app.wrote_nothing()


@pytest.mark.parametrize(("seconds", "problem"), BAD_SECONDS)
@pytest.mark.parametrize("primitive", ["recv", "sleep", "get_event"])
async def test_a_bad_duration_in_a_workflow_fails_it_with_the_error_and_no_checkpoint(
        app: App, primitive: str, seconds: float, problem: str) -> None:
    """Inside a workflow an infinite timeout used to record an OverflowError, and NaN
    returned at once."""
    with pytest.raises(InvalidArgumentError, match=problem):
        await app.timed(primitive, repr(seconds))
    await assert_failed_with(app.url, "timed", "InvalidArgumentError")
    await app.wrote_nothing(but_workflows=True)


def test_step_and_queue_durations_are_checked_where_declared() -> None:
    dbos = DBOS(system_database_url="postgresql://postgres@127.0.0.1:1/never")
    for seconds in (math.inf, math.nan, -1.0):
        with pytest.raises(InvalidArgumentError, match="retry_interval"):
            dbos.step(retry_interval=seconds)(_workflow_body)
        with pytest.raises(InvalidArgumentError, match="timeout of step"):
            dbos.step(timeout=seconds)(_workflow_body)
        with pytest.raises(ConfigurationError, match="polling_interval"):
            Queue("q", polling_interval=seconds)
        with pytest.raises(ConfigurationError, match="connect_timeout"):
            dbos.configure(connect_timeout=seconds)


# ---- Connection failures ----


async def test_an_unknown_user_is_an_authentication_error_naming_the_server(
        database_url: str) -> None:
    user = unique_name("nobody")
    url = database_url.replace("postgres@", f"{user}@", 1)
    host_port = url.split("@", 1)[1].split("/", 1)[0]
    database = url.rsplit("/", 1)[1]
    for entering in (new_dbos(url, db_retry_timeout=0), DBOSClient(system_database_url=url)):
        with pytest.raises(DatabaseAuthenticationError) as caught:
            await entering.__aenter__()
        message = str(caught.value)
        assert host_port in message
        assert repr(database) in message
        assert repr(user) in message
        assert "InvalidAuthorizationSpecificationError" in message
        assert isinstance(caught.value, ConfigurationError)
        assert isinstance(caught.value, DatabaseUnavailableError)
        assert isinstance(caught.value.__cause__, asyncpg.PostgresError)


async def test_an_unknown_database_without_migrations_names_the_server(
        database_url: str) -> None:
    url = database_url.rsplit("/", 1)[0] + "/" + unique_name("missing")
    with pytest.raises(DatabaseUnavailableError, match="does not exist"):
        await DBOSClient(system_database_url=url).__aenter__()


@pytest.fixture(scope="module")
def password_server() -> Any:
    """A throwaway cluster that asks every user but postgres for a password."""
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl) on this machine")
    user = _run_as_user()
    conf_dir = Path(tempfile.mkdtemp(prefix="dbos-hba-", dir="/tmp"))
    conf_dir.chmod(0o755)
    hba = conf_dir / "pg_hba.conf"
    hba.write_text("host all postgres 127.0.0.1/32 trust\n"
                   "host all all 127.0.0.1/32 scram-sha-256\n")
    hba.chmod(0o644)
    server = start_local_cluster(bindir, user, [f"hba_file={hba}"])
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(conf_dir, ignore_errors=True)


async def test_a_wrong_password_is_an_authentication_error_naming_the_server(
        password_server: Any) -> None:
    admin = await asyncpg.connect(password_server.url)
    try:
        await admin.execute("CREATE ROLE app LOGIN PASSWORD 'right'")
        await admin.execute("CREATE DATABASE app_sys OWNER app")
    finally:
        await admin.close()
    base = password_server.url.rsplit("@", 1)[1].rsplit("/", 1)[0]
    wrong = f"postgresql://app:{secrets.token_hex(4)}@{base}/app_sys"
    for entering in (new_dbos(wrong, db_retry_timeout=0),
                     DBOSClient(system_database_url=wrong)):
        with pytest.raises(DatabaseAuthenticationError) as caught:
            await entering.__aenter__()
        message = str(caught.value)
        assert base in message and "'app_sys'" in message and "'app'" in message
        assert "InvalidPasswordError" in message
        assert wrong.split(":")[2].split("@")[0] not in message  # never the password
    async with new_dbos(f"postgresql://app:right@{base}/app_sys") as dbos:
        assert dbos.executor_id is not None


async def test_a_refused_connection_names_host_port_and_database() -> None:
    with pytest.raises(DatabaseUnavailableError) as caught:
        await DBOSClient(system_database_url="postgresql://postgres@127.0.0.1:1/sysdb",
                         connect_timeout=2).__aenter__()
    assert "'sysdb' at 127.0.0.1:1" in str(caught.value)
    assert not isinstance(caught.value, DatabaseAuthenticationError)


def test_the_limits_are_documented() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    assert f"{MAX_IDENTIFIER_BYTES} bytes" in (docs / "guides" / "workflows.md").read_text()
    errors = (docs / "reference" / "errors.md").read_text()
    assert "InvalidArgumentError" in errors and "DatabaseAuthenticationError" in errors



async def test_values_at_the_limit_fit_every_index_of_the_sharded_schema(
        plain_database_url: str) -> None:
    """The widest index rows: a queue-partition row whose shard key, queue, partition key,
    application and (derived, cross-key, so longer) workflow ID are all as long as allowed,
    in characters that do not compress."""

    def longest() -> str:
        return secrets.token_hex(MAX_IDENTIFIER_BYTES // 2)

    url = plain_database_url
    key, other_key, queue_name = longest(), longest(), longest()
    dbos = new_dbos(url, sharding=True, application_name=longest(),
                    application_version=longest(), executor_id=longest())
    parts = dbos.queue(queue_name, partition_queue=True)
    partition, dedup, event_key, stream_key, topic = (longest() for _ in range(5))

    @dbos.workflow(name=longest())
    async def child() -> str:
        await dbos.set_event(event_key, 1)
        await dbos.write_stream(stream_key, 1)
        return "done"

    @dbos.workflow(name=longest())
    async def parent() -> list[Any]:
        # Children under another key: their derived IDs carry this workflow's key and ID.
        with SetShardKey(other_key):
            started = await dbos.start_workflow(child)
        with SetShardKey(other_key), SetEnqueueOptions(partition_key=partition,
                                                       deduplication_id=dedup):
            enqueued = await parts.enqueue(child)
        message = await dbos.recv(topic, 30)
        return [await started.get_result(), await enqueued.get_result(), message,
                len(enqueued.workflow_id.encode())]

    async with dbos:
        parent_id = longest()
        with SetShardKey(key), SetWorkflowID(parent_id):
            handle = await dbos.start_workflow(parent)
        await dbos.send(parent_id, "hello", topic, longest(), shard_key=key)
        result = await handle.get_result()
        assert result[:3] == ["done", "done", "hello"]
        assert result[3] > 2 * MAX_IDENTIFIER_BYTES
        assert await dbos.get_event(f"{len(key)}:{key}:{parent_id}-1", event_key, 0,
                                    shard_key=other_key) == 1
    rows = await fetch(url, "SELECT queue_partition_key FROM dbos.workflow_status "
                            "WHERE queue_partition_key IS NOT NULL")
    assert [r["queue_partition_key"] for r in rows] == [partition]
