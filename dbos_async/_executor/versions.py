"""Work left waiting for other application versions: an executor runs only the PENDING and
ENQUEUED workflows of its own version, so after a deploy under a new version the old
version's in-flight workflows wait for an executor of that version. So that none waits
unnoticed, an executor counts them at start and every ``version_report_interval`` seconds,
logs a warning naming the versions while there are any, and keeps the last count for
:meth:`dbos_async.DBOS.health`."""

from __future__ import annotations

import asyncio
import functools
import logging

from dbos_async._executor.runtime import Runtime
from dbos_async._sysdb.records import VersionBacklog

logger = logging.getLogger("dbos_async")


async def report_waiting(runtime: Runtime) -> list[VersionBacklog]:
    """Count the work of other versions, keep the count and log it if there is any."""
    waiting = await runtime.system_database.waiting_by_version(runtime.application_version)
    runtime.waiting_versions = tuple(waiting)
    if waiting:
        pending = sum(w.pending for w in waiting)
        enqueued = sum(w.enqueued for w in waiting)
        logger.warning(
            "%d PENDING and %d ENQUEUED workflows of other application versions wait for an "
            "executor of their version: %s. This executor runs version %s and will not run "
            "them. Start an executor of their version, or check them against this code "
            "with `dbos-async replay MODULE:DBOS --application-version VERSION` and move "
            "them here with its --move (see docs/operations/upgrades.md)",
            pending, enqueued, ", ".join(map(str, waiting)), runtime.application_version)
    return waiting


async def report_loop(runtime: Runtime) -> None:
    while True:
        await asyncio.sleep(runtime.config.version_report_interval)
        if runtime.state != "running":
            continue  # shutting down: the next entry counts again
        try:
            await report_waiting(runtime)
        except Exception as error:  # the database may be down: next round
            logger.warning("Counting the work of other application versions failed: %r",
                           error)


def start(runtime: Runtime) -> None:
    runtime.background.supervise(functools.partial(report_loop, runtime),
                                 "other versions' work report")
