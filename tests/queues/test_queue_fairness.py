"""Fair turns on a queue: busy partitions, and on a sharded database busy shard keys, share
an executor's worker budget in turns, whatever their keys sort as. Measured by the order in
which workflows start, never by timing: with N busy keys, after k starts every key has
started ⌊k/N⌋ or ⌈k/N⌉ workflows (so each starts within the first N), on the unsharded and
the sharded schema (and on Citus where ``DBOS_TEST_CITUS_URL`` is set)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from helpers import new_dbos

from dbos_async import DBOSClient, migrate

KEYS = ["tenant-a", "tenant-b", "tenant-c", "tenant-d", "tenant-e"]
JOBS_PER_KEY = 4
WORKERS = 2
PATIENCE = 60.0


@pytest.fixture(params=["unsharded", "sharded",
                        pytest.param("citus", marks=pytest.mark.citus)])
def schema(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """(URL of a fresh database, whether its system schema is sharded)."""
    if request.param == "citus":
        return request.getfixturevalue("citus_url"), True
    return request.getfixturevalue("plain_database_url"), request.param == "sharded"


def assert_turns(starts: list[str], keys: list[str]) -> None:
    """After every prefix of ``starts``, each key's count is within one of an even split."""
    seen: Counter[str] = Counter()
    for k, key in enumerate(starts, start=1):
        seen[key] += 1
        low, high = k // len(keys), -(-k // len(keys))
        counts = {key: seen[key] for key in keys}
        assert all(low <= c <= high for c in counts.values()), (k, counts, starts)
    assert seen == Counter(dict.fromkeys(keys, JOBS_PER_KEY)), starts


class Jobs:
    """An executor whose ``job(key)`` workflows note the order they start in, and finish
    when the test releases them, oldest first (``held``), or at once."""

    def __init__(self, url: str, sharded: bool, *, held: bool, **queue: Any) -> None:
        self.dbos = new_dbos(url, sharding=sharded, application_name="fair-app")
        self.queue = self.dbos.queue("fair", worker_concurrency=WORKERS, **queue)
        self.starts: list[str] = []
        self.released = 0
        self.changed = asyncio.Condition()

        @self.dbos.workflow(name="job")
        async def job(key: str) -> str:
            async with self.changed:
                index = len(self.starts)
                self.starts.append(key)
                self.changed.notify_all()
                if held:
                    await self.changed.wait_for(lambda: self.released > index)
            return key

    async def release_in_order(self, total: int) -> None:
        """Let the oldest running job finish each time the worker budget is full (or
        every remaining job has started), until all ``total`` have finished."""
        async with self.changed:
            while self.released < total:
                target = min(self.released + WORKERS, total)
                await asyncio.wait_for(
                    self.changed.wait_for(lambda t=target: len(self.starts) >= t), PATIENCE)
                # Never more running than the worker budget.
                assert len(self.starts) == target, self.starts
                self.released += 1
                self.changed.notify_all()


async def enqueue_backlog(url: str, sharded: bool, *, by_shard_key: bool) -> int:
    """Enqueue every key's backlog before the executor starts (all keys busy from its
    first round): under partition keys, or (``by_shard_key``) under shard keys."""
    await migrate(url, sharding=sharded)
    async with DBOSClient(system_database_url=url, sharding=sharded,
                          application_name="fair-app") as client:
        for n in range(JOBS_PER_KEY):
            for key in KEYS:
                where: dict[str, Any] = ({"shard_key": key} if by_shard_key else
                                         {"partition_key": key,
                                          "shard_key": "one-tenant" if sharded else None})
                await client.enqueue("fair", "job", key, workflow_id=f"{key}-{n}", **where)
    return JOBS_PER_KEY * len(KEYS)


async def run(jobs: Jobs, total: int, *, held: bool) -> None:
    async with jobs.dbos:
        if held:
            await jobs.release_in_order(total)
        else:
            async with jobs.changed:
                await asyncio.wait_for(
                    jobs.changed.wait_for(lambda: len(jobs.starts) >= total), PATIENCE)


@pytest.mark.parametrize("limits", [{}, {"partition_concurrency": 1}],
                         ids=["worker-limit", "partition-concurrency-1"])
async def test_busy_partitions_take_turns(schema: tuple[str, bool],
                                          limits: dict[str, Any]) -> None:
    """Five busy partitions, two workers: each partition starts within the first five
    starts, and every prefix of the starts is within one of an even split (the walk once
    went in key order: ``tenant-a`` and ``tenant-b`` took every slot until their backlogs
    were gone). Released oldest first, so the order depends on the claims alone."""
    url, sharded = schema
    total = await enqueue_backlog(url, sharded, by_shard_key=False)
    jobs = Jobs(url, sharded, held=True, partition_queue=True, **limits)
    await run(jobs, total, held=True)
    assert_turns(jobs.starts, KEYS)


async def test_busy_partitions_take_turns_whatever_order_they_finish_in(
        schema: tuple[str, bool]) -> None:
    """Jobs finishing as they come (in any order): without a per-partition limit the
    turns do not depend on completions, so the bound holds as well."""
    url, sharded = schema
    total = await enqueue_backlog(url, sharded, by_shard_key=False)
    jobs = Jobs(url, sharded, held=False, partition_queue=True)
    await run(jobs, total, held=False)
    assert_turns(jobs.starts, KEYS)


@pytest.mark.parametrize("held", [True, False], ids=["released-in-order", "free-running"])
async def test_busy_shard_keys_take_turns(schema: tuple[str, bool], held: bool) -> None:
    """On a sharded database, five busy shard keys on one queue share two workers in
    turns, as partitions do."""
    url, sharded = schema
    if not sharded:
        pytest.skip("shard keys exist on a sharded schema only")
    total = await enqueue_backlog(url, sharded, by_shard_key=True)
    jobs = Jobs(url, sharded, held=held)
    await run(jobs, total, held=held)
    assert_turns(jobs.starts, KEYS)


