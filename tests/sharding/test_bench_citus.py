"""The parts of the Citus benchmark (benchmarks/bench_citus.py) that need no cluster: the
capacity projection's arithmetic, a process tree's CPU time read from /proc (on this test's
own process and a child it waits for), recognising a local backend, and the round trips
counted at asyncpg's calls (in a child process, against the test server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_citus  # noqa: E402
import server_cpu  # noqa: E402
from round_trips import classify  # noqa: E402

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="needs Linux's /proc")


def test_projection_is_bound_by_the_coordinator_once_the_workers_outgrow_it() -> None:
    # 10 ms of coordinator and 10 ms of all workers per workflow, nodes of 2 cores.
    rows = bench_citus.project(0.010, 0.010, cores=2, worker_counts=(1, 2, 4))
    assert [(r.workers, r.bound) for r in rows] == [
        (1, "workers"), (2, "coordinator"), (4, "coordinator")]
    assert [round(r.workflows_per_s, 6) for r in rows] == [200.0, 200.0, 200.0]
    assert [round(r.linear, 6) for r in rows] == [200.0, 400.0, 800.0]
    assert [round(r.ratio_to_linear, 6) for r in rows] == [1.0, 0.5, 0.25]


def test_projection_without_coordinator_work_is_linear() -> None:
    rows = bench_citus.project(0.0, 0.004, cores=1, worker_counts=(2, 16))
    assert [(r.workflows_per_s, r.bound, r.ratio_to_linear) for r in rows] == [
        (500.0, "workers", 1.0), (4000.0, "workers", 1.0)]


def test_stat_line_fields_after_a_command_name_with_spaces_and_parentheses() -> None:
    fields = ["S", "7"] + ["0"] * 9 + ["11", "12", "13", "14"] + ["0"] * 4 + ["99"]
    times = server_cpu.parse_stat("4242 (post (gres) x) " + " ".join(fields) + " 0 0\n")
    assert times == server_cpu.ProcessTimes(pid=4242, parent=7, started=99, user=11,
                                            system=12, children_user=13, children_system=14)


@needs_proc
def test_own_process_times_match_the_kernels_accounting() -> None:
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # some CPU time to read
        pass
    ours = server_cpu.read_process(os.getpid())
    kernel = os.times()
    assert ours is not None
    assert ours.parent == os.getppid()
    assert abs(ours.user / server_cpu.TICKS_PER_SECOND - kernel.user) < 0.05
    assert abs(ours.system / server_cpu.TICKS_PER_SECOND - kernel.system) < 0.05
    assert ours.user > 0


@needs_proc
def test_a_tree_counts_a_live_child_then_the_same_time_once_it_is_reaped() -> None:
    spin = ("import time\nend = time.process_time() + 0.3\n"
            "while time.process_time() < end: pass\ninput()\n")
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE)
    try:
        before = server_cpu.read_trees([os.getpid()])[os.getpid()]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the child has spun (then it reads stdin)
            reading = server_cpu.read_trees([os.getpid()])[os.getpid()]
            own = [used for (pid, _), used in reading.children.items() if pid == child.pid]
            if own and own[0] >= 0.3 * server_cpu.TICKS_PER_SECOND - 2:
                break
            time.sleep(0.01)
        alive = server_cpu.read_trees([os.getpid()])[os.getpid()]
        assert any(pid == child.pid for pid, _ in alive.children)
        assert server_cpu.children_seconds_between(before, alive, [child.pid]) >= 0.25
    finally:
        child.communicate(b"\n")
    reaped = server_cpu.read_trees([os.getpid()])[os.getpid()]
    assert not any(pid == child.pid for pid, _ in reaped.children)
    # Its time moved into cutime/cstime: the tree did not lose it.
    assert server_cpu.seconds_between(alive, reaped) >= 0
    assert server_cpu.seconds_between(before, reaped) >= 0.25


def fake_process(proc: Path, pid: int, name: str, parent: int, title: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "status").write_text(f"Name:\t{name}\nState:\tS\nPPid:\t{parent}\n")
    (proc / str(pid) / "cmdline").write_bytes(title.encode())


def test_a_backend_is_recognised_by_its_name_and_the_client_port_in_its_title(
        tmp_path: Path) -> None:
    fake_process(tmp_path, 100, "postgres", 42, "postgres: app shop 127.0.0.1(5555) idle")
    fake_process(tmp_path, 101, "postgres", 43, "postgres: app shop [local] idle")
    fake_process(tmp_path, 102, "python3", 44, "python3 worker.py (5555)")
    assert server_cpu.postmaster_of(100, 5555, tmp_path) == 42
    assert server_cpu.postmaster_of(100, 5556, tmp_path) is None  # another machine's PID
    assert server_cpu.postmaster_of(101, None, tmp_path) == 43
    assert server_cpu.postmaster_of(102, 5555, tmp_path) is None
    assert server_cpu.postmaster_of(103, 5555, tmp_path) is None  # no such process


def test_statements_are_classified_by_verb_and_first_table() -> None:
    assert classify("fetchmany", 'INSERT INTO "dbos".operation_outputs (a) VALUES ($1)') \
        == "INSERT operation_outputs (fetchmany)"
    assert classify("fetchrow", "SELECT status FROM dbos.workflow_status WHERE x = $1 "
                    "FOR NO KEY UPDATE") == "SELECT workflow_status FOR UPDATE"
    assert classify("execute", "UPDATE dbos.workflow_status SET status = $1") \
        == "UPDATE workflow_status"
    assert classify("fetchval", "SELECT set_config($1, $2, true)") \
        == "SELECT set_config($1, $2, true)"


COUNTING = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
import asyncpg, round_trips

async def main():
    round_trips.install()
    conn = await asyncpg.connect(sys.argv[2])
    pool = await asyncpg.create_pool(sys.argv[2], min_size=1, max_size=1)
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1")
            await conn.fetchmany("SELECT $1::int", [(1,), (2,), (3,)])
        await pool.fetchval("SELECT 2")
        before = round_trips.COUNTER.snapshot()
        with round_trips.not_counted():
            await conn.fetchval("SELECT 3")
        ignored = round_trips.COUNTER.since(before).round_trips
    finally:
        await pool.close()
        await conn.close()
    counted = round_trips.COUNTER
    print(json.dumps({"round_trips": counted.round_trips,
                      "statements": counted.statement_count,
                      "transactions": dict(counted.transactions),
                      "by_kind": dict(counted.by_kind()), "ignored": ignored}))

asyncio.run(main())
"""


def test_round_trips_are_counted_once_per_call(database_url: str) -> None:
    out = subprocess.run([sys.executable, "-c", COUNTING, str(BENCHMARKS), database_url],
                         capture_output=True, text=True, timeout=60, check=True)
    counted = json.loads(out.stdout)
    # BEGIN and COMMIT are sent with execute: counted as transaction control only.
    assert counted["transactions"] == {"BEGIN": 1, "COMMIT": 1}
    # execute, fetchmany (one round trip), pool.fetchval (once, not again as the
    # connection's), and the reset query asyncpg's pool sends on release by default.
    assert counted["statements"] == 4
    assert counted["round_trips"] == 6
    kinds = counted["by_kind"]
    assert (kinds["SELECT 1"], kinds["SELECT $1::int (fetchmany)"], kinds["SELECT 2"]) == (1, 1, 1)
    assert kinds["SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLIST"] == 1
    assert counted["ignored"] == 0
