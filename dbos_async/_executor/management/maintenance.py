"""Maintenance jobs: retention (delete old terminal workflows) and the global timeout
(cancel old in-flight ones).

Each job touches only the executor's application's workflows (``application_name``) and
unclaimed ones, as its listings show them. Each run takes a transaction-scoped advisory lock
(``pg_try_advisory_xact_lock``, key from SHA-256 of
``dbos.background_job.<schema>.<application>.<job>``) and does its work in that transaction,
so across every executor of the application at most one runs a given job at a time; an
executor that finds the lock taken skips that round. Both jobs are off by default
(``retention_hours``, ``global_timeout_hours``); when either is set, one background task of
the runtime runs them every ``maintenance_interval`` seconds, the first time at start.
"""

from __future__ import annotations

import functools
import logging

from dbos_async._executor.management.control import announce_cancelled
from dbos_async._executor.runtime import Runtime
from dbos_async._sysdb.clock import after
from dbos_async._sysdb.repeats import Repeats

logger = logging.getLogger("dbos_async")


async def run_retention(runtime: Runtime, cutoff_ms: int | None, batch_size: int,
                        rows_threshold: int | None = None) -> int | None:
    """Delete terminal workflows finished before ``cutoff_ms`` and those older than the
    ``rows_threshold`` newest workflows, ``batch_size`` per statement. Returns how many, or
    None if another executor holds the job's lock."""
    total = await runtime.system_database.delete_finished_before(cutoff_ms, batch_size,
                                                                 rows_threshold)
    if total is None:
        return None
    if cutoff_ms is not None:
        for database in runtime.application_databases.values():
            # Their transactions' records too: by then every one is in its workflow's
            # checkpoints (or its workflow is gone). Not by rows: an old workflow may
            # still be running.
            await database.delete_outputs_before(cutoff_ms, batch_size)
    if total:
        logger.info("Retention deleted %d workflows (finished before %s, or older than "
                    "the %s newest)", total, cutoff_ms, rows_threshold)
    return total


async def run_global_timeout(runtime: Runtime, cutoff_ms: int) -> list[str] | None:
    """Cancel in-flight workflows created before ``cutoff_ms``. Returns their IDs, or None
    if another executor holds the job's lock."""
    rows = await runtime.system_database.cancel_created_before(cutoff_ms)
    if rows is None:
        return None
    # Committed: stop what runs here, and tell the others.
    announce_cancelled(runtime, rows)
    cancelled = [row.workflow_id for row in rows]
    if cancelled:
        logger.info("Global timeout cancelled %d workflows created before %d",
                    len(cancelled), cutoff_ms)
    return cancelled


async def run_jobs_once(runtime: Runtime) -> None:
    config = runtime.config
    now = runtime.system_database.clock.now_ms()
    if config.retention_hours is not None or config.retention_rows_threshold is not None:
        cutoff = (None if config.retention_hours is None
                  else now - int(config.retention_hours * 3_600_000))
        await run_retention(runtime, cutoff, config.retention_batch_size,
                            config.retention_rows_threshold)
    if config.global_timeout_hours is not None:
        await run_global_timeout(runtime, now - int(config.global_timeout_hours * 3_600_000))


async def maintenance_loop(runtime: Runtime) -> None:
    repeats = Repeats(logger)
    while True:
        try:
            await run_jobs_once(runtime)
            repeats.reset()
        except Exception as error:  # the database may be down: next round
            repeats.log(logging.WARNING, "A maintenance job failed: %r", error)
        # On the clock the ages are read from, so a test clock moved on runs the jobs too.
        clock = runtime.system_database.clock
        await clock.sleep_until(after(clock, runtime.config.maintenance_interval))


def start(runtime: Runtime) -> None:
    config = runtime.config
    if config.retention_hours is not None or config.retention_rows_threshold is not None \
            or config.global_timeout_hours is not None:
        runtime.background.supervise(functools.partial(maintenance_loop, runtime),
                                     "maintenance jobs")
