"""Starting a workflow, running its body as a task, and recording how it ended.

A workflow runs as a task owned by its DBOS instance. Its outcome is recorded with a fenced
write: an execution that lost ownership (another executor recovered the workflow) records
nothing and resolves to whatever the owner recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dbos_async.errors import (
    DBOSError,
    NondeterminismError,
    NonExistentWorkflowError,
    SerializationError,
    WorkflowCancelledError,
    WorkflowConflictError,
)
from dbos_async.executor.context import WorkflowContext, running_workflow, workflow_attributes
from dbos_async.executor.handles import WorkflowHandle, outcome_value
from dbos_async.executor.messaging import notify_completion
from dbos_async.executor.registry import WorkflowInfo
from dbos_async.executor.serialization import deserialize_error, serialize_error
from dbos_async.sysdb.database import StartResult, StepRecord, WorkflowRow, now_ms
from dbos_async.sysdb.statements import PENDING, NewWorkflow, ParentStep

if TYPE_CHECKING:
    from dbos_async.executor.dbos import DBOS

logger = logging.getLogger("dbos_async")


@dataclass
class Execution:
    """A workflow body running in this process."""

    info: WorkflowInfo
    result: asyncio.Future[Any] = field(default_factory=asyncio.Future)

    def __post_init__(self) -> None:
        # Mark an unawaited failure as seen: the outcome is in the database either way.
        self.result.add_done_callback(lambda f: f.cancelled() or f.exception())


@dataclass(frozen=True)
class StartRequest:
    info: WorkflowInfo
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    workflow_id: str | None
    timeout: float | None
    parent: WorkflowContext | None
    parent_step_id: int | None


def split_instance(info: WorkflowInfo, args: tuple[Any, ...]) -> tuple[object | None,
                                                                        tuple[Any, ...]]:
    if not info.is_method:
        return None, args
    if not args:
        raise DBOSError(f"Workflow method {info.name} was called without its instance")
    return args[0], args[1:]


def check_name(started: StartResult, workflow_id: str, name: str) -> None:
    """Raise if the workflow a start found under ``workflow_id`` runs another function."""
    if not started.created and started.row.name != name:
        raise DBOSError(f"Workflow ID {workflow_id!r} is already used by workflow "
                        f"{started.row.name!r}, not {name!r}")


async def start(dbos: DBOS, request: StartRequest) -> WorkflowHandle[Any]:
    """Start (or find) a workflow and return its handle; a child start is checkpointed."""
    info, parent, step_id = request.info, request.parent, request.parent_step_id
    if parent is not None and step_id is not None:
        recorded = parent.checkpoints.get(step_id)
        if recorded is not None:
            return replayed_child(dbos, parent, step_id, info, recorded)
    instance, args = split_instance(info, request.args)
    config_name = dbos.instance_name(instance) if instance is not None else None
    # Serialized before anything is written, so a bad argument leaves no row behind.
    inputs = info.signature.serialize_inputs(args, request.kwargs)
    if parent is not None and step_id is not None:
        workflow_id = request.workflow_id or f"{parent.workflow_id}-{step_id}"
    else:
        workflow_id = request.workflow_id or str(uuid.uuid4())
    created_at = now_ms()
    deadline = parent.deadline_epoch_ms if parent is not None else None
    timeout_ms = int(request.timeout * 1000) if request.timeout is not None else None
    if timeout_ms is not None:
        own = created_at + timeout_ms
        deadline = own if deadline is None else min(deadline, own)
    creator_xid = str(uuid.uuid4())
    new = NewWorkflow(
        workflow_id=workflow_id,
        name=info.name,
        status=PENDING,
        inputs=inputs,
        executor_id=dbos.config.executor_id,
        application_version=dbos.application_version,
        created_at_ms=created_at,
        class_name=info.class_name,
        config_name=config_name,
        timeout_ms=timeout_ms,
        deadline_epoch_ms=deadline,
        parent_workflow_id=parent.workflow_id if parent is not None else None,
        attributes=workflow_attributes(),
    )
    parent_step = (
        ParentStep(parent.workflow_id, step_id, parent.owner_xid, created_at)
        if parent is not None and step_id is not None
        else None
    )
    # From the insert until the launch, the new PENDING row must not look crashed to recovery.
    async with dbos.claim_gate.claiming():
        started = await dbos.system_database.start_workflow(new, creator_xid, parent_step)
        if not started.created:
            check_name(started, workflow_id, info.name)
            return WorkflowHandle(dbos, workflow_id, dbos.running_result(workflow_id),
                                  info.signature)
        full_args = (instance, *args) if instance is not None else args
        execution = launch(dbos, info, workflow_id, creator_xid, full_args, request.kwargs, {},
                           deadline)
    return WorkflowHandle(dbos, workflow_id, execution.result, info.signature)


def replayed_child(dbos: DBOS, parent: WorkflowContext, step_id: int, info: WorkflowInfo,
                   recorded: StepRecord) -> WorkflowHandle[Any]:
    """The handle a replayed child start returns, or the error it raised the first time.

    A child start records no output of its own: only the name is checked; the result is the
    child's, read through its handle.
    """
    if recorded.function_name != info.name:
        raise NondeterminismError(parent.workflow_id, step_id, recorded.function_name, info.name)
    if recorded.error is not None:  # An enqueue its deduplication ID rejected.
        raise deserialize_error(recorded.error, recorded.serialization)
    if recorded.child_workflow_id is None:
        raise DBOSError(f"Step {step_id} of {parent.workflow_id} recorded no child workflow")
    child_id = recorded.child_workflow_id
    return WorkflowHandle(dbos, child_id, dbos.running_result(child_id), info.signature)


def launch(
    dbos: DBOS,
    info: WorkflowInfo,
    workflow_id: str,
    owner_xid: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    checkpoints: dict[int, StepRecord],
    deadline_epoch_ms: int | None,
) -> Execution:
    """Run a workflow body this execution owns, as a task of the DBOS instance."""
    execution = Execution(info)
    ctx = WorkflowContext(dbos, workflow_id, owner_xid, checkpoints, deadline_epoch_ms)
    dbos.track(workflow_id, execution)
    dbos.cancellation.attach(ctx)
    dbos.tasks.spawn(_run(ctx, execution, args, kwargs), name=f"workflow {workflow_id}")
    return execution


async def launch_claimed(dbos: DBOS, info: WorkflowInfo, row: WorkflowRow) -> Execution:
    """Run a workflow this executor has just claimed (by recovery or from a queue) from its
    checkpoints; raises :class:`DBOSError` if its inputs or instance cannot be resolved."""
    args, kwargs = info.signature.deserialize_inputs(row.inputs, row.serialization)
    if info.is_method:
        args = (dbos.registry.instance(row.class_name, row.config_name), *args)
    # A resumed or forked workflow continues from its own or copied checkpoints; a queue
    # claim says whether there are any, so a fresh one costs no read.
    checkpoints = (await dbos.system_database.load_checkpoints(row.workflow_id)
                   if row.has_checkpoints else {})
    assert row.owner_xid is not None
    return launch(dbos, info, row.workflow_id, row.owner_xid, args, kwargs, checkpoints,
                  row.deadline_epoch_ms)


async def _run(ctx: WorkflowContext, execution: Execution, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> None:
    dbos, workflow_id = ctx.dbos, ctx.workflow_id
    future = execution.result
    try:
        value = await _body_within_deadline(ctx, execution.info, args, kwargs)
    except asyncio.CancelledError:
        # The executor is shutting down: the workflow stays PENDING and resumes on recovery.
        future.set_exception(DBOSError(
            f"Workflow {workflow_id!r} was interrupted by executor shutdown; it resumes "
            "from its last checkpoint when an executor recovers it"
        ))
        raise
    except _DeadlineExceeded:
        with contextlib.suppress(NonExistentWorkflowError):  # deleted meanwhile
            await dbos.system_database.cancel([workflow_id], children=False)
        notify_completion(dbos, workflow_id)
        future.set_exception(WorkflowCancelledError(workflow_id, "cancelled: its deadline passed"))
    except Exception as error:
        await _finish(ctx, execution, error=error)
    else:
        await _finish(ctx, execution, value=value)
    finally:
        dbos.untrack(workflow_id, execution)
        dbos.cancellation.detach(ctx)


class _DeadlineExceeded(Exception):
    pass


async def _body_within_deadline(ctx: WorkflowContext, info: WorkflowInfo,
                                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with running_workflow(ctx):
        if ctx.deadline_epoch_ms is None:
            return await info.fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        when = loop.time() + (ctx.deadline_epoch_ms - now_ms()) / 1000
        timeout = asyncio.timeout_at(when)
        try:
            async with timeout:
                return await info.fn(*args, **kwargs)
        except TimeoutError:
            if timeout.expired():
                raise _DeadlineExceeded() from None
            raise


async def _finish(ctx: WorkflowContext, execution: Execution, *, value: Any = None,
                  error: Exception | None = None) -> None:
    """Record the outcome under the fence, or adopt the recorded one if the fence was lost."""
    sysdb, workflow_id, future = ctx.dbos.system_database, ctx.workflow_id, execution.result
    try:
        if isinstance(error, WorkflowCancelledError | WorkflowConflictError):
            recorded = False
        elif error is not None:
            recorded = await sysdb.record_outcome(workflow_id, ctx.owner_xid,
                                                  error=serialize_error(error))
        else:
            try:
                output = execution.info.signature.serialize_result(value)
            except SerializationError as bad:
                error = bad
                recorded = await sysdb.record_outcome(workflow_id, ctx.owner_xid,
                                                      error=serialize_error(bad))
            else:
                recorded = await sysdb.record_outcome(workflow_id, ctx.owner_xid, output=output)
        if recorded:
            # Handles waiting elsewhere wake on this (sent after the outcome committed).
            notify_completion(ctx.dbos, workflow_id)
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)
            return
        # Another execution owns the workflow now, or it was cancelled: report what is recorded.
        logger.info("Workflow %s is recorded by another execution; adopting its outcome",
                    workflow_id)
        outcome = await sysdb.wait_outcome(workflow_id, ctx.dbos.config.result_poll_interval)
        adopted = outcome_value(workflow_id, outcome, execution.info.signature)
        future.set_result(adopted)
    except asyncio.CancelledError:
        future.cancel()
        raise
    except Exception as failure:
        if not future.done():
            future.set_exception(failure)

