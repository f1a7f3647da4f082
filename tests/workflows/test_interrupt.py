"""Ctrl-C (SIGINT) to a real process whose workflow sleeps durably: the executor says at
once that it stops and what it waits for, releases the sleeping workflow without waiting
out the grace period (it has nothing to finish), and the workflow stays PENDING; the next
start resumes it to its end."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

from helpers import fetchval, new_dbos, wait_until, workflow_row

from dbos_async import SetWorkflowID

SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, signal, sys
    from dbos_async import DBOS, SetWorkflowID

    # Ctrl-C as in a terminal, even where the suite was started as a background job of a
    # shell (which ignores SIGINT, and the child would inherit that).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.basicConfig(level=logging.INFO, format="LOG %(levelname)s %(message)s")
    dbos = DBOS(name="sleeper", system_database_url=sys.argv[1], executor_id="sleeper",
                application_version="v1", shutdown_grace_period=10)

    @dbos.workflow()
    async def nap() -> str:
        await dbos.sleep(8)
        return "rested"

    async def main(mode):
        async with dbos:
            if mode == "start":
                with SetWorkflowID("nap-1"):
                    await dbos.start_workflow(nap)
                print("STARTED", flush=True)
                await asyncio.Event().wait()
            handle = await dbos.retrieve_workflow("nap-1")
            print("RESULT", await handle.get_result(), flush=True)

    asyncio.run(main(sys.argv[2]))
    """
)


def child(url: str, mode: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, url, mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_sigint_during_a_durable_sleep_exits_at_once_and_the_sleep_resumes(
        database_url: str) -> None:
    sleeper = child(database_url, "start")
    try:
        assert sleeper.stdout is not None
        assert sleeper.stdout.readline().strip() == "STARTED"

        async def asleep() -> bool:
            # The sleep's checkpoint (its deadline) is written just before it waits.
            return bool(await fetchval(database_url, "SELECT count(*) FROM "
                                       "dbos.operation_outputs WHERE workflow_uuid = 'nap-1'"))
        await wait_until(asleep, what="the workflow to sleep")
        interrupted = time.monotonic()
        sleeper.send_signal(signal.SIGINT)
        _, err = sleeper.communicate(timeout=60)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
    # It used to wait out the sleep (or the 10 s grace period) in silence.
    assert time.monotonic() - interrupted < 3.0, err
    stopping = [line for line in err.splitlines() if "stopping" in line]
    assert len(stopping) == 1, err
    assert "releasing at once 1 waiting in a durable sleep" in stopping[0]
    row = await workflow_row(database_url, "nap-1")
    assert row is not None and row["status"] == "PENDING"

    resumed = child(database_url, "resume")
    out, err = resumed.communicate(timeout=60)
    assert "RESULT rested" in out, err
    row = await workflow_row(database_url, "nap-1")
    assert row is not None and row["status"] == "SUCCESS"


async def test_leaving_releases_workflows_waiting_in_recv_or_get_event_at_once(
        database_url: str) -> None:
    """Only the wait is cut: a grace period of 60 s is not waited out, and both stay
    PENDING, to wait again on the next start."""
    dbos = new_dbos(database_url, shutdown_grace_period=60)

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv("go", timeout=120)

    @dbos.workflow()
    async def watcher() -> Any:
        return await dbos.get_event("nobody", "ready", timeout=120)

    async with dbos:
        for workflow_id, workflow in (("recv-1", receiver), ("event-1", watcher)):
            with SetWorkflowID(workflow_id):
                await dbos.start_workflow(workflow)

        async def both_waiting() -> bool:
            # Each wait's deadline is checkpointed just before it waits.
            return await fetchval(database_url, "SELECT count(*) FROM dbos.operation_outputs "
                                  "WHERE workflow_uuid IN ('recv-1', 'event-1')") == 2
        await wait_until(both_waiting, what="both workflows to wait")
        leaving = time.monotonic()
    assert time.monotonic() - leaving < 5.0
    for workflow_id in ("recv-1", "event-1"):
        row = await workflow_row(database_url, workflow_id)
        assert row is not None and row["status"] == "PENDING"


async def test_the_stopping_line_says_what_it_waits_for_before_the_wait(
        database_url: str) -> None:
    """A workflow busy in a step and one parked in a sleep: one line, at once, saying it
    waits up to the grace period for the first and releases the second. The busy step
    finishes only once that line is logged, so a line logged late (or not at all) would
    hold the exit for the 60 s grace period and leave the busy workflow PENDING."""
    dbos = new_dbos(database_url, shutdown_grace_period=60)
    said = asyncio.Event()
    lines: list[str] = []

    class Listener(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("DBOS ") and " stopping: " in record.getMessage():
                lines.append(record.getMessage())
                said.set()

    @dbos.step()
    async def busy_step() -> str:
        await said.wait()
        return "finished"

    @dbos.workflow()
    async def busy() -> str:
        return await busy_step()

    @dbos.workflow()
    async def napping() -> None:
        await dbos.sleep(120)

    listener = Listener()
    logger = logging.getLogger("dbos_async")
    logger.addHandler(listener)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        async with dbos:
            for workflow_id, workflow in (("busy-1", busy), ("nap-2", napping)):
                with SetWorkflowID(workflow_id):
                    await dbos.start_workflow(workflow)

            async def both_in_place() -> bool:
                # The step's checkpoint is written when it ends; the sleep's before it waits.
                return await fetchval(database_url, "SELECT count(*) FROM dbos.operation_outputs "
                                      "WHERE workflow_uuid = 'nap-2'") == 1
            await wait_until(both_in_place, what="the sleep to start")
            leaving = time.monotonic()
    finally:
        logger.removeHandler(listener)
        logger.setLevel(previous)
    assert time.monotonic() - leaving < 5.0
    assert len(lines) == 1, lines
    assert "waiting up to 60s for 1 running workflow to reach its end" in lines[0]
    assert "releasing at once 1 waiting in a durable sleep" in lines[0]
    busy_row = await workflow_row(database_url, "busy-1")
    nap_row = await workflow_row(database_url, "nap-2")
    assert busy_row is not None and busy_row["status"] == "SUCCESS"
    assert nap_row is not None and nap_row["status"] == "PENDING"
