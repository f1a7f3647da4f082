"""A serializer of the user's: every value an executor or client stores (inputs, results,
step outputs and errors, events, messages, stream values) is written with it and recorded
under its name, and every reader decodes by the recorded name."""

from __future__ import annotations

import asyncio
import contextlib
import json
from decimal import Decimal
from typing import Any

import pytest
from helpers import count_workflows, fetch, new_dbos, workflow_row

from dbos_async import (
    DBOS,
    ConfigurationError,
    DBOSClient,
    RecordedError,
    SerializationError,
    SetShardKey,
    SetWorkflowID,
)

PATIENCE = 30.0


class TaggedJSON:
    """JSON that keeps Decimals exact (portable JSON has no decimal type), each text tagged
    so the tests can tell it from portable JSON."""

    def name(self) -> str:
        return "tagged_json"

    def serialize(self, data: Any) -> str:
        return "T:" + json.dumps(self._encode(data))

    def deserialize(self, serialized_data: str) -> Any:
        assert serialized_data.startswith("T:"), serialized_data
        return json.loads(serialized_data[2:], object_hook=self._decode)

    def _encode(self, data: Any) -> Any:
        if isinstance(data, Decimal):
            return {"__decimal__": str(data)}
        if isinstance(data, dict):
            return {k: self._encode(v) for k, v in data.items()}
        if isinstance(data, list | tuple):
            return [self._encode(v) for v in data]
        if isinstance(data, str | int | float | bool) or data is None:
            return data
        raise TypeError(f"TaggedJSON cannot store {type(data).__name__}")

    def _decode(self, data: dict[str, Any]) -> Any:
        return Decimal(data["__decimal__"]) if set(data) == {"__decimal__"} else data


class Unstorable:
    pass


def register(dbos: DBOS) -> tuple[Any, Any, Any]:
    @dbos.step(name="add_tax")
    async def add_tax(amount: Decimal) -> Decimal:
        return amount * Decimal("1.2")

    @dbos.step(name="fails")
    async def fails() -> None:
        raise ValueError("tax office closed")

    @dbos.workflow(name="priced")
    async def priced(amount: Decimal) -> dict[str, Any]:
        total = await add_tax(amount)
        await dbos.set_event("total", total)
        await dbos.write_stream("lines", total)
        await dbos.close_stream("lines")
        message = await dbos.recv("confirm", timeout=PATIENCE)
        try:
            await fails()
        except ValueError as error:
            failure = str(error)
        return {"total": total, "message": message, "failure": failure}

    @dbos.workflow(name="refuses")
    async def refuses(value: Any) -> None:
        return None

    return priced, refuses, add_tax


@pytest.mark.parametrize("sharding", [False, True])
async def test_every_value_is_written_and_read_with_the_serializer(
        database_url: str, sharding: bool) -> None:
    dbos = new_dbos(database_url, serializer=TaggedJSON(), sharding=sharding)
    priced, _, _ = register(dbos)
    key = "tenant-a" if sharding else None
    async with dbos, DBOSClient(system_database_url=database_url, serializer=TaggedJSON(),
                                sharding=sharding) as client:
        with SetWorkflowID("order-1"), \
                SetShardKey(key) if key else contextlib.nullcontext():
            handle = await dbos.start_workflow(priced, Decimal("10.05"))
        assert await client.get_event("order-1", "total", shard_key=key) == Decimal("12.060")
        await client.send("order-1", Decimal("0.1"), topic="confirm", shard_key=key)
        result = await asyncio.wait_for(handle.get_result(), PATIENCE)
        assert result == {"total": Decimal("12.060"), "message": Decimal("0.1"),
                          "failure": "tax office closed"}
        # A client with the serializer reads every value back exactly.
        remote = await client.retrieve_workflow("order-1", shard_key=key)
        assert await remote.get_result() == result
        assert [v async for v in client.read_stream("order-1", "lines", shard_key=key)] \
            == [Decimal("12.060")]
        [status] = await client.list_workflows(workflow_ids=["order-1"], load_input=True)
        assert status.serialization == "tagged_json"
        assert status.input is not None and status.input.args == (Decimal("10.05"),)
        steps = await dbos.list_workflow_steps("order-1", shard_key=key) if sharding \
            else await dbos.list_workflow_steps("order-1")
        assert steps[0].output == Decimal("12.060")
        failed = next(s for s in steps if s.name == "fails")
        assert isinstance(failed.error, ValueError)

    # What the database holds: each value in the serializer's text, under its name.
    for table, column in (("workflow_status", "serialization"),
                          ("workflow_events", "serialization"),
                          ("workflow_events_history", "serialization")):
        rows = await fetch(database_url, f"SELECT {column} FROM dbos.{table}")
        assert {r[column] for r in rows} == {"tagged_json"}, table
    inputs = await fetch(database_url, "SELECT inputs FROM dbos.workflow_input")
    assert inputs[0]["inputs"].startswith("T:") and '"args"' in inputs[0]["inputs"]
    steps = {r["function_name"]: (r["serialization"], r["output"] or r["error"])
             for r in await fetch(database_url, "SELECT function_name, serialization, "
                                  "output, error FROM dbos.operation_outputs")}
    for name in ("add_tax", "fails", "DBOS.recv"):
        assert steps[name][0] == "tagged_json" and steps[name][1].startswith("T:"), name
    [message] = await fetch(database_url, "SELECT message, serialization FROM "
                            "dbos.notifications")
    assert (message["serialization"], message["message"]) == (
        "tagged_json", 'T:{"__decimal__": "0.1"}')
    streams = await fetch(database_url, 'SELECT value, serialization FROM dbos.streams '
                          'ORDER BY "offset"')
    # The close marker stays portable JSON, as every SDK writes it.
    assert [r["serialization"] for r in streams] == ["tagged_json", "portable_json"]


async def test_a_reader_without_the_serializer_is_told_which_it_needs(
        database_url: str) -> None:
    dbos = new_dbos(database_url, serializer=TaggedJSON())

    @dbos.workflow(name="plain")
    async def plain(x: int) -> int:
        await dbos.set_event("x", x)
        return x

    async with dbos:
        with SetWorkflowID("w"):
            assert await plain(3) == 3
    async with DBOSClient(system_database_url=database_url) as client:
        handle = await client.retrieve_workflow("w")
        with pytest.raises(SerializationError, match=r"'tagged_json'.*serializer="):
            await handle.get_result()
        with pytest.raises(SerializationError, match="tagged_json"):
            await client.get_event("w", "x", timeout=0)
        [status] = await client.list_workflows(load_input=True)
        assert status.serialization == "tagged_json" and status.input is None
    # An executor with the default format still reads it after it is given the serializer.
    again = new_dbos(database_url, serializer=TaggedJSON())
    async with again:
        assert await (await again.retrieve_workflow("w")).get_result() == 3


async def test_values_the_serializer_refuses_write_nothing(database_url: str) -> None:
    dbos = new_dbos(database_url, serializer=TaggedJSON())
    _, refuses, _ = register(dbos)
    async with dbos:
        with pytest.raises(SerializationError, match=r"with serializer 'tagged_json'.*"
                                                     r"TaggedJSON cannot store Unstorable"):
            await refuses(Unstorable())
        assert await count_workflows(database_url) == 0


class WrongResult:
    def name(self) -> str:
        return "wrong"

    def serialize(self, data: Any) -> Any:
        return b"bytes"

    def deserialize(self, serialized_data: str) -> Any:
        return serialized_data


async def test_a_serializer_returning_no_text_is_refused(database_url: str) -> None:
    dbos = new_dbos(database_url, serializer=WrongResult())
    _, refuses, _ = register(dbos)
    async with dbos:
        with pytest.raises(SerializationError, match="returned bytes"):
            await refuses(1)
        assert await count_workflows(database_url) == 0


class NamedPortable(TaggedJSON):
    def name(self) -> str:
        return "portable_json"


def test_bad_serializers_are_refused_at_configuration() -> None:
    url = "postgresql://localhost/unused"
    with pytest.raises(ConfigurationError, match="lacks name, serialize, deserialize"):
        DBOS(system_database_url=url, serializer=object())
    with pytest.raises(ConfigurationError, match="may not be named 'portable_json'"):
        DBOS(system_database_url=url, serializer=NamedPortable())
    with pytest.raises(ConfigurationError, match="serializer"):
        DBOSClient(system_database_url=url, serializer="json")


async def test_a_recorded_error_in_the_serializer_keeps_its_class(database_url: str) -> None:
    dbos = new_dbos(database_url, serializer=TaggedJSON())

    @dbos.workflow(name="broken")
    async def broken() -> None:
        raise KeyError("missing")

    async with dbos:
        with SetWorkflowID("b"), pytest.raises(KeyError):
            await broken()
        with pytest.raises(RecordedError) as recorded:
            await (await dbos.retrieve_workflow("b")).get_result()
        assert isinstance(recorded.value, KeyError) and recorded.value.name == "KeyError"
    row = await workflow_row(database_url, "b")
    assert row is not None
    assert row["serialization"] == "tagged_json" and row["stored_error"].startswith("T:")


async def test_plain_values_are_stored_as_portable_json_text(database_url: str) -> None:
    """The text of scalar inputs, step outputs and results, byte for byte as the ``dbos``
    package and every SDK write portable JSON (compact, non-ASCII kept)."""
    dbos = new_dbos(database_url)

    @dbos.step(name="echo")
    async def echo(value: Any) -> Any:
        return value

    @dbos.workflow(name="echoing")
    async def echoing(value: Any) -> Any:
        return await echo(value)

    values = {"none": (None, "null"), "true": (True, "true"), "false": (False, "false"),
              "zero": (0, "0"), "negative": (-7, "-7"), "big": (2**70, "1180591620717411303424"),
              "float": (1.5, "1.5"), "text": ('é "q"', '"é \\"q\\""')}
    async with dbos:
        for name, (value, _) in values.items():
            with SetWorkflowID(name):
                assert await echoing(value) == value
    rows = await fetch(database_url, "SELECT s.workflow_uuid, s.output AS result, "
                       "o.output AS step, i.inputs FROM dbos.workflow_output s "
                       "JOIN dbos.operation_outputs o USING (workflow_uuid) "
                       "JOIN dbos.workflow_input i USING (workflow_uuid)")
    stored = {r["workflow_uuid"]: (r["result"], r["step"], r["inputs"]) for r in rows}
    assert stored == {name: (text, text, f'{{"positionalArgs":[{text}],"namedArgs":{{}}}}')
                      for name, (_, text) in values.items()}
