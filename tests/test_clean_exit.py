"""Leaving an executor that uses queues closes every transaction it owns: a claim or any
other pooled transaction cut by the exit's cancellation still commits or rolls back to
its end, so asyncpg never resets a connection with an active transaction (it used to say
so, as an error of the event loop, in about a third of the runs of this script)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


def test_enqueue_and_exit_leaves_no_transaction_to_reset(database_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    for run in range(RUNS):
        done = subprocess.run([sys.executable, "-W", "default", "-c", SCRIPT, database_url],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "0"
        assert "active transaction" not in done.stderr, f"run {run}: {done.stderr}"
        assert "Traceback" not in done.stderr, f"run {run}: {done.stderr}"
