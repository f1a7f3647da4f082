"""dbos_async: N three-step workflows started concurrently, with every statement counted.

Two independent counts of what the measured run sends to PostgreSQL:

- client side: a query logger (``Connection.add_query_logger``) on every connection of the
  executor's pool, classifying each statement (workflow start, step checkpoint, workflow
  finish, asyncpg's pool reset, anything else);
- server side: ``pg_stat_database.xact_commit`` of the benchmark database (every autocommit
  statement is one committed transaction) and ``pg_stat_user_tables.n_tup_ins`` of
  ``workflow_status`` and ``operation_outputs``.

Server statistics are flushed lazily by each backend, so both readings are taken right after
``pg_stat_force_next_flush()`` has run on every pool connection. The statements the benchmark
itself sends for that (flushes, the readings, the resets after it releases the connections)
are logged too, outside the measured window, and subtracted from the server's count.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from common import drive

from dbos_async import DBOS, SetShardKey

STATS_QUERY = """
SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
         AS xact_commit,
       (SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables
         WHERE relname = 'workflow_status') AS status_inserts,
       (SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables
         WHERE relname = 'operation_outputs') AS step_inserts"""

FLUSH = "SELECT pg_stat_force_next_flush()"

_START = re.compile(r"INSERT\s+INTO\s+\S*workflow_status\b", re.IGNORECASE)
_STEP = re.compile(r"INSERT\s+INTO\s+\S*operation_outputs\b", re.IGNORECASE)
_FINISH = re.compile(r"UPDATE\s+\S*workflow_status\b", re.IGNORECASE)
_RESET = re.compile(r"^\s*SELECT\s+pg_advisory_unlock_all\(\)", re.IGNORECASE)


def classify(query: str) -> str:
    if _RESET.search(query):
        return "pool reset"
    if _START.search(query):
        return "workflow start"
    if _STEP.search(query):
        return "step checkpoint"
    if _FINISH.search(query):
        return "workflow finish"
    return "other: " + " ".join(query.split())[:70]


@dataclass(eq=False)  # hashable by identity: asyncpg keeps loggers in a set
class QueryCounter:
    """A query logger: counts statements by text, in the phase they completed in.

    Kept cheap on the hot path (one dict increment); statements are classified afterwards.
    """

    phase: str = "idle"
    texts: dict[str, Counter[str]] = field(default_factory=dict)

    def __call__(self, record: Any) -> None:
        phase = self.texts.get(self.phase)
        if phase is None:
            phase = self.texts[self.phase] = Counter()
        phase[record.query] += 1

    def by_kind(self, phase: str) -> Counter[str]:
        kinds: Counter[str] = Counter()
        for text, count in self.texts.get(phase, Counter()).items():
            kinds[classify(text)] += count
        return kinds

    def total(self, phase: str) -> int:
        return sum(self.texts.get(phase, Counter()).values())


async def _settle() -> None:
    """Let query-logger callbacks (scheduled with call_soon) run."""
    for _ in range(3):
        await asyncio.sleep(0)


async def _all_connections(pool: asyncpg.Pool) -> list[Any]:
    """Check out every open connection of an idle pool."""
    return [await pool.acquire() for _ in range(pool.get_size())]


def workload(dbos: DBOS) -> Any:
    """The measured workflow: three trivial steps, each checkpointed."""
    @dbos.step()
    async def add_one(x: int) -> int:
        return x + 1

    @dbos.step()
    async def double(x: int) -> int:
        return x * 2

    @dbos.step()
    async def subtract_two(x: int) -> int:
        return x - 2

    @dbos.workflow()
    async def three_steps(x: int) -> int:
        return await subtract_two(await double(await add_one(x)))

    return three_steps


async def run(url: str, *, workflows: int, concurrency: int, pool_size: int, warmup: int,
              profile: bool = False, shard_keys: int = 0) -> dict[str, Any]:
    """With ``shard_keys``, the sharded system schema, workflows spread over that many
    keys."""
    dbos = DBOS(system_database_url=url, pool_size=pool_size, name="bench_dbos_async",
                application_version="bench", sharding=shard_keys > 0)
    three_steps = workload(dbos)
    counter = QueryCounter()
    profiler = cProfile.Profile() if profile else None

    async def one(i: int) -> None:
        if shard_keys:
            with SetShardKey(f"tenant-{i % shard_keys}"):
                handle = await dbos.start_workflow(three_steps, i)
        else:
            handle = await dbos.start_workflow(three_steps, i)
        result = await handle.get_result()
        if result != (i + 1) * 2 - 2:
            raise RuntimeError(f"workflow {i} returned {result!r}")

    async with dbos:
        await drive(warmup, concurrency, one)
        pool = dbos.system_database.pool
        size_before = pool.get_size()

        conns = await _all_connections(pool)
        for conn in conns:
            await conn.execute(FLUSH)
        counter.phase = "pre"
        for conn in conns:
            conn.add_query_logger(counter)
        before = await conns[0].fetchrow(STATS_QUERY)
        for conn in conns:
            await pool.release(conn)
        await _settle()

        counter.phase = "run"
        if profiler is not None:
            profiler.enable()
        elapsed = await drive(workflows, concurrency, one)
        if profiler is not None:
            profiler.disable()
        await _settle()

        counter.phase = "post"
        size_after = pool.get_size()
        conns = await _all_connections(pool)
        for conn in conns:
            conn.add_query_logger(counter)  # a no-op unless it was opened during the run
            await conn.execute(FLUSH)
        after = await conns[0].fetchrow(STATS_QUERY)
        await _settle()
        for conn in conns:
            conn.remove_query_logger(counter)
            await pool.release(conn)

    run_counts = counter.by_kind("run")
    # The benchmark's own statements: pre (the reading, the resets of the release) and post
    # (the flushes; the final reading commits after it reads, so it is not in `after`).
    own = counter.total("pre") + counter.total("post") - 1
    commits = after["xact_commit"] - before["xact_commit"] - own

    result: dict[str, Any] = {
        "workflows": workflows,
        "warmup": warmup,
        "steps": workflows * 3,
        "seconds": elapsed,
        "workflows_per_s": workflows / elapsed,
        "steps_per_s": workflows * 3 / elapsed,
        "pool_size": pool_size,
        "pool_connections": [size_before, size_after],
        "statements": statement_figures(run_counts, workflows, workflows * 3),
        "server": {
            "xact_commits": commits,
            "commits_per_workflow": commits / workflows,
            "workflow_status_inserts": after["status_inserts"] - before["status_inserts"],
            "operation_outputs_inserts": after["step_inserts"] - before["step_inserts"],
        },
    }
    if profiler is not None:
        result["profile"] = _profile_report(profiler)
    return result


def statement_figures(kinds: Counter[str], workflows: int, steps: int) -> dict[str, Any]:
    """Statements and round trips per workflow and per step, from counts by kind.

    Per step: (all statements - workflow starts - workflow finishes) / steps. asyncpg's pool
    reset, when the pool sends one, follows every pool operation, so for round trips each
    statement is charged its share of resets.
    """
    resets = kinds["pool reset"]
    total = sum(kinds.values())
    statements = total - resets  # what dbos_async itself sends
    per_step = (statements - kinds["workflow start"] - kinds["workflow finish"]) / steps
    reset_share = resets / statements if statements else 0.0
    return {
        "by_kind": dict(kinds.most_common()),
        "total_with_pool_reset": total,
        "total_without_pool_reset": statements,
        "pool_resets_per_statement": reset_share,
        # Without the resets: the SQL dbos_async issues.
        "per_workflow": statements / workflows,
        "per_step": per_step,
        # With them: round trips on the wire.
        "round_trips_per_workflow": total / workflows,
        "round_trips_per_step": per_step * (1 + reset_share),
    }


def _profile_report(profiler: cProfile.Profile, limit: int = 25) -> dict[str, str]:
    report = {}
    for title, sort, restriction in (
        ("all, by own time", "tottime", limit),
        ("dbos_async code, by own time", "tottime", "dbos_async"),
        ("dbos_async code, by cumulative time", "cumulative", "dbos_async"),
    ):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).sort_stats(sort)
        if isinstance(restriction, str):
            stats.print_stats(restriction, limit)
        else:
            stats.print_stats(restriction)
        report[title] = out.getvalue()
    return report
