"""Schedules shared with the `dbos` package (3.4.0), run in subprocesses: one created by
its client is fired by a dbos_async executor, and one created by dbos_async is listed and
fired by a `dbos` executor, both configured for portable JSON. Both name a fired time's
workflow ``sched-{name}-{ISO time}``, so a time either fires is one workflow."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from datetime import datetime
from typing import Any

from helpers import fetch, new_dbos, wait_until

PATIENCE = 60.0

_DBOS_CLIENT_SCRIPT = textwrap.dedent(
    """
    import sys
    from dbos import DBOSClient
    from dbos._serialization import DBOSPortableJSON

    client = DBOSClient(system_database_url=sys.argv[1], serializer=DBOSPortableJSON)
    try:
        client.create_schedule(schedule_name="from-dbos", workflow_name="interop_tick",
                               schedule="* * * * * *", context={"by": "dbos"})
    finally:
        client.destroy()
    """
)

_DBOS_EXECUTOR_SCRIPT = textwrap.dedent(
    """
    import json, sys, threading
    from dbos import DBOS
    from dbos._serialization import DBOSPortableJSON

    DBOS(config={"name": "interop-sched", "system_database_url": sys.argv[1],
                 "executor_id": "dbos-executor", "serializer": DBOSPortableJSON})
    ran = threading.Semaphore(0)

    @DBOS.workflow(name="dbos_tick")
    def dbos_tick(scheduled_time, context):
        print("RAN", json.dumps([str(scheduled_time), context]), flush=True)
        ran.release()

    DBOS.launch()
    try:
        for s in DBOS.list_schedules():
            print("LISTED", json.dumps([s["schedule_name"], s["workflow_name"],
                                        s["schedule"], s["context"]]), flush=True)
        for _ in range(2):
            assert ran.acquire(timeout=60)
    finally:
        DBOS.destroy()
    """
)


def lines(stdout: str, tag: str) -> list[Any]:
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
            if line.startswith(tag + " ")]


async def run_script(script: str, url: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
    assert proc.returncode == 0, f"{out.decode()}\n{err.decode()}"
    return out.decode()


async def test_our_executor_fires_a_dbos_schedule(database_url: str) -> None:
    runs: list[tuple[datetime, Any]] = []
    dbos = new_dbos(database_url, schedule_reread_interval=0.2)

    @dbos.workflow(name="interop_tick")
    async def interop_tick(scheduled_time: datetime, context: Any) -> None:
        runs.append((scheduled_time, context))

    async with dbos:
        await run_script(_DBOS_CLIENT_SCRIPT, database_url)
        await wait_until(lambda: _true(len(runs) >= 2), patience=PATIENCE, what="two runs")
        [listed] = await dbos.list_schedules()
    assert listed.schedule_name == "from-dbos" and listed.context == {"by": "dbos"}
    assert all(context == {"by": "dbos"} for _, context in runs)
    assert all(isinstance(t, datetime) and t.tzinfo is not None for t, _ in runs)


async def test_a_dbos_executor_fires_our_schedule_once_per_time(database_url: str) -> None:
    ours: list[datetime] = []
    dbos = new_dbos(database_url)

    @dbos.workflow(name="dbos_tick")
    async def dbos_tick(scheduled_time: datetime, context: Any) -> None:
        del context
        ours.append(scheduled_time)

    async with dbos:
        await dbos.create_schedule("from-ours", "dbos_tick", "* * * * * *",
                                   context={"by": "dbos_async"})
        stdout = await run_script(_DBOS_EXECUTOR_SCRIPT, database_url)
    assert lines(stdout, "LISTED") == [["from-ours", "dbos_tick", "* * * * * *",
                                        {"by": "dbos_async"}]]
    assert all(context == {"by": "dbos_async"} for _, context in lines(stdout, "RAN"))
    rows = await fetch(database_url, "SELECT workflow_uuid, status FROM dbos.workflow_status"
                       " WHERE workflow_uuid LIKE 'sched-from-ours-%'")
    # Both executors fired every second while both ran; one workflow per time.
    times = [datetime.fromisoformat(r["workflow_uuid"].removeprefix("sched-from-ours-"))
             for r in rows]
    assert len(times) == len(set(times)) and len(times) >= 2
    ran_there = len(lines(stdout, "RAN"))
    assert ran_there + len(ours) <= len(rows)


async def _true(value: bool) -> bool:
    return value
