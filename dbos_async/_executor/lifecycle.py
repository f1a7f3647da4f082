"""Entering and leaving an executor: build a runtime, start what it runs, stop it again.

:func:`new_runtime` builds the runtime of an entry (before anything starts, so that
workflows recovered while it starts already find it); :func:`start_runtime` connects,
migrates (or verifies), registers the application version, starts the listener, notifier
and cancellation watcher, stores the declared queues and starts their claim loops, recovers
this executor's pending workflows and starts the maintenance jobs. :func:`close_runtime`
stops the claim loops first (nothing new starts), gives running workflows the grace period,
then stops the background tasks and closes every connection; its clean-up is shielded, so a
cancelled exit still leaves nothing behind.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Set

import anyio

from dbos_async._database_url import redact
from dbos_async._executor import failover, recovery, versions
from dbos_async._executor.management import maintenance
from dbos_async._executor.peer import (
    application_database_for,
    start_notifications,
    system_database_for,
)
from dbos_async._executor.queues.claim_loop import start_claim_loops
from dbos_async._executor.queues.declaration import Queue, internal_queue
from dbos_async._executor.registry import Registry, application_version
from dbos_async._executor.runtime import Runtime
from dbos_async._executor.schedules.scheduler import Scheduler
from dbos_async._sysdb import connection
from dbos_async._sysdb.executor_ids import ExecutorIdLock
from dbos_async.config import DEFAULT_EXECUTOR_ID, DBOSConfig
from dbos_async.errors import QueueNotFoundError

logger = logging.getLogger("dbos_async")


async def new_runtime(config: DBOSConfig, registry: Registry) -> Runtime:
    """The runtime of one entry, not started yet (nothing connected)."""
    url = config.system_database_url
    if url is None:
        from dbos_async._sysdb.embedded import start_embedded_server

        url = await start_embedded_server(config.data_dir)
    return Runtime(config, registry, system_database_for(config, url),
                   application_version(config, registry))


async def start_runtime(runtime: Runtime, queues: Mapping[str, Queue],
                        listen: Set[str] | None) -> None:
    """Start everything the runtime runs, with these declared queues (claiming from
    ``listen`` only, when given); on failure, stop what started and raise. Each step is
    retried through connection losses for up to ``db_retry_timeout``."""
    config, sysdb = runtime.config, runtime.system_database
    try:
        # First, so that an entry waiting on the database says on what.
        runtime.background.supervise(sysdb.watch_health, "database health watch")
        await sysdb.open(run_migrations=config.run_migrations, patient=True)
        await _open_application_databases(runtime)
        await _hold_executor_id(runtime)
        await start_notifications(sysdb, sysdb.url, config, runtime.background.supervise)
        runtime.cancellation.start(sysdb, runtime.background.supervise)
        await sysdb.register_version(runtime.application_version)
        runtime.state = "running"
        await _start_queues(runtime, queues, listen)
        # Safe to run again: what an attempt launched runs here, and is excluded.
        await sysdb.retried("recovering pending workflows",
                            lambda: recovery.recover_pending(runtime))
        failover.start(runtime)
        maintenance.start(runtime)
        await sysdb.retried("counting other versions' work",
                            lambda: versions.report_waiting(runtime))
        versions.start(runtime)
        await _start_scheduler(runtime)
    except BaseException:
        await close_runtime(runtime, grace_period=0)
        raise
    logger.info(
        "DBOS %s started: executor %s, version %s, system database %s",
        config.name, runtime.executor_id, runtime.application_version, redact(sysdb.url),
    )


async def _open_application_databases(runtime: Runtime) -> None:
    """Open (and migrate) the application database of every registered data source,
    before recovery runs transactions on them."""
    runtime.registry.check_data_sources()
    for source in runtime.registry.data_sources.values():
        database = application_database_for(runtime.config, source)
        await database.open(run_migrations=runtime.config.run_migrations)
        runtime.application_databases[source.name] = database


async def _start_scheduler(runtime: Runtime) -> None:
    """Store the schedules declared with ``@dbos.scheduled`` and start firing."""
    if runtime.registry.schedules:
        await runtime.system_database.apply_schedules(runtime.registry.schedules)
    Scheduler(runtime).start()


async def _hold_executor_id(runtime: Runtime) -> None:
    """Claim a free executor ID (the configured one or ``local``, else ``<base>-2``, ...)
    and keep it: watched, re-acquired if its connection drops, required by every start,
    claim round and recovery, and the sign to other executors that this one is alive (see
    dbos_async/_sysdb/executor_ids.py)."""
    config, sysdb = runtime.config, runtime.system_database
    base = config.executor_id or DEFAULT_EXECUTOR_ID
    lock = ExecutorIdLock(
        sysdb.sql,
        functools.partial(connection.connect, sysdb.coordination_url, config.connect_timeout,
                          config.connection_name, sysdb.coordination_fence),
        base,
        patience=config.db_retry_timeout,
    )
    # Safe to run again: a failed claim closes its connection, releasing what it took.
    claimed = await sysdb.retried("claiming an executor ID", lock.claim)
    if config.executor_id is not None and claimed != base:
        logger.warning("Executor ID %r is held by another live process; this one runs as %r "
                       "(so neither takes over the other's running workflows)", base, claimed)
    runtime.executor_lock = lock
    lock.start_watching(runtime.background.supervise)
    runtime.claim_gate.guard = lock.ensure_held


async def _start_queues(runtime: Runtime, queues: Mapping[str, Queue],
                        listen: Set[str] | None) -> None:
    sysdb = runtime.system_database
    for queue in queues.values():
        await sysdb.upsert_queue(queue._record)
    names = set(queues) if listen is None else set(listen)
    records = [queues[n]._record for n in sorted(names) if n in queues]
    missing = sorted(names - set(queues))
    if missing:
        stored = {r.name: r for r in await sysdb.list_queues(missing)}
        for name in missing:
            if name not in stored:
                raise QueueNotFoundError(name)
            records.append(stored[name])
    # Every executor runs resumed workflows (DBOS's internal queue).
    internal = internal_queue()._record
    if internal.name not in names:
        records.append(internal)
    start_claim_loops(runtime, records)


async def close_runtime(runtime: Runtime, grace_period: float) -> None:
    """Stop everything the runtime runs; running workflows get ``grace_period`` seconds
    to finish (those that do not stay PENDING and resume on recovery)."""
    sysdb = runtime.system_database
    runtime.state = "stopping"
    _say_stopping(runtime, grace_period)
    ends = time.monotonic() + grace_period
    try:
        await runtime.queue_tasks.close(0)
        await runtime.workflows.close(grace_period)
        # A workflow's run ends with its body; its outcome is written after it, within
        # the same grace period, and announced before notifications stop.
        await sysdb.outcomes_written(max(0.0, ends - time.monotonic()))
    finally:
        try:
            with anyio.CancelScope(shield=True):
                # Again, in case the exit was cancelled before these were closed. The
                # background tasks (the scheduler, maintenance, ...) stop before the
                # runtime is closed: one caught between the two would fail on it, and
                # log a traceback at every short program's exit.
                await runtime.queue_tasks.close(0)
                await runtime.workflows.close(0)
                await sysdb.outcomes_written(0)
                if sysdb.notifications is not None:
                    await sysdb.notifications.stop()
                await runtime.background.close(0)
        finally:
            runtime.state = "closed"
        with anyio.CancelScope(shield=True):
            for database in runtime.application_databases.values():
                await database.close()
            await sysdb.close()
            # Last: nothing is written under the executor ID once it is released.
            if runtime.executor_lock is not None:
                await runtime.executor_lock.close()


def _say_stopping(runtime: Runtime, grace_period: float) -> None:
    """Log at once that the executor stops, and what it waits for."""
    owner = runtime.workflows
    busy, parked = owner.busy, len(owner) - owner.busy
    if not busy and not parked:
        return
    waits = []
    if busy:
        waits.append(f"waiting up to {grace_period:g}s for {busy} running "
                     + ("workflow to reach its end" if busy == 1 else
                        "workflows to reach their end"))
    if parked:
        waits.append(f"releasing at once {parked} waiting in a durable sleep, recv or "
                     "get_event")
    logger.info("DBOS %s stopping: %s (a workflow that does not finish stays PENDING and "
                "resumes on the next start)", runtime.config.name, "; ".join(waits))
