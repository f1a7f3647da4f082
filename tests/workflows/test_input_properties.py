"""Property-based tests of the API boundary (hypothesis), on a real executor and PostgreSQL.

For arbitrary strings given as a workflow ID, topic, event key, stream key, queue name,
workflow name, deduplication ID, partition key, application version, schedule name or (on
the sharded schema) shard key, and arbitrary JSON-like values given as arguments, results,
events and messages: either the value comes back exactly (read back from the database), or
the call raises the documented error and no table of the system schema changed.

Each test enters one executor (and one client) and reuses it for every example. The number of
examples is short by default; ``DBOS_PROPERTY_EXAMPLES=2000`` (or running the ``chaos``-marked
variants with ``-m chaos``) runs a longer search.
"""

from __future__ import annotations

import asyncio
import codecs
import math
import os
from collections.abc import Callable, Coroutine, Iterator
from datetime import datetime
from typing import Any

import pytest
from helpers import fetchval, new_dbos
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbos_async import (
    DBOS,
    ConfigurationError,
    DBOSClient,
    InvalidArgumentError,
    ScheduleError,
    SerializationError,
    SetShardKey,
    SetWorkflowID,
)
from dbos_async._validation import MAX_IDENTIFIER_BYTES

SHORT_RUN = int(os.environ.get("DBOS_PROPERTY_EXAMPLES", "60"))
LONG_RUN = max(SHORT_RUN, 1000)


def run_length(request: pytest.FixtureRequest) -> int:
    """The examples of this variant: the long one runs only when selected with -m chaos."""
    if request.node.get_closest_marker("chaos") is None:
        return SHORT_RUN
    if "chaos" not in (request.config.getoption("-m") or ""):
        pytest.skip("the long property run is selected with -m chaos")
    return LONG_RUN


RUNS = [pytest.param("short", id="short"),
        pytest.param("long", id="long", marks=pytest.mark.chaos)]

# Any character, with NUL and lone surrogates (which the default alphabet leaves out) often.
CHARACTERS = st.one_of(st.characters(), st.just("\x00"), st.characters(categories=["Cs"]),
                       st.sampled_from("é€𝄞"))
NAMES = st.one_of(
    st.text(CHARACTERS, max_size=12),
    # Around the length limit, in ASCII and in multi-byte characters.
    st.builds(lambda base, tail: base + tail,
              st.text(st.sampled_from("abcxyz-_.:"), min_size=MAX_IDENTIFIER_BYTES - 4,
                      max_size=MAX_IDENTIFIER_BYTES + 2),
              st.text(CHARACTERS, max_size=2)),
    st.builds(lambda n: "é" * n, st.integers(MAX_IDENTIFIER_BYTES // 2 - 2,
                                             MAX_IDENTIFIER_BYTES // 2 + 2)),
)


def storable(text: str, *, empty_ok: bool = False) -> bool:
    """The documented rule: no NUL, no lone surrogate, at most the limit in UTF-8."""
    if not text and not empty_ok:
        return False
    if "\x00" in text:
        return False
    try:
        return len(text.encode("utf-8")) <= MAX_IDENTIFIER_BYTES
    except UnicodeEncodeError:
        return False


def escaped(text: str) -> str:
    """``text`` as an argument any string survives as (a bad key cannot be one itself)."""
    return text.encode("unicode_escape", "backslashreplace").decode("ascii")


TABLES = ("workflow_status", "workflow_input", "workflow_output", "operation_outputs",
          "notifications", "workflow_events", "workflow_events_history", "streams",
          "workflow_schedules", "queues", "application_versions")


async def table_counts(url: str) -> dict[str, int]:
    return {table: int(await fetchval(url, f"SELECT count(*) FROM dbos.{table}"))
            for table in TABLES}


class Boundary:
    """An executor with a workflow per primitive, a partitioned queue, and a client."""

    run: Callable[[Coroutine[Any, Any, Any]], Any]
    """Runs a coroutine to its end on the executor's loop."""

    def __init__(self, url: str, *, sharding: bool = False) -> None:
        self.url = url
        self.sharding = sharding
        self.dbos = dbos = new_dbos(url, application_version="v1", sharding=sharding)
        dbos.queue("parts", partition_queue=True)

        @dbos.workflow(name="echo")
        async def echo(value: Any) -> Any:
            return value

        @dbos.workflow(name="publish")
        async def publish(escaped_key: str) -> None:
            key = codecs.decode(escaped_key, "unicode_escape")
            await dbos.set_event(key, key)
            await dbos.write_stream(key, key)
            await dbos.close_stream(key)

        @dbos.workflow(name="receive")
        async def receive(topic: str) -> Any:
            return await dbos.recv(topic, 30)

        @dbos.workflow(name="relay")
        async def relay(value: Any) -> Any:
            await dbos.set_event("value", value)
            return [value, await dbos.recv("value", 30)]

        @dbos.workflow(name="tick")
        async def tick(scheduled_time: datetime, context: Any) -> None:
            del scheduled_time, context

        self.echo, self.publish, self.receive, self.relay = echo, publish, receive, relay

    async def __aenter__(self) -> Boundary:
        await self.dbos.__aenter__()
        self.client = await DBOSClient(system_database_url=self.url,
                                       sharding=self.sharding).__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(None, None, None)
        await self.dbos.__aexit__(None, None, None)

    async def enqueued_column(self, column: str, **enqueue: Any) -> Any:
        """Enqueue echo from the client (on a queue nobody serves, unless given) and read
        ``column`` of its row back."""
        options = {"queue_name": "unserved", "workflow_name": "echo", **enqueue}
        handle = await self.client.enqueue(options.pop("queue_name"),
                                           options.pop("workflow_name"), 1, **options)
        return await fetchval(self.url, f"SELECT {column} FROM dbos.workflow_status "
                                        "WHERE workflow_uuid = $1", handle.workflow_id)


@pytest.fixture
def boundary(database_url: str) -> Iterator[Boundary]:
    """The executor, entered on a loop of its own that each example runs on (hypothesis
    runs synchronous examples)."""
    b = Boundary(database_url)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(b.__aenter__())
    b.run = loop.run_until_complete
    try:
        yield b
    finally:
        loop.run_until_complete(b.__aexit__(None, None, None))
        loop.close()


# ---- Names, IDs, keys and topics ----


async def _workflow_id(b: Boundary, text: str) -> None:
    with SetWorkflowID(text):
        handle = await b.dbos.start_workflow(b.echo, 1)
    assert handle.workflow_id == text
    [status] = await b.client.list_workflows(workflow_ids=[text])
    assert status.workflow_id == text and await handle.get_result() == 1


async def _event_and_stream_key(b: Boundary, text: str) -> None:
    handle = await b.dbos.start_workflow(b.publish, escaped(text))
    await handle.get_result()
    assert await b.client.get_event(handle.workflow_id, text, 0) == text
    assert await b.client.get_all_events(handle.workflow_id) == {text: text}
    assert [v async for v in b.client.read_stream(handle.workflow_id, text)] == [text]


async def _topic(b: Boundary, text: str) -> None:
    handle = await b.dbos.start_workflow(b.receive, text)
    await b.client.send(handle.workflow_id, "hello", text)
    assert await handle.get_result() == "hello"


async def _schedule_name(b: Boundary, text: str) -> None:
    await b.dbos.create_schedule(text, "tick", "0 0 1 1 *")
    try:
        schedule = await b.client.get_schedule(text)
        assert schedule is not None and schedule.schedule_name == text
    finally:
        await b.dbos.delete_schedule(text)


async def _column(b: Boundary, text: str, column: str, **enqueue: Any) -> None:
    assert await b.enqueued_column(column, **enqueue) == text


ROUND_TRIPS: dict[str, Any] = {
    "workflow ID": _workflow_id,
    "event and stream key": _event_and_stream_key,
    "topic": _topic,
    "schedule name": _schedule_name,
    "queue name": lambda b, t: _column(b, t, "queue_name", queue_name=t),
    "workflow name": lambda b, t: _column(b, t, "name", workflow_name=t),
    "deduplication ID": lambda b, t: _column(b, t, "deduplication_id", deduplication_id=t),
    "partition key": lambda b, t: _column(b, t, "queue_partition_key", queue_name="parts",
                                          partition_key=t),
    "application version": lambda b, t: _column(b, t, "application_version",
                                                application_version=t),
}
"""Each argument's round trip through the database, for a storable string."""

EMPTY_OK = {"event and stream key", "topic"}


async def _refused(b: Boundary, argument: str, text: str) -> None:
    """The call with ``text`` raises the documented error."""
    if argument == "schedule name":
        with pytest.raises(ScheduleError, match="Invalid schedule name"):
            await b.dbos.create_schedule(text, "tick", "0 0 1 1 *")
    elif argument == "event and stream key":
        # Refused in the workflow body: the workflow fails with the error, nothing else.
        with pytest.raises(InvalidArgumentError, match="Invalid event key"):
            await b.publish(escaped(text))
    elif argument == "topic":
        with pytest.raises(InvalidArgumentError, match="Invalid topic"):
            await b.client.send("anything", "hello", text)
    elif argument == "workflow ID":
        with pytest.raises(InvalidArgumentError, match="Invalid workflow ID"):
            SetWorkflowID(text)
    else:
        with pytest.raises(InvalidArgumentError):
            await ROUND_TRIPS[argument](b, text)


async def _check_name(b: Boundary, argument: str, text: str) -> None:
    if storable(text, empty_ok=argument in EMPTY_OK):
        await ROUND_TRIPS[argument](b, text)
        return
    before = await table_counts(b.url)
    await _refused(b, argument, text)
    after = await table_counts(b.url)
    if argument == "event and stream key":
        # The failed workflow's own rows; no event, stream or checkpoint.
        for table in ("workflow_status", "workflow_input", "workflow_output"):
            before.pop(table)
            after.pop(table)
    assert after == before


@pytest.mark.parametrize("run", RUNS)
def test_names_ids_keys_and_topics_round_trip_or_are_refused(
        boundary: Boundary, request: pytest.FixtureRequest, run: str) -> None:
    del run

    @settings(max_examples=run_length(request), deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(argument=st.sampled_from(sorted(ROUND_TRIPS)), text=NAMES)
    def check(argument: str, text: str) -> None:
        boundary.run(_check_name(boundary, argument, text))

    check()


@given(text=NAMES)
@settings(max_examples=SHORT_RUN * 5, deadline=None)
def test_settings_and_context_names_are_checked_alike(text: str) -> None:
    """Names checked where they are given (no database): accepted exactly when storable."""
    dbos = DBOS(system_database_url="postgresql://postgres@127.0.0.1:1/never")
    # (call, error, whether an empty string is accepted)
    checks = [
        (lambda: SetShardKey(text), InvalidArgumentError, False),
        (lambda: dbos.configure(executor_id=text), ConfigurationError, False),
        # An empty application version is a version.
        (lambda: dbos.configure(application_version=text), ConfigurationError, True),
        (lambda: dbos.queue(text), ConfigurationError, False),
        # An empty name means the function's own.
        (lambda: dbos.workflow(name=text)(_body), InvalidArgumentError, True),
    ]
    for call, error_type, empty_ok in checks:
        if storable(text, empty_ok=empty_ok):
            call()
        else:
            with pytest.raises(error_type):
                call()


async def _body() -> None:
    pass


# ---- Values ----

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(),
              st.floats(allow_nan=True, allow_infinity=True), st.text(CHARACTERS, max_size=8)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(CHARACTERS, max_size=6), children, max_size=4)),
    max_leaves=12,
)


def serializable(value: Any) -> bool:
    """The documented rule: portable JSON has no NaN or infinity, UTF-8 no lone surrogate."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list):
        return all(serializable(v) for v in value)
    if isinstance(value, dict):
        return all(serializable(k) and serializable(v) for k, v in value.items())
    return True


async def _check_value(b: Boundary, value: Any) -> None:
    if serializable(value):
        handle = await b.dbos.start_workflow(b.relay, value)
        workflow_id = handle.workflow_id
        await b.client.send(workflow_id, value, "value")
        # Read back from the database by the client: argument, event, message, result.
        stored = await b.client.retrieve_workflow(workflow_id)
        assert await stored.get_result() == [value, value]
        assert await b.client.get_event(workflow_id, "value", 0) == value
        [status] = await b.client.list_workflows(workflow_ids=[workflow_id])
        assert status.input is not None
        assert (status.input.args, status.input.kwargs) == ((value,), {})
        return
    before = await table_counts(b.url)
    with pytest.raises(SerializationError):
        await b.dbos.start_workflow(b.relay, value)
    with pytest.raises(SerializationError):
        await b.client.enqueue("unserved", "relay", value)
    with pytest.raises(SerializationError):
        await b.client.send("anything", value)
    assert await table_counts(b.url) == before


@pytest.mark.parametrize("run", RUNS)
def test_values_round_trip_or_raise_serialization_error(
        boundary: Boundary, request: pytest.FixtureRequest, run: str) -> None:
    del run

    @settings(max_examples=run_length(request), deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(value=JSON_VALUES)
    def check(value: Any) -> None:
        boundary.run(_check_value(boundary, value))

    check()


# ---- Shard keys (sharded schema) ----


@pytest.fixture
def sharded_boundary(plain_database_url: str) -> Iterator[Boundary]:
    """:func:`boundary` on the sharded schema."""
    b = Boundary(plain_database_url, sharding=True)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(b.__aenter__())
    b.run = loop.run_until_complete
    try:
        yield b
    finally:
        loop.run_until_complete(b.__aexit__(None, None, None))
        loop.close()


async def _check_shard_key(b: Boundary, key: str, text: str) -> None:
    """``key`` as a shard key and ``text`` as the workflow ID under it."""
    if storable(key) and storable(text):
        with SetShardKey(key), SetWorkflowID(text):
            handle = await b.dbos.start_workflow(b.echo, key)
        assert await handle.get_result() == key
        [status] = await b.client.list_workflows(workflow_ids=[text], shard_key=key)
        assert (status.workflow_id, status.shard_key) == (text, key)
        assert await b.client.get_event(text, "absent", 0, shard_key=key) is None
        return
    before = await table_counts(b.url)
    with pytest.raises(InvalidArgumentError), SetShardKey(key), SetWorkflowID(text):
        await b.dbos.start_workflow(b.echo, 1)
    with pytest.raises(InvalidArgumentError):
        await b.client.enqueue("unserved", "echo", 1, workflow_id=text, shard_key=key)
    assert await table_counts(b.url) == before


@pytest.mark.parametrize("run", RUNS)
def test_shard_keys_round_trip_or_are_refused(
        sharded_boundary: Boundary, request: pytest.FixtureRequest, run: str) -> None:
    del run

    @settings(max_examples=run_length(request), deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(key=NAMES, text=NAMES)
    def check(key: str, text: str) -> None:
        sharded_boundary.run(_check_shard_key(sharded_boundary, key, text))

    check()
