"""Recovery: resume this executor's PENDING workflows from their last checkpoint."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from dbos_async.errors import DBOSError, WorkflowNotRegisteredError
from dbos_async.executor import workflows
from dbos_async.executor.handles import WorkflowHandle
from dbos_async.executor.messaging import notify_completion
from dbos_async.sysdb.notifications import ENQUEUE_CHANNEL

if TYPE_CHECKING:
    from dbos_async.executor.dbos import DBOS

logger = logging.getLogger("dbos_async")


async def recover_pending(dbos: DBOS) -> list[WorkflowHandle[Any]]:
    """Claim this executor's PENDING workflows of this version and run each from its checkpoints.

    A workflow that cannot be resumed here (its function is not registered, its inputs cannot
    be read) is logged, kept in ``dbos.recovery_errors`` and left PENDING for an executor that
    can run it.
    """
    sysdb = dbos.system_database
    await _dead_letter_and_requeue(dbos)
    rows = await sysdb.claim_pending(
        dbos.config.executor_id, dbos.application_version, exclude=dbos.running_ids()
    )
    handles: list[WorkflowHandle[Any]] = []
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
        handles.append(WorkflowHandle(dbos, row.workflow_id, execution.result, info.signature))
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
