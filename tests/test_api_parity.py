"""Calls the `dbos` package has that dbos_async matches, on the unsharded and the sharded
schema: ``run_step``, a checkpointed ``wait_first``/``wait_all``, ``read_stream_offset``,
``send(..., send_to_forks=True)``, per-call ``serialization_type``, ``DebouncerClient`` and
``default_required_roles``."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import fetch, new_dbos, wait_until

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    DebouncerClient,
    InvalidArgumentError,
    NotAuthorizedError,
    SendMessage,
    SetAuthentication,
    SetShardKey,
    SetWorkflowID,
    StepOptions,
    StreamTimeoutError,
    WorkflowSerializationFormat,
    current_authentication,
    current_shard_key,
)
from dbos_async.testing import TestClock

PATIENCE = 20.0
KEY = "acme"


@pytest.fixture(params=["unsharded", "sharded"])
def sharded(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "sharded")


def app(url: str, sharded: bool, **settings: Any) -> DBOS:
    return new_dbos(url, sharding=sharded, **settings)


def key(sharded: bool) -> str | None:
    """The shard key workflows of a test live under (None unsharded)."""
    return KEY if sharded else None


@contextlib.contextmanager
def under_key(sharded: bool) -> Iterator[None]:
    with SetShardKey(KEY) if sharded else contextlib.nullcontext():
        yield


# ---- run_step ----


async def test_run_step_checkpoints_undecorated_functions(database_url: str,
                                                          sharded: bool) -> None:
    dbos = app(database_url, sharded)
    calls: list[str] = []

    async def fetch_price(item: str) -> int:
        calls.append(item)
        return len(item) * 100

    def roll() -> float:
        calls.append("roll")
        return random.random()

    @dbos.workflow(name="priced")
    async def priced(item: str) -> tuple[int, float, int]:
        price = await dbos.run_step(None, fetch_price, item)
        dice = await dbos.run_step(StepOptions(name="dice"), roll)
        again = await dbos.run_step(None, fetch_price, item=item + "!")
        return price, dice, again

    async with dbos:
        with under_key(sharded), SetWorkflowID("priced-1"):
            price, dice, again = await priced("tea")
        assert (price, again) == (300, 400) and calls == ["tea", "roll", "tea!"]
        steps = await dbos.list_workflow_steps("priced-1", shard_key=key(sharded))
        names = [s.name for s in steps]
        assert names == [fetch_price.__qualname__, "dice", fetch_price.__qualname__]
        assert [s.output for s in steps] == [300, dice, 400]
        # A fork from the last step replays the first two: neither function runs again,
        # and the roll is the recorded one.
        fork = await dbos.fork_workflow("priced-1", 2, shard_key=key(sharded))
        assert await fork.get_result() == (300, dice, 400)
        assert calls == ["tea", "roll", "tea!", "tea!"]
        # Outside a workflow it is a plain call.
        assert await dbos.run_step(None, fetch_price, "x") == 100


async def test_run_step_retries_and_refuses_bad_input(database_url: str) -> None:
    dbos = app(database_url, False)
    attempts: list[int] = []

    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("try again")
        return "done"

    @dbos.workflow(name="retrying")
    async def retrying() -> str:
        return await dbos.run_step(StepOptions(name="flaky", retries=2, retry_interval=0.0),
                                   flaky)

    async with dbos:
        assert await retrying() == "done" and len(attempts) == 3
        with pytest.raises(InvalidArgumentError, match="run_step function"):
            dbos.run_step(None, "not a function")  # type: ignore[call-overload]
        with pytest.raises(InvalidArgumentError, match="expected StepOptions"):
            dbos.run_step({"name": "x"}, flaky)  # type: ignore[call-overload]


# ---- wait_first / wait_all ----


async def test_wait_first_in_a_workflow_replays_its_choice(database_url: str,
                                                           sharded: bool) -> None:
    dbos = app(database_url, sharded)

    @dbos.workflow(name="waiter")
    async def waiter(tag: str) -> str:
        await dbos.recv("go", timeout=PATIENCE)
        return tag

    @dbos.workflow(name="racer")
    async def racer(ids: list[str]) -> str:
        handles = [await dbos.retrieve_workflow(i, shard_key=current_shard_key())
                   for i in ids]
        chosen = await dbos.wait_first(handles)
        await dbos.run_step(None, str, "after")
        return chosen.workflow_id

    async with dbos:
        with under_key(sharded):
            for tag in ("x", "y"):
                with SetWorkflowID(tag):
                    await dbos.start_workflow(waiter, tag)
            with SetWorkflowID("race"):
                race = await dbos.start_workflow(racer, ["x", "y"])
        await dbos.send("y", "go", "go", shard_key=key(sharded))
        assert await race.get_result() == "y"
        steps = await dbos.list_workflow_steps("race", shard_key=key(sharded))
        assert (steps[0].name, steps[0].output) == ("DBOS.waitFirst", "y")
        # Now x has finished and y is a new, pending workflow: a live wait would choose x,
        # the fork replays the recorded choice.
        await dbos.send("x", "go", "go", shard_key=key(sharded))
        await dbos.delete_workflow("y", shard_key=key(sharded))
        with under_key(sharded), SetWorkflowID("y"):
            again = await dbos.start_workflow(waiter, "y")
        fork = await dbos.fork_workflow("race", 1, shard_key=key(sharded))
        assert await fork.get_result() == "y"
        assert (await again.get_status()).status == "PENDING"
        live = await dbos.wait_first([again, await dbos.retrieve_workflow(
            "x", shard_key=key(sharded))])
        assert live.workflow_id == "x"
        await dbos.send("y", "go", "go", shard_key=key(sharded))


async def test_wait_all_raises_the_first_failure_in_list_order(database_url: str) -> None:
    dbos = app(database_url, False)

    @dbos.workflow(name="fails")
    async def fails(tag: str) -> str:
        await dbos.recv("go", timeout=PATIENCE)
        raise ValueError(tag)

    async with dbos:
        handles = []
        for tag in ("late", "early"):
            with SetWorkflowID(tag):
                handles.append(await dbos.start_workflow(fails, tag))
        waiting = asyncio.ensure_future(dbos.wait_all(handles))
        await dbos.send("early", "go", "go")
        assert await dbos.wait_first(handles) is handles[1]
        await dbos.send("late", "go", "go")
        with pytest.raises(ValueError, match="late"):
            await waiting
        with pytest.raises(InvalidArgumentError, match="at least one handle"):
            await dbos.wait_first([])
        with pytest.raises(InvalidArgumentError, match="got workflow 'late' twice"):
            await dbos.wait_all([handles[0], handles[0]])


# ---- read_stream_offset ----


async def test_read_stream_offset_reads_one_value_and_replays_it(database_url: str,
                                                                 sharded: bool) -> None:
    dbos = app(database_url, sharded)

    @dbos.workflow(name="writer")
    async def writer(n: int) -> None:
        for i in range(n):
            await dbos.write_stream("out", {"i": i})
        await dbos.close_stream("out")

    @dbos.workflow(name="reader")
    async def reader(source: str) -> list[Any]:
        second = await dbos.read_stream_offset(source, "out", 1,
                                               shard_key=current_shard_key())
        try:
            await dbos.read_stream_offset(source, "out", 5, shard_key=current_shard_key())
        except StreamTimeoutError as error:
            return [second, str(error)]
        return [second, None]

    async with dbos:
        with under_key(sharded):
            with SetWorkflowID("w"):
                await writer(3)
            with SetWorkflowID("r"):
                result = await reader("w")
        assert result == [{"i": 1}, "Stream 'out' of workflow 'w' ended before offset 5"]
        steps = await dbos.list_workflow_steps("r", shard_key=key(sharded))
        assert [s.name for s in steps] == ["DBOS.readStreamOffset"] * 2
        assert isinstance(steps[1].error, StreamTimeoutError)
        # Outside workflows: the value, from an offset, or a timeout.
        assert await dbos.read_stream_offset("w", "out", 2, shard_key=key(sharded)) == {"i": 2}
        assert [v async for v in dbos.read_stream("w", "out", 1, shard_key=key(sharded))] \
            == [{"i": 1}, {"i": 2}]
        # With the writer's stream gone, a fork of the reader replays both reads.
        await dbos.delete_workflow("w", shard_key=key(sharded))
        fork = await dbos.fork_workflow("r", 2, shard_key=key(sharded))
        assert await fork.get_result() == result
        with pytest.raises(InvalidArgumentError, match="stream offset"):
            await dbos.read_stream_offset("w", "out", -1)


async def test_read_stream_offset_waits_for_the_value_or_times_out(database_url: str) -> None:
    dbos = app(database_url, False)

    @dbos.workflow(name="slow_writer")
    async def slow_writer() -> None:
        await dbos.write_stream("out", "first")
        await dbos.recv("more", timeout=PATIENCE)
        await dbos.write_stream("out", "second")

    async with dbos:
        with SetWorkflowID("slow"):
            handle = await dbos.start_workflow(slow_writer)
        with pytest.raises(StreamTimeoutError, match=r"within 0\.2 s"):
            await dbos.read_stream_offset("slow", "out", 1, timeout=0.2)
        later = asyncio.ensure_future(dbos.read_stream_offset("slow", "out", 1))
        assert await dbos.read_stream_offset("slow", "out", 0) == "first"
        await dbos.send("slow", "go", "more")
        assert await asyncio.wait_for(later, PATIENCE) == "second"
        await handle.get_result()


# ---- send_to_forks ----


async def test_send_to_forks_reaches_every_fork(database_url: str, sharded: bool) -> None:
    dbos = app(database_url, sharded)

    @dbos.workflow(name="inbox")
    async def inbox() -> list[Any]:
        await dbos.run_step(None, str, "ready")
        return [await dbos.recv("t", timeout=PATIENCE) for _ in range(2)]

    @dbos.workflow(name="announce")
    async def announce(destination: str) -> None:
        await dbos.send(destination, "all", "t", idempotency_key="k", send_to_forks=True,
                        shard_key=current_shard_key())

    k = key(sharded)
    async with dbos:
        with under_key(sharded), SetWorkflowID("o"):
            original = await dbos.start_workflow(inbox)

        async def ready() -> bool:
            return bool(await dbos.list_workflow_steps("o", shard_key=k))

        await wait_until(ready, what="the original's first step")
        first = await dbos.fork_workflow("o", 1, new_workflow_id="f1", shard_key=k)
        second = await dbos.fork_workflow("f1", 1, new_workflow_id="f2", shard_key=k)
        await dbos.send("o", "only-o", "t", shard_key=k)
        with under_key(sharded), SetWorkflowID("announcer"):
            await announce("o")
        steps = await dbos.list_workflow_steps("announcer", shard_key=k)
        assert [s.name for s in steps] == ["DBOS.send"]
        # The same key again delivers nothing twice, to the original or its forks.
        await dbos.send_bulk([SendMessage("o", "all", "t", "k", k)], send_to_forks=True)
        for fork_id in ("f1", "f2"):
            await dbos.send(fork_id, "x", "t", shard_key=k)
        assert await original.get_result() == ["only-o", "all"]
        assert await first.get_result() == ["all", "x"]
        assert await second.get_result() == ["all", "x"]
        rows = await fetch(database_url,
                           "SELECT destination_uuid FROM dbos.notifications "
                           "WHERE message_uuid LIKE 'k::%' ORDER BY 1")
        assert [r["destination_uuid"] for r in rows] == ["f1", "f2", "o"]
        with pytest.raises(InvalidArgumentError, match="send_to_forks"):
            await dbos.send("o", "x", send_to_forks="yes")  # type: ignore[arg-type]


# ---- serialization_type ----


async def test_serialization_type_chooses_each_calls_format(database_url: str,
                                                            sharded: bool) -> None:
    dbos = app(database_url, sharded, allow_pickle=True)

    @dbos.workflow(name="pickled", serialization_type=WorkflowSerializationFormat.NATIVE)
    async def pickled(amounts: set[int]) -> frozenset[int]:
        await dbos.set_event("total", sum(amounts), serialization_type="native")
        await dbos.write_stream("parts", sorted(amounts), serialization_type="portable")
        got = await dbos.recv("extra", timeout=PATIENCE)
        return frozenset(amounts | {got})

    k = key(sharded)
    async with dbos:
        with under_key(sharded), SetWorkflowID("p"):
            handle = await dbos.start_workflow(pickled, {1, 2})
        assert await dbos.get_event("p", "total", timeout=PATIENCE, shard_key=k) == 3
        await dbos.send("p", 7, "extra", serialization_type="native", shard_key=k)
        assert await handle.get_result() == frozenset({1, 2, 7})
        assert [v async for v in dbos.read_stream("p", "parts", shard_key=k)] == [[1, 2]]
        formats = {
            "inputs": "SELECT serialization FROM dbos.workflow_status",
            "event": "SELECT serialization FROM dbos.workflow_events",
            "stream": "SELECT serialization FROM dbos.streams WHERE \"offset\" = 0",
            "message": "SELECT serialization FROM dbos.notifications",
        }
        stored = {what: (await fetch(database_url, sql))[0]["serialization"]
                  for what, sql in formats.items()}
        assert stored == {"inputs": "py_pickle", "event": "py_pickle",
                          "stream": "portable_json", "message": "py_pickle"}
        with pytest.raises(InvalidArgumentError, match="serialization_type"):
            await dbos.send("p", 1, serialization_type="xml", shard_key=k)
        with pytest.raises(InvalidArgumentError, match="serialization_type"):
            dbos.workflow(serialization_type="yaml")


async def test_native_serialization_needs_allow_pickle(database_url: str) -> None:
    dbos = app(database_url, False)

    @dbos.workflow(name="native", serialization_type="native")
    async def native() -> None:
        pass

    async with dbos:
        with pytest.raises(InvalidArgumentError, match="allow_pickle=True"):
            await native()
        with pytest.raises(InvalidArgumentError, match="allow_pickle=True"):
            await dbos.send("nobody", 1, serialization_type="native")
        assert await fetch(database_url, "SELECT * FROM dbos.workflow_status") == []


# ---- DebouncerClient ----


async def test_a_client_debounces_into_the_same_burst(database_url: str,
                                                      sharded: bool) -> None:
    clock = TestClock()
    dbos = app(database_url, sharded, clock=clock)
    queue = dbos.queue("digests", polling_interval=0.2)
    sent: list[list[str]] = []

    @dbos.workflow(name="digest")
    async def digest(items: list[str]) -> list[str]:
        sent.append(items)
        return items

    k = key(sharded)
    async with dbos, DBOSClient(system_database_url=database_url, clock=clock,
                                sharding=sharded, pool_size=2) as client:
        remote = DebouncerClient(client, "digests", "digest", period=30, max_delay=300,
                                 shard_key=k)
        local = queue.debouncer(digest, period=30, max_delay=300)
        first = await remote.debounce("user-1", ["a"])
        await clock.advance(seconds=10)
        with under_key(sharded):
            second = await local.debounce("user-1", ["a", "b"])
        await clock.advance(seconds=10)
        third = await remote.debounce("user-1", ["a", "b", "c"])
        other = await remote.debounce("user-2", ["z"])
        assert first.workflow_id == second.workflow_id == third.workflow_id
        assert other.workflow_id != first.workflow_id and third.shard_key == k
        assert sent == []
        await clock.advance(seconds=30)
        assert await third.get_result() == ["a", "b", "c"]
        assert await other.get_result() == ["z"]
        assert sorted(sent) == [["a", "b", "c"], ["z"]]
        with pytest.raises(DBOSError, match="must be positive"):
            DebouncerClient(client, "digests", "digest", period=0)
        with pytest.raises(InvalidArgumentError, match="debounce key"):
            await remote.debounce("", ["x"])


# ---- default_required_roles ----


async def test_default_required_roles_apply_where_a_method_gives_none(
        database_url: str) -> None:
    dbos = app(database_url, False)

    @dbos.default_required_roles(["admin"])
    class Accounts:
        @dbos.workflow(name="Accounts.close")
        async def close(self, account: str) -> str:
            return f"closed {account} as {current_authentication().assumed_role}"

        @dbos.workflow(name="Accounts.balance", required_roles=[])
        async def balance(self, account: str) -> int:
            return await self.audited(account)

        @dbos.step(name="Accounts.audited", required_roles=["auditor"])
        async def audited(self, account: str) -> int:
            return len(account)

        @dbos.step(name="Accounts.lookup")
        async def lookup(self, account: str) -> str:
            return account.upper()

    accounts = Accounts()
    dbos.register_instance(accounts, "accounts")
    async with dbos:
        with SetAuthentication("alice", ["user", "admin"]):
            assert await accounts.close("a-1") == "closed a-1 as admin"
            assert await accounts.lookup("a-1") == "A-1"
            with pytest.raises(NotAuthorizedError, match="auditor"):
                await accounts.balance("a-1")      # its own empty list: anyone; not its step
        with SetAuthentication("bob", ["user"]):
            with pytest.raises(NotAuthorizedError, match=r"\['admin'\]"):
                await accounts.close("a-1")
            with pytest.raises(NotAuthorizedError, match=r"\['admin'\]"):
                await accounts.lookup("a-1")
        with SetAuthentication("carol", ["auditor"]):
            assert await accounts.balance("a-22") == 4
        with pytest.raises(DBOSError, match="decorates a class"):
            dbos.default_required_roles(["admin"])(len)  # type: ignore[arg-type]
        with pytest.raises(DBOSError, match="required_roles"):
            dbos.default_required_roles("admin")


async def test_a_client_enqueues_with_a_chosen_format(database_url: str,
                                                      sharded: bool) -> None:
    dbos = app(database_url, sharded, allow_pickle=True)
    dbos.queue("formats")

    @dbos.workflow(name="union")
    async def union(a: set[int], b: set[int]) -> set[int]:
        return a | b

    k = key(sharded)
    async with dbos, DBOSClient(system_database_url=database_url, sharding=sharded,
                                allow_pickle=True, pool_size=2) as client:
        handle = await client.enqueue("formats", "union", {1}, {2}, workflow_id="u",
                                      shard_key=k, serialization_type="native")
        assert await handle.get_result() == {1, 2}
        [row] = await fetch(database_url, "SELECT serialization FROM dbos.workflow_status")
        assert row["serialization"] == "py_pickle"
        with pytest.raises(InvalidArgumentError, match="serialization_type"):
            await client.enqueue("formats", "union", workflow_id="v", shard_key=k,
                                 serialization_type="json")
