"""Failover: the workflows of a dead executor are taken over by a live one, exactly once.

Real processes (``tests/helpers/failover_worker.py``): two and three executors run
workflows whose steps write a side-table row and then sleep, one is killed with SIGKILL in
the middle of a step (the test waits for that step's row), and a live one takes over its
direct and queued workflows. The side table shows that every step whose checkpoint
committed ran exactly once, and that no live executor's workflow was taken. A zombie (a
process stopped with SIGSTOP whose ID lock's session the server ended, as a partition does)
is fenced: once resumed, its in-flight step's checkpoint is refused and it runs nothing more.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    advisory_lock_holder,
    execute,
    fetch,
    new_dbos,
    wait_until,
    workflow_row,
)
from helpers import failover_worker as fw

from dbos_async import DBOS, Queue, SetShardKey, SetWorkflowID

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "failover_worker.py"
PATIENCE = 60.0


class Worker:
    """A running failover worker: its executor ID, pid, and the workflows it saw finish."""

    def __init__(self, proc: asyncio.subprocess.Process, info: dict[str, Any]) -> None:
        self.proc = proc
        self.executor_id: str = info["executor_id"]
        self.pid: int = info["pid"]
        self.finished: set[str] = set()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.finished.add(json.loads(line)["finished"])

    async def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no shutdown code runs, as in a crash
        await self.proc.wait()
        self._reader.cancel()

    async def stop(self) -> None:
        """Close its stdin (it exits cleanly), killing it if it does not."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGCONT)
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), PATIENCE)
            except TimeoutError:
                await self.kill()
        self._reader.cancel()


@pytest.fixture
async def workers(database_url: str) -> AsyncIterator[list[Worker]]:
    started: list[Worker] = []
    # seq: the order the bodies ran in (a sequence number is drawn at the insert).
    await execute(database_url, "CREATE TABLE side_effects (seq bigserial, "
                                "workflow_id text, step integer, pid integer)")
    yield started
    for worker in started:
        await worker.stop()


async def start_worker(url: str, workers: list[Worker], executor_id: str, prefix: str, *,
                       direct: int = 2, queued: int = 0, step_seconds: float = 0.5) -> Worker:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, executor_id, prefix, str(direct), str(queued),
        str(step_seconds), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), PATIENCE)
    if not line:
        _, err = await proc.communicate()
        raise AssertionError(f"the worker exited: {err.decode()}")
    worker = Worker(proc, json.loads(line))
    workers.append(worker)
    return worker


async def effects(url: str) -> dict[str, dict[int, list[int]]]:
    """workflow -> step -> the pids that ran its body, in order."""
    found: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row in await fetch(url, "SELECT workflow_id, step, pid FROM side_effects "
                                "ORDER BY seq"):
        found[row["workflow_id"]][row["step"]].append(row["pid"])
    return found


async def wait_in_step(url: str, worker: Worker, workflow_ids: list[str], step: int) -> None:
    """Wait until ``worker`` has begun at least step ``step`` of each workflow (a step sleeps
    after its side effect: a kill right after lands mid-step, before its checkpoint)."""
    async def reached() -> bool:
        ran = await effects(url)
        return all(any(worker.pid in ran[w][s] for s in ran[w] if s >= step)
                   for w in workflow_ids)

    await wait_until(reached, patience=PATIENCE, what=f"step {step} of {workflow_ids}")


async def owners(url: str, workflow_ids: set[str]) -> dict[str, str]:
    rows = await fetch(url, "SELECT workflow_uuid, executor_id FROM dbos.workflow_status "
                            "WHERE workflow_uuid = ANY($1)", list(workflow_ids))
    return {r["workflow_uuid"]: r["executor_id"] for r in rows}


async def kill_and_time_failover(url: str, victim: Worker) -> tuple[set[str], float]:
    """SIGKILL ``victim``; return the workflows it was running (its in-flight ones, taken
    over) and the seconds until live executors had taken every one of them."""
    loop = asyncio.get_running_loop()
    killed_at = loop.time()
    await victim.kill()
    ran = await effects(url)
    in_flight = {w for w, steps in ran.items()
                 if any(victim.pid in pids for pids in steps.values())}

    async def statuses() -> dict[str, tuple[str, str]]:
        rows = await fetch(url, "SELECT workflow_uuid, executor_id, status "
                                "FROM dbos.workflow_status WHERE workflow_uuid = ANY($1)",
                           list(in_flight))
        return {r["workflow_uuid"]: (r["executor_id"], r["status"]) for r in rows}

    async def taken() -> bool:
        # Moved to a live executor, or (still the victim's) finished before the kill.
        return all(owner != victim.executor_id or status == "SUCCESS"
                   for owner, status in (await statuses()).values())

    await wait_until(taken, patience=PATIENCE, what="the victim's workflows to be taken over")
    seconds = loop.time() - killed_at
    moved = {w for w, (owner, _) in (await statuses()).items() if owner != victim.executor_id}
    assert moved
    return moved, seconds


async def wait_all_succeeded(url: str) -> None:
    async def done() -> bool:
        rows = await fetch(url, "SELECT status FROM dbos.workflow_status")
        return bool(rows) and all(r["status"] == "SUCCESS" for r in rows)

    await wait_until(done, patience=PATIENCE, what="every workflow to succeed")


async def check_exactly_once(url: str, victim_pid: int, taken: set[str],
                             among: set[str] | None = None) -> None:
    """Each step whose checkpoint committed ran once; the step in flight at the kill ran at
    most once more (after the take-over); no live executor's workflow moved. Checks every
    workflow, or those ``among``."""
    ran = {w: steps for w, steps in (await effects(url)).items()
           if among is None or w in among}
    rows = await fetch(url, """SELECT workflow_uuid, count(*) AS n,
                                      array_agg(output ORDER BY function_id) AS outputs
                               FROM dbos.operation_outputs GROUP BY workflow_uuid""")
    checkpoints = {r["workflow_uuid"]: (r["n"], r["outputs"]) for r in rows}
    for workflow_id, steps in ran.items():
        assert checkpoints[workflow_id] == (
            fw.STEPS, [json.dumps(f"step-{i}") for i in range(fw.STEPS)]), workflow_id
        if workflow_id not in taken:
            # A live executor's workflow: one process ran every step, once.
            assert len({pid for pids in steps.values() for pid in pids}) == 1, steps
            assert all(len(steps[i]) == 1 for i in range(fw.STEPS)), steps
            continue
        by_victim = [i for i in range(fw.STEPS) if victim_pid in steps[i]]
        last = max(by_victim)
        assert by_victim == list(range(last + 1)), steps
        for i in range(fw.STEPS):
            if i < last:
                assert steps[i] == [victim_pid], (workflow_id, steps)  # checkpointed: once
            elif i == last:
                # In flight at the kill: at least once, here at most once more.
                assert steps[i][0] == victim_pid and len(steps[i]) <= 2, (workflow_id, steps)
            else:
                assert len(steps[i]) == 1 and steps[i] != [victim_pid], (workflow_id, steps)


def report(what: str, times: list[float]) -> None:
    print(f"\n{what}: failover after a kill: median {statistics.median(times):.2f} s, "
          f"max {max(times):.2f} s over {len(times)} kill(s) "
          f"(failover_after={fw.FAILOVER_AFTER} s)")


@pytest.mark.parametrize("executors", [2, 3])
async def test_a_killed_executors_workflows_are_taken_over_exactly_once(
    database_url: str, workers: list[Worker], executors: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = database_url
    # Two replicas configured with one ID run as "replica" and "replica-2"; three with
    # none run as "local", "local-2", "local-3".
    given = "replica" if executors == 2 else "-"
    survivors = [await start_worker(url, workers, given, f"w{n}", direct=2, queued=2)
                 for n in range(executors - 1)]
    # Started last, with slower steps, so the kill lands in the middle of its workflows.
    victim = await start_worker(url, workers, given, "w-victim", direct=2, queued=2,
                                step_seconds=1.0)
    assert len({w.executor_id for w in [*survivors, victim]}) == executors
    direct = ["w-victim-0", "w-victim-1"]
    await wait_in_step(url, victim, direct, 1)

    taken, seconds = await kill_and_time_failover(url, victim)
    assert set(direct) <= taken, "the kill must land mid-workflow"
    await wait_all_succeeded(url)
    await check_exactly_once(url, victim.pid, taken)
    survivor_ids = {w.executor_id for w in survivors}
    assert set((await owners(url, taken)).values()) <= survivor_ids
    for workflow_id in direct:
        row = await workflow_row(url, workflow_id)
        assert row is not None and row["recovery_attempts"] == 2  # claimed once
    with capsys.disabled():
        report(f"{executors} executors", [seconds])


async def test_failover_time_over_several_kills(
    database_url: str, workers: list[Worker], capsys: pytest.CaptureFixture[str],
) -> None:
    url = database_url
    await start_worker(url, workers, "-", "live", direct=0)
    times = []
    for cycle in range(5):
        victim = await start_worker(url, workers, "-", f"c{cycle}", direct=1, step_seconds=1.0)
        await wait_in_step(url, victim, [f"c{cycle}-0"], 1)
        taken, seconds = await kill_and_time_failover(url, victim)
        await wait_all_succeeded(url)
        await check_exactly_once(url, victim.pid, taken, among={f"c{cycle}-0"})
        times.append(seconds)
    with capsys.disabled():
        report("2 executors, repeated", times)


async def test_a_live_executors_workflows_are_never_taken(
    database_url: str, workers: list[Worker],
) -> None:
    url = database_url
    busy = await start_worker(url, workers, "-", "busy", direct=2, step_seconds=1.0)
    await wait_in_step(url, busy, ["busy-0", "busy-1"], 0)
    watcher = new_dbos(url, executor_id="watcher", application_version=fw.APP_VERSION,
                       failover_after=0.05)
    async with watcher:
        async def scanned() -> bool:
            return watcher._current_runtime.failover_scans >= 20

        await wait_until(scanned, patience=PATIENCE, what="20 failover scans")
        rows = await fetch(url, "SELECT status, executor_id, recovery_attempts "
                                "FROM dbos.workflow_status")
        # Still running when the scans ran (else they proved nothing), and still its own.
        assert [(r["status"], r["executor_id"], r["recovery_attempts"]) for r in rows] == [
            ("PENDING", busy.executor_id, 1)] * 2

    async def finished() -> bool:
        return busy.finished == {"busy-0", "busy-1"}

    await wait_until(finished, patience=PATIENCE, what="the busy executor's workflows")
    await check_exactly_once(url, busy.pid, set())


async def test_a_partitioned_zombie_records_nothing_after_the_take_over(
    database_url: str, workers: list[Worker],
) -> None:
    url = database_url
    zombie = await start_worker(url, workers, "-", "z", direct=1, step_seconds=1.0)
    taker, _, _ = fw.build(url, "taker", 0.05, failover_after=0.2)
    async with taker:
        await wait_in_step(url, zombie, ["z-0"], 1)
        zombie.proc.send_signal(signal.SIGSTOP)
        before = await effects(url)
        # The server ends the stopped process's ID lock session (as keepalives do across a
        # partition); its other connections stay open, as a zombie's would.
        key = taker._system_database.sql.executor_lock_key(zombie.executor_id)
        holder = await advisory_lock_holder(url, key)
        assert holder is not None
        await execute(url, "SELECT pg_terminate_backend($1::integer, 10000::bigint)", holder)

        async def taken_and_done() -> bool:
            row = await workflow_row(url, "z-0")
            return row is not None and row["executor_id"] == "taker" \
                and row["status"] == "SUCCESS"

        await wait_until(taken_and_done, patience=PATIENCE, what="the take-over")
        zombie.proc.send_signal(signal.SIGCONT)

        # The zombie's execution resumes in its step, is refused its checkpoint, stops and
        # reports the outcome the taker recorded.
        async def zombie_finished() -> bool:
            return "z-0" in zombie.finished

        await wait_until(zombie_finished, patience=PATIENCE, what="the zombie's execution")
    after = await effects(url)
    zombie_runs = [(s, p) for s, pids in after["z-0"].items() for p in pids if p == zombie.pid]
    assert zombie_runs == [(s, p) for s, pids in before["z-0"].items() for p in pids]
    await check_exactly_once(url, zombie.pid, {"z-0"})


# ---- In one process: the sharded schema ----


def register_blocking(dbos: DBOS, gate: asyncio.Event | None,
                      reached: asyncio.Event | None) -> Any:
    @dbos.step(name="blocking_step")
    async def blocking_step(i: int) -> str:
        if i == 1:
            if reached is not None:
                reached.set()
            if gate is not None:
                await gate.wait()
        return f"step-{i}"

    @dbos.workflow(name="blocking")
    async def blocking(tag: str) -> list[str]:
        return [f"{tag}:{await blocking_step(i)}" for i in range(3)]

    return blocking


async def test_failover_on_the_sharded_schema(database_url: str) -> None:
    url, keys = database_url, ["tenant-a", "tenant-b"]
    gone = new_dbos(url, sharding=True, executor_id="gone", shutdown_grace_period=0)
    reached = asyncio.Event()
    blocking = register_blocking(gone, asyncio.Event(), reached)
    async with gone:
        for key in keys:
            reached.clear()
            with SetShardKey(key), SetWorkflowID("same-id"):
                await gone.start_workflow(blocking, key)
            await asyncio.wait_for(reached.wait(), 30)
    # Its executor exited with both executions PENDING under one ID, one per key.
    taker = new_dbos(url, sharding=True, executor_id="taker", failover_after=0.2)
    register_blocking(taker, None, None)
    async with taker:
        for key in keys:
            handle = await taker.retrieve_workflow("same-id", shard_key=key)
            assert await asyncio.wait_for(handle.get_result(), 60) == [
                f"{key}:step-{i}" for i in range(3)]
    rows = await fetch(url, "SELECT shard_key, executor_id, recovery_attempts "
                            "FROM dbos.workflow_status ORDER BY shard_key")
    assert [tuple(r) for r in rows] == [(key, "taker", 2) for key in keys]



async def test_a_dead_executors_claimed_queued_workflow_is_taken_over(database_url: str) -> None:
    url = database_url
    gone = new_dbos(url, executor_id="gone", shutdown_grace_period=0)
    reached = asyncio.Event()
    blocking = register_blocking(gone, asyncio.Event(), reached)
    jobs = gone.register_queue(Queue("jobs", polling_interval=0.1))
    async with gone:
        with SetWorkflowID("queued"):
            await jobs.enqueue(blocking, "q")
        await asyncio.wait_for(reached.wait(), 30)
    # Claimed from its queue and left PENDING by an executor that is gone.
    row = await workflow_row(url, "queued")
    assert row is not None and (row["status"], row["executor_id"]) == ("PENDING", "gone")
    taker = new_dbos(url, executor_id="taker", failover_after=0.2)
    register_blocking(taker, None, None)
    taker.register_queue(Queue("jobs", polling_interval=0.1))
    async with taker:
        handle = await taker.retrieve_workflow("queued")
        assert await asyncio.wait_for(handle.get_result(), 60) == [
            f"q:step-{i}" for i in range(3)]
    row = await workflow_row(url, "queued")
    assert row is not None and (row["status"], row["executor_id"], row["queue_name"]) == (
        "SUCCESS", "taker", "jobs")
