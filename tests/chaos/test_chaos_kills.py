"""kill -9 of a worker process at random points, over many cycles.

Each cycle starts a worker (``kill_worker.py``) that recovers what the previous, killed
worker left, starts workflows directly and through a queue, and is SIGKILLed after a random
delay, while steps are running. A last worker drains what is left. Then, against the side
table the step bodies write (``chaos_side_effects``: workflow, step, cycle of the process
that ran the body):

- no workflow is lost: every workflow whose start or enqueue a worker acknowledged ends in
  ``SUCCESS`` with the right result, and every one of its steps is checkpointed;
- no step whose checkpoint had committed ran again.

How the second check is counted: a step body writes its side-table row on a connection of
its own and commits it *before* its checkpoint is written, so the two are not atomic. A kill
between the two leaves a side row and no checkpoint; recovery rightly runs that step again
(at least once: the step was interrupted before its checkpoint). That re-run is not a
violation. What is one is a step body running in a later cycle than the first kill after
which its checkpoint was already in the database. So after each kill the test waits until
every connection of the dead process is gone from the server (a backend exits only once its
transaction committed or aborted, so no commit can land later), reads every checkpoint, and
notes for each new one the cycle it was first seen after. A side row whose cycle is later
than that is a step re-run after its checkpoint. A missed snapshot could only hide a re-run,
never invent one; the snapshots are complete, so neither happens.

The same cycles run on a sharded system database on a private Citus cluster (a coordinator
and two worker nodes), the workflows spread over keys held by both workers.

A kill "landed mid-workflow" when, at that moment, some workflow was ``PENDING`` and had a
step body started (a side row) by the killed process.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from helpers import execute, fetch, wait_no_connections
from kill_worker import connection_name

from dbos_async import migrate
from tests.helpers.citus_cluster import CitusCluster

pytestmark = pytest.mark.chaos

WORKER = Path(__file__).resolve().parent / "kill_worker.py"
STEPS = 4
STEP_SECONDS = 0.15
DIRECT_PER_CYCLE = 4
QUEUED_PER_CYCLE = 4
CYCLES_PER_SCALE = 3
CITUS_KEYS = 6


async def run_worker(url: str, cycle: int, direct: int, queued: int, keys: int, stderr: Path,
                     ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, str(cycle), str(direct), str(queued), str(STEPS),
        str(STEP_SECONDS), str(keys), stdout=asyncio.subprocess.PIPE, stderr=stderr.open("wb"))


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


async def read_line(proc: asyncio.subprocess.Process, expected: str, stderr: Path) -> None:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    if line.decode().strip() != expected:
        await proc.wait()
        raise AssertionError(f"worker said {line!r}, exit {proc.returncode}: {tail(stderr)}")


async def checkpoints(url: str) -> set[tuple[str, int]]:
    rows = await fetch(url, "SELECT workflow_uuid, function_id FROM dbos.operation_outputs")
    return {(r["workflow_uuid"], r["function_id"]) for r in rows}


async def test_kill_nine_cycles_lose_nothing_and_rerun_no_checkpointed_step(
    database_url: str, scale: int, chaos_figures: Counter[str], tmp_path: Path,
) -> None:
    async def settle(cycle: int) -> None:
        await wait_no_connections(database_url, connection_name(cycle), patience=60)

    await kill_cycles(database_url, 0, settle, CYCLES_PER_SCALE * scale, chaos_figures,
                      tmp_path)


@pytest.mark.citus
async def test_kill_nine_cycles_on_citus_lose_nothing_and_rerun_no_checkpointed_step(
    citus_cluster: CitusCluster, scale: int, chaos_figures: Counter[str], tmp_path: Path,
) -> None:
    """The same on a sharded system database on Citus, the workflows spread over keys held by
    both worker nodes, each process given the coordinator's URL. A killed process's
    transactions are over once its sessions are gone from every node (an executor may
    connect to any) and the coordinator has resolved any transaction it left prepared on
    the workers."""
    url = citus_cluster.url()
    await migrate(url, sharding=True)  # the tables distributed: the keys' nodes known
    held_by = {await citus_cluster.node_of(f"tenant-{i}") for i in range(CITUS_KEYS)}
    assert held_by == set(citus_cluster.workers), "the keys must span both worker nodes"

    async def settle(cycle: int) -> None:
        for node in range(len(citus_cluster.nodes)):
            await wait_no_connections(citus_cluster.url(node), connection_name(cycle),
                                      patience=60)
        await execute(url, "SELECT recover_prepared_transactions()")

    await kill_cycles(url, CITUS_KEYS, settle, CYCLES_PER_SCALE * scale, chaos_figures,
                      tmp_path)


async def kill_cycles(url: str, keys: int, settle: Callable[[int], Awaitable[None]],
                      cycles: int, chaos_figures: Counter[str], tmp_path: Path) -> None:
    """``cycles`` kill cycles on the system database ``url`` (sharded over ``keys`` keys, or
    not if 0), then the drain and the checks (see the module docstring). ``settle(cycle)``
    returns once the process killed in ``cycle`` can commit nothing more."""
    sharded = keys > 0
    await execute(url, "CREATE TABLE chaos_side_effects "
                       "(workflow_id text NOT NULL, step_id int NOT NULL, cycle int NOT NULL)")
    rng = random.Random()
    first_seen: dict[tuple[str, int], int] = {}  # checkpoint -> first kill it existed at
    expected: set[str] = set()
    for cycle in range(cycles):
        stderr = tmp_path / f"worker-{cycle}.err"
        proc = await run_worker(url, cycle, DIRECT_PER_CYCLE, QUEUED_PER_CYCLE, keys, stderr)
        try:
            await read_line(proc, "ready", stderr)
            expected.update(f"direct-{cycle}-{i}" for i in range(DIRECT_PER_CYCLE))
            expected.update(f"queued-{cycle}-{i}" for i in range(QUEUED_PER_CYCLE))
            await asyncio.sleep(rng.uniform(0.05, STEPS * STEP_SECONDS * 0.9))
        finally:
            proc.kill()  # SIGKILL: no shutdown code runs
            await proc.wait()
        assert proc.returncode == -9, tail(stderr)
        await settle(cycle)
        for checkpoint in await checkpoints(url):
            first_seen.setdefault(checkpoint, cycle)
        in_flight = await fetch(
            url,
            """SELECT s.workflow_id, s.step_id FROM chaos_side_effects s
               WHERE s.cycle = $1 AND s.workflow_id = ANY(
                   SELECT workflow_uuid FROM dbos.workflow_status WHERE status = 'PENDING')""",
            cycle)
        chaos_figures["cycles"] += 1
        if in_flight:
            chaos_figures["kills_mid_workflow"] += 1
        chaos_figures["steps_in_flight_at_kill"] += sum(
            (r["workflow_id"], r["step_id"]) not in first_seen for r in in_flight)

    stderr = tmp_path / "worker-drain.err"
    proc = await run_worker(url, cycles, 0, 0, keys, stderr)
    try:
        await read_line(proc, "drained", stderr)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, tail(stderr)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    # On a sharded schema a workflow's rows are joined by key and ID (on Citus the join
    # must name the distribution column).
    joined_by = "shard_key, workflow_uuid" if sharded else "workflow_uuid"
    rows = await fetch(
        url,
        f"""SELECT ws.workflow_uuid, ws.status, COALESCE(wo.output, ws.output) AS output
            FROM dbos.workflow_status ws LEFT JOIN dbos.workflow_output wo USING ({joined_by})""")
    result = sum(i * i for i in range(STEPS))
    done = {r["workflow_uuid"] for r in rows
            if r["status"] == "SUCCESS" and json.loads(r["output"]) == result}
    final = await checkpoints(url)
    complete = {wf for wf in expected if all((wf, i) in final for i in range(STEPS))}
    lost = sorted(expected - (done & complete))
    reruns = [
        (r["workflow_id"], r["step_id"], r["cycle"], first_seen[(r["workflow_id"], r["step_id"])])
        for r in await fetch(url, "SELECT * FROM chaos_side_effects")
        if r["cycle"] > first_seen.get((r["workflow_id"], r["step_id"]), cycles)
    ]
    chaos_figures["workflows_checked"] += len(expected)
    chaos_figures["workflows_lost"] += len(lost)
    chaos_figures["steps_rerun_after_checkpoint"] += len(reruns)
    assert {r["workflow_uuid"] for r in rows} == expected
    assert lost == []
    assert reruns == [], "(workflow, step, cycle that ran it, first kill its checkpoint existed at)"
    assert chaos_figures["kills_mid_workflow"] > 0, "no kill landed mid-workflow: nothing tested"
