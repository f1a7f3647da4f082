"""Workflows for the messaging recovery tests, also run as a subprocess that gets SIGKILLed.

``python messaging_worker.py <url> <workflow> <workflow_id>`` starts the workflow and waits.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from dbos_async import DBOS, SetWorkflowID

VERSION = "messaging-test-v1"


def build(url: str, **settings: Any) -> DBOS:
    dbos = DBOS(system_database_url=url, application_version=VERSION, executor_id="worker",
                shutdown_grace_period=0, **settings)

    @dbos.workflow(name="long_recv")
    async def long_recv() -> Any:
        return await dbos.recv("topic", timeout=4)

    @dbos.workflow(name="long_sleep")
    async def long_sleep() -> str:
        await dbos.sleep(4)
        return "awake"

    @dbos.workflow(name="long_get_event")
    async def long_get_event(target: str) -> Any:
        return await dbos.get_event(target, "never", timeout=4)

    dbos.__dict__["wfs"] = {"long_recv": long_recv, "long_sleep": long_sleep,
                            "long_get_event": long_get_event}
    return dbos


async def _main(url: str, name: str, workflow_id: str, *args: str) -> None:
    dbos = build(url)
    async with dbos:
        with SetWorkflowID(workflow_id):
            await dbos.start_workflow(dbos.__dict__["wfs"][name], *args)
        print("started", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:]))
