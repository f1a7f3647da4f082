"""A primary failover under a running executor, and an old primary that comes back.

Real servers (:mod:`helpers.replicated_pair`: a primary and its synchronous streaming
standby from the machine's initdb/pg_ctl; skipped where those are missing) and a real
executor process (``standby_worker.py``) reaching them through a multi-host URL with
``target_session_attrs=read-write``, the primary listed first. The executor runs workflows of
several steps; mid-run the primary's postmaster is SIGKILLed and the standby promoted, as an
HA manager would (the last step of every workflow waits for the promotion, so the kill always
lands mid-run). Every step body appends a line to a file outside the database, so a
body that runs twice shows twice whatever the servers lose.

- Every workflow completes, each step body ran exactly once (the executor lived through the
  failover: nothing it checkpointed, nor anything in flight, runs again).
- The old primary brought back writable as it was (its old timeline, its stale ``PENDING``
  workflows), still listed first: the running executor, whose connections are cut, refuses it
  and reconnects to the new primary; a fresh executor entering warns of two writable
  primaries and never uses the older one; no step body runs again and the workflows on the
  new primary stay ``SUCCESS``.
- Two writable primaries on the same timeline cannot be told apart: entering is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import execute, fetch, fetchval, wait_no_connections
from helpers.replicated_pair import ReplicatedPair, postgres_url
from standby_worker import CONNECTION_NAME, build

from dbos_async import DBOS, DatabaseUnavailableError
from dbos_async.testing import servers

pytestmark = pytest.mark.chaos

WORKER = Path(__file__).resolve().parent / "standby_worker.py"
DATABASE = "dbos_failover"
WORKFLOWS_PER_SCALE = 8
STEPS = 4
STEP_SECONDS = 0.1
PATIENCE = 120.0


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    try:
        replicated = ReplicatedPair.start(synchronous=True)
    except servers.Unavailable as why:
        pytest.skip(f"no local PostgreSQL programs for a replicated pair: {why}")
    try:
        yield replicated
    finally:
        replicated.stop()


@dataclass
class Failover:
    """What :func:`run_through_failover` left: the executor still running, and when."""

    worker: asyncio.subprocess.Process
    stderr: Path
    effects: Path
    workflows: list[str]
    promoted_at: float
    seconds_to_first_step: float

    async def read_line(self, expected: str) -> None:
        assert self.worker.stdout is not None
        line = await asyncio.wait_for(self.worker.stdout.readline(), PATIENCE)
        if line.decode().strip() != expected:
            await self.worker.wait()
            raise AssertionError(f"worker said {line!r}, exit {self.worker.returncode}: "
                                 f"{self.stderr.read_text(errors='replace')[-3000:]}")

    async def stop(self) -> None:
        if self.worker.returncode is None:
            assert self.worker.stdin is not None
            self.worker.stdin.close()
            try:
                await asyncio.wait_for(self.worker.wait(), PATIENCE)
            except TimeoutError:
                self.worker.kill()
                await self.worker.wait()


def bodies_run(effects: Path) -> Counter[tuple[str, int]]:
    """How many times each (workflow, step) body ran, by the worker's file."""
    runs: Counter[tuple[str, int]] = Counter()
    for line in effects.read_text().splitlines():
        workflow_id, step_id, _pid = line.split()
        runs[(workflow_id, int(step_id))] += 1
    return runs


async def checkpoint_count(url: str) -> int:
    return int(await fetchval(url, "SELECT count(*) FROM dbos.operation_outputs"))


async def run_through_failover(pair: ReplicatedPair, scale: int, tmp_path: Path,
                               form: str = "query") -> Failover:
    """Start the executor on the multi-host URL (in ``form``), kill the primary once a
    third of the steps are checkpointed, promote the standby, and wait until every
    workflow finished."""
    await execute(pair.url("postgres", [pair.primary_port]), f"CREATE DATABASE {DATABASE}")
    url, new_primary = pair.url(DATABASE, form=form), pair.url(DATABASE, [pair.standby_port])
    workflows = WORKFLOWS_PER_SCALE * scale
    effects, stderr = tmp_path / "effects.txt", tmp_path / "worker.err"
    effects.touch()
    worker = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, str(effects), str(workflows), str(STEPS),
        str(STEP_SECONDS), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=stderr.open("wb"))
    run = Failover(worker, stderr, effects, [], 0.0, 0.0)
    try:
        await run.read_line("ready")
        old_primary = pair.url(DATABASE, [pair.primary_port])
        deadline = time.monotonic() + PATIENCE
        while await checkpoint_count(old_primary) < workflows * STEPS // 3:
            assert time.monotonic() < deadline, "the workflows made no progress"
            await asyncio.sleep(0.01)
        await asyncio.to_thread(pair.kill_primary)
        run.promoted_at = await asyncio.to_thread(pair.promote_standby)
        # The first checkpoint committed on the new primary.
        promoted_with = await checkpoint_count(new_primary)
        worker.send_signal(signal.SIGUSR1)
        while await checkpoint_count(new_primary) == promoted_with:
            assert time.monotonic() < deadline, "no step completed after the promotion"
            await asyncio.sleep(0.005)
        run.seconds_to_first_step = time.time() - run.promoted_at
        await run.read_line("done")
    except BaseException:
        await run.stop()
        raise
    rows = await fetch(new_primary, "SELECT workflow_uuid FROM dbos.workflow_status")
    run.workflows = sorted(r["workflow_uuid"] for r in rows)
    return run


async def check_all_succeeded_once(url: str, run: Failover, expected: int,
                                   figures: Counter[str]) -> None:
    """Every workflow SUCCESS with its result and every step checkpointed, on ``url``;
    every step body ran exactly once."""
    rows = await fetch(url, """SELECT ws.workflow_uuid, ws.status,
                                      COALESCE(wo.output, ws.output) AS output
                               FROM dbos.workflow_status ws
                               LEFT JOIN dbos.workflow_output wo USING (workflow_uuid)""")
    steps = await fetch(url, "SELECT workflow_uuid, function_id FROM dbos.operation_outputs")
    checkpointed = {(r["workflow_uuid"], r["function_id"]) for r in steps}
    result = sum(range(STEPS))
    lost = sorted(r["workflow_uuid"] for r in rows
                  if r["status"] != "SUCCESS" or json.loads(r["output"]) != result
                  or any((r["workflow_uuid"], i) not in checkpointed for i in range(STEPS)))
    runs = bodies_run(run.effects)
    again = sorted(key for key, count in runs.items() if count > 1)
    figures["workflows_checked"] += len(rows)
    figures["workflows_lost"] += len(lost)
    figures["steps_rerun_after_checkpoint"] += len(again)
    assert len(rows) == expected
    assert lost == []
    assert again == [], "(workflow, step) bodies that ran more than once"
    assert set(runs) == checkpointed


def report(run: Failover) -> None:
    print(f"\nprimary failover: first checkpoint on the new primary "
          f"{run.seconds_to_first_step:.2f} s after its promotion")


@pytest.mark.parametrize("form", ["query", "comma"])
async def test_a_primary_failover_loses_no_workflow_and_runs_no_step_twice(
    pair: ReplicatedPair, scale: int, chaos_figures: Counter[str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str], form: str,
) -> None:
    run = await run_through_failover(pair, scale, tmp_path, form)
    try:
        chaos_figures["primary_failovers"] += 1
        await check_all_succeeded_once(pair.url(DATABASE, [pair.standby_port]), run,
                                       WORKFLOWS_PER_SCALE * scale, chaos_figures)
        # The promoted standby requires no synchronous standby of its own: writes return.
        run.worker.stdin.write(b"more 2\n")  # type: ignore[union-attr]
        await run.read_line("done")
    finally:
        await run.stop()
    with capsys.disabled():
        report(run)


async def test_an_old_primary_back_with_stale_data_is_refused(
    pair: ReplicatedPair, scale: int, chaos_figures: Counter[str], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = await run_through_failover(pair, scale, tmp_path)
    new_primary = pair.url(DATABASE, [pair.standby_port])
    old_primary = pair.url(DATABASE, [pair.primary_port])
    try:
        await asyncio.to_thread(pair.restart_old_primary)
        stale = await fetchval(old_primary, "SELECT count(*) FROM dbos.workflow_status "
                                            "WHERE status = 'PENDING'")
        assert stale > 0, "the old primary must hold stale PENDING workflows"
        # The running executor has used the new primary's timeline: once its connections
        # are cut, it reconnects through the URL, whose first server is the old primary.
        await execute(new_primary, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                   "WHERE application_name = $1", CONNECTION_NAME)
        run.worker.stdin.write(b"more 2\n")  # type: ignore[union-attr]
        await run.read_line("done")
    finally:
        await run.stop()
    assert f"Refusing the system database server 127.0.0.1:{pair.primary_port}: a primary " \
           "on timeline 1, older than timeline 2" in run.stderr.read_text()

    # A fresh executor (the same executor ID: it recovers that ID's PENDING workflows)
    # enters through the same URL, the old primary first.
    caplog.set_level(logging.WARNING, logger="dbos_async")
    before = bodies_run(run.effects)
    promoted = asyncio.Event()
    promoted.set()
    dbos, chain = build(pair.url(DATABASE), run.effects, STEP_SECONDS, promoted)
    async with dbos:
        assert await (await dbos.start_workflow(chain, STEPS)).get_result() == sum(range(STEPS))
        await wait_no_connections(old_primary, CONNECTION_NAME)
    warned = [r.getMessage() for r in caplog.records if "writable primaries" in r.getMessage()]
    assert warned == [f"Several writable primaries: 127.0.0.1:{pair.primary_port} on timeline "
                      f"1, 127.0.0.1:{pair.standby_port} on timeline 2; refusing the older; "
                      "fence it off"]
    after = bodies_run(run.effects)
    assert {key: n for key, n in after.items() if key[0] in run.workflows} == {
        key: n for key, n in before.items() if key[0] in run.workflows}
    await check_all_succeeded_once(new_primary, run, len(run.workflows) + 3, chaos_figures)
    # Nothing of either executor's reached the old primary after it came back.
    assert await fetchval(old_primary, "SELECT count(*) FROM dbos.workflow_status "
                                       "WHERE status = 'PENDING'") == stale
    assert await fetchval(old_primary, "SELECT count(*) FROM dbos.workflow_status "
                                       "WHERE workflow_uuid LIKE 'more-%'") == 0


async def test_two_writable_primaries_on_one_timeline_refuse_the_entry() -> None:
    try:
        bindir, user = servers._check_local()
    except servers.Unavailable as why:
        pytest.skip(f"no local PostgreSQL programs: {why}")
    first, second = (servers.start_local_cluster(bindir, user) for _ in range(2))
    try:
        ports = [int(s.url.rsplit(":", 1)[1].split("/")[0]) for s in (first, second)]
        dbos = DBOS(system_database_url=postgres_url(ports, "postgres"),
                    db_retry_timeout=60, connection_name=CONNECTION_NAME)
        with pytest.raises(DatabaseUnavailableError) as refused:
            async with dbos:
                pass
        assert str(refused.value) == (
            f"Several writable primaries on the same timeline 1 (127.0.0.1:{ports[0]} on "
            f"timeline 1, 127.0.0.1:{ports[1]} on timeline 1): which one holds the system "
            "database's latest state cannot be told; refusing to use either. Fence off all "
            "but one")
        for server in (first, second):
            await wait_no_connections(server.url, CONNECTION_NAME)
            assert await fetchval(server.url, "SELECT to_regclass('dbos.workflow_status')") \
                is None
    finally:
        first.stop()
        second.stop()
