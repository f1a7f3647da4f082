"""Recovery: resume this executor's PENDING workflows from their last checkpoint."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from dbos_async.errors import DBOSError, WorkflowNotRegisteredError
from dbos_async.executor import workflows
from dbos_async.executor.handles import WorkflowHandle

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
    rows = await sysdb.claim_pending(
        dbos.config.executor_id, dbos.application_version, exclude=dbos.running_ids()
    )
    handles: list[WorkflowHandle[Any]] = []
    for row in rows:
        info = dbos.registry.workflows.get(row.name)
        try:
            if info is None:
                raise WorkflowNotRegisteredError(row.workflow_id, row.name)
            args, kwargs = info.signature.deserialize_inputs(row.inputs, row.serialization)
            if info.is_method:
                args = (dbos.registry.instance(row.class_name, row.config_name), *args)
            checkpoints = await sysdb.load_checkpoints(row.workflow_id)
        except DBOSError as error:
            logger.error("Cannot recover workflow %s: %s", row.workflow_id, error)
            dbos.recovery_errors.append(error)
            continue
        assert row.owner_xid is not None
        execution = workflows.launch(dbos, info, row.workflow_id, row.owner_xid, args, kwargs,
                                     checkpoints, row.deadline_epoch_ms)
        handles.append(WorkflowHandle(dbos, row.workflow_id, execution.result, info.signature))
    if rows:
        logger.info("Recovered %d of %d pending workflows", len(handles), len(rows))
    return handles
