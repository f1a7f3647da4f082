"""Leaving an executor that uses queues closes every transaction it owns: a claim or any
other pooled transaction cut by the exit's cancellation still commits or rolls back to
its end, so asyncpg never resets a connection with an active transaction (it used to say
so, as an error of the event loop, in about a third of the runs of an enqueue-and-exit
script).

The cause: the executor's task owners cancel with anyio cancel scopes, which cancel again
at every await, so the ROLLBACK that ends a cut transaction was cut too. A caller's own
``anyio.move_on_after`` around a listing did the same.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import anyio
from helpers import new_dbos

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from dbos_async import DBOS

    dbos = DBOS(name="exits", system_database_url=sys.argv[1], shutdown_grace_period=0)
    queue = dbos.queue("jobs")

    @dbos.workflow()
    async def double(n: int) -> int:
        return n * 2

    async def main():
        async with dbos:
            handles = [await queue.enqueue(double, i) for i in range(10)]
            print(await handles[0].get_result(), flush=True)

    asyncio.run(main())
    """
)

RUNS = 15

SHORT_PROGRAM = textwrap.dedent(
    """
    import asyncio, logging, sys
    from dbos_async import DBOS

    logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(message)s")
    dbos = DBOS(name="short", system_database_url=sys.argv[1])

    async def main():
        async with dbos:  # connect, migrate, start; nothing else to do
            pass
        print("hello world", flush=True)

    asyncio.run(main())
    """
)


def test_enqueue_and_exit_leaves_no_transaction_to_reset(database_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    for run in range(RUNS):
        done = subprocess.run([sys.executable, "-W", "default", "-c", SCRIPT, database_url],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "0"
        assert "active transaction" not in done.stderr, f"run {run}: {done.stderr}"
        assert "Traceback" not in done.stderr, f"run {run}: {done.stderr}"


def test_a_short_program_exits_without_a_warning(database_url: str) -> None:
    """Enter and leave at once: the background tasks (the scheduler's first read of
    the schedules among them) stop before the executor closes, so none of them fails on a
    closed executor and logs a traceback (it did in most runs: "Reading the schedules
    failed; retrying ... DBOS has been shut down")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    for run in range(RUNS):
        done = subprocess.run([sys.executable, "-c", SHORT_PROGRAM, database_url],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "hello world"
        assert done.stderr == "", f"run {run}: {done.stderr}"


async def test_a_cancel_scope_cutting_a_transaction_leaves_none_open(database_url: str) -> None:
    """A listing (a read-only transaction bounded by a statement timeout) cut at every
    point by anyio's level-triggered cancellation: each transaction still ends."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
    try:
        dbos = new_dbos(database_url)
        async with dbos:
            cut = 0
            for step in range(300):
                with anyio.move_on_after(step * 0.00002) as scope:
                    await dbos.list_workflows(limit=5)
                cut += scope.cancelled_caught
            assert cut > 0
            assert await dbos.list_workflows(limit=5) == []
    finally:
        loop.set_exception_handler(previous)
    assert [m for m in reported if "active transaction" in m] == []
