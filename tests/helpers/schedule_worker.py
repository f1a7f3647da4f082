"""An executor process of the schedule tests.

usage: python schedule_worker.py URL SCHEDULE_NAME AUTOMATIC_BACKFILL(0|1)

Registers workflow ``tick(scheduled_time, context)``, enters DBOS, applies schedule
``SCHEDULE_NAME`` (every second; applying keeps the stored last fired time), prints one
line of JSON ``{"pid": ...}`` and runs until it is killed or its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime
from typing import Any

from dbos_async import DBOS, ScheduleDefinition


async def main(url: str, name: str, backfill: str) -> None:
    dbos = DBOS(system_database_url=url, application_version="schedule-test",
                connection_name="schedule_test", shutdown_grace_period=0)

    @dbos.workflow(name="tick")
    async def tick(scheduled_time: datetime, context: Any) -> None:
        del scheduled_time, context

    async with dbos:
        await dbos.apply_schedules([ScheduleDefinition(name, "tick", "* * * * * *",
                                                       automatic_backfill=backfill == "1")])
        print(json.dumps({"pid": os.getpid()}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
