"""Recovery: resume this executor's PENDING workflows from their last checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from dbos_async.errors import DBOSError, WorkflowNotRegisteredError
from dbos_async.executor import workflows
from dbos_async.executor.handles import WorkflowHandle
from dbos_async.executor.messaging import notify_completion
from dbos_async.sysdb.notifications import ENQUEUE_CHANNEL

if TYPE_CHECKING:
    from dbos_async.executor.dbos import DBOS

logger = logging.getLogger("dbos_async")


class ClaimGate:
    """Workflow starts and queue claims run together; recovery runs alone.

    A workflow this process has just made PENDING (started, or flipped by a queue dispatcher)
    but not launched yet looks, to recovery, exactly like one a crash left behind: recovery
    would claim, re-enqueue or dead-letter it under the starter's feet, and it would run
    twice. So each start and each claim round, from its statement until its workflows are
    launched (and known as running here), holds the gate shared, and recovery exclusive. A
    waiting recovery holds back new ones, so a busy process cannot starve it.
    """

    def __init__(self) -> None:
        self._claims = 0
        self._recoveries = 0  # the one running, or waiting for claim rounds to end
        self._changed = asyncio.Condition()
        self._one_recovery = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def claiming(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: self._recoveries == 0)
            self._claims += 1
        try:
            yield
        finally:
            async with self._changed:
                self._claims -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def recovering(self) -> AsyncIterator[None]:
        async with self._one_recovery:
            async with self._changed:
                self._recoveries += 1
            try:
                async with self._changed:
                    await self._changed.wait_for(lambda: self._claims == 0)
                yield
            finally:
                async with self._changed:
                    self._recoveries -= 1
                    self._changed.notify_all()


async def recover_pending(dbos: DBOS) -> list[WorkflowHandle[Any]]:
    """Claim this executor's PENDING workflows of this version and run each from its checkpoints.

    A workflow that cannot be resumed here (its function is not registered, its inputs cannot
    be read) is logged, kept in ``dbos.recovery_errors`` and left PENDING for an executor that
    can run it.
    """
    sysdb = dbos.system_database
    handles: list[WorkflowHandle[Any]] = []
    async with dbos.claim_gate.recovering():
        await _dead_letter_and_requeue(dbos)
        rows = await sysdb.claim_pending(
            dbos.config.executor_id, dbos.application_version, exclude=dbos.running_ids()
        )
        for row in rows:
            info = dbos.registry.workflows.get(row.name)
            try:
                if info is None:
                    raise WorkflowNotRegisteredError(row.workflow_id, row.name)
                execution = await workflows.launch_claimed(dbos, info, row)
            except DBOSError as error:
                logger.error("Cannot recover workflow %s: %s", row.workflow_id, error)
                dbos.recovery_errors.append(error)
                continue
            handles.append(WorkflowHandle(dbos, row.workflow_id, execution.result,
                                          info.signature))
    if rows:
        logger.info("Recovered %d of %d pending workflows", len(handles), len(rows))
    return handles


async def _dead_letter_and_requeue(dbos: DBOS) -> None:
    """Dead-letter workflows past ``max_recovery_attempts``; re-enqueue queued ones.

    A queued workflow goes back to ENQUEUED on its queue rather than resuming here, so the
    queue's claim, under the queue's limits, admits exactly one runner (any executor).
    """
    sysdb = dbos.system_database
    running = dbos.running_ids()
    version = dbos.application_version
    executor_id = dbos.config.executor_id
    for workflow_id in await sysdb.dead_letter_pending(
            executor_id, version, dbos.config.max_recovery_attempts, exclude=running):
        logger.error("Workflow %s exceeded %d recovery attempts and was dead-lettered "
                     "(MAX_RECOVERY_ATTEMPTS_EXCEEDED)", workflow_id,
                     dbos.config.max_recovery_attempts)
        notify_completion(dbos, workflow_id)
    requeued = await sysdb.requeue_pending(executor_id, version, exclude=running)
    for queue_name in {queue for _, queue in requeued}:
        sysdb.notify(ENQUEUE_CHANNEL, queue_name)
    if requeued:
        logger.info("Re-enqueued %d pending queued workflows", len(requeued))
