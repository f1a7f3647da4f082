"""Recovery: resume this executor's (or a dead one's) PENDING workflows from their last
checkpoint."""

from __future__ import annotations

import logging
from typing import Any

from dbos_async import _metrics as metrics
from dbos_async._executor import workflows
from dbos_async._executor.handles import WorkflowHandle, workflow_handle
from dbos_async._executor.runtime import Runtime
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL
from dbos_async.errors import DBOSError, WorkflowNotRegisteredError

logger = logging.getLogger("dbos_async")


async def recover_pending(runtime: Runtime,
                          from_executor_id: str | None = None) -> list[WorkflowHandle[Any]]:
    """Claim this executor's PENDING workflows of this version and run each from its checkpoints.

    With ``from_executor_id``, those of that (dead) executor instead: failover, whose caller
    holds that executor's ID lock; they become this executor's. A workflow that cannot be
    resumed here (its function is not registered, its inputs cannot be read) is logged,
    kept in ``recovery_errors`` and left PENDING for an executor that can run it.
    """
    sysdb = runtime.system_database
    handles: list[WorkflowHandle[Any]] = []
    # Held exclusive also for another executor's workflows: once claimed they are this
    # executor's, and must be known as running here before the next recovery looks.
    async with runtime.claim_gate.recovering():
        source = from_executor_id or runtime.executor_id
        await _dead_letter_and_requeue(runtime, source, failover=from_executor_id is not None)
        rows = await sysdb.claim_pending(
            source, runtime.application_version,
            exclude=runtime.running(), to_executor_id=runtime.executor_id,
        )
        for row in rows:
            info = runtime.registry.workflows.get(row.name)
            try:
                if info is None:
                    raise WorkflowNotRegisteredError(row.workflow_id, row.name)
                await workflows.launch_claimed(runtime, info, row)
            except DBOSError as error:
                logger.error("Cannot recover workflow %s: %s", row.workflow_id, error)
                runtime.recovery_errors.append(error)
                continue
            handles.append(workflow_handle(runtime, row.workflow_id, signature=info.signature,
                                           shard_key=row.shard_key))
            metrics.workflows_recovered((row.name,))
    if rows:
        logger.info("Recovered %d of %d pending workflows of executor %s",
                    len(handles), len(rows), source)
    return handles


async def _dead_letter_and_requeue(runtime: Runtime, executor_id: str, failover: bool
                                   ) -> None:
    """Dead-letter workflows past ``max_recovery_attempts``; re-enqueue queued ones.

    A queued workflow goes back to ENQUEUED on its queue rather than resuming here, so the
    queue's claim, under the queue's limits, admits exactly one runner (any executor). In
    ``failover``, a key out of reach is left for the next scan (see the system database's
    ``claim_pending``).
    """
    sysdb = runtime.system_database
    running = runtime.running()
    version = runtime.application_version
    max_attempts = runtime.config.max_recovery_attempts
    # The workflows registered with a limit of their own (@dbos.workflow option).
    limits = {name: info.max_recovery_attempts
              for name, info in runtime.registry.workflows.items()
              if info.max_recovery_attempts is not None}
    for workflow_id, shard_key in await sysdb.dead_letter_pending(
            executor_id, version, max_attempts, exclude=running, limits=limits,
            failover=failover):
        logger.error("Workflow %s exceeded its recovery attempts and was dead-lettered "
                     "(MAX_RECOVERY_ATTEMPTS_EXCEEDED)", workflow_id)
        runtime.notify_completion(workflow_id, shard_key)
    requeued = await sysdb.requeue_pending(executor_id, version, exclude=running,
                                           failover=failover)
    for queue_name in {queue for _, queue in requeued}:
        sysdb.notify(ENQUEUE_CHANNEL, queue_name)
    if requeued:
        logger.info("Re-enqueued %d pending queued workflows", len(requeued))
