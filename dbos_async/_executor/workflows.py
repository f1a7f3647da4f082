"""Running a workflow body as a task, and recording how it ended.

A workflow runs as a task of its runtime's workflow owner. Its outcome is recorded with a
fenced write: an execution that lost ownership (another executor recovered the workflow)
records nothing and resolves to whatever the owner recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dbos_async._executor.authentication import NO_AUTHENTICATION, Authentication, authorize
from dbos_async._executor.context import Telemetry, WorkflowContext, running_workflow
from dbos_async._executor.handles import outcome_value
from dbos_async._executor.recorded_errors import recorded_error
from dbos_async._executor.registry import WorkflowInfo
from dbos_async._executor.runtime import Runtime
from dbos_async._executor.telemetry import observe
from dbos_async._sysdb.database import StepRecord, WorkflowRow
from dbos_async._sysdb.retry import outlasting_outages
from dbos_async._sysdb.shard_keys import bind_shard_keys
from dbos_async._sysdb.statements import PORTABLE_JSON
from dbos_async.errors import (
    DBOSError,
    ExecutorIdLostError,
    NonExistentWorkflowError,
    NotAuthorizedError,
    RecordedError,
    SerializationError,
    WorkflowCancelledError,
    WorkflowConflictError,
)

logger = logging.getLogger("dbos_async")


def _fail(result: asyncio.Future[Any], error: BaseException) -> None:
    """Fail ``result`` with ``error``, marked as seen (no warning if nobody awaits it): the
    outcome is in the database either way."""
    result.set_exception(error)
    result.exception()


@dataclass
class Execution:
    """A workflow body running in this process."""

    info: WorkflowInfo
    result: asyncio.Future[Any] = field(default_factory=asyncio.Future)
    on_body_end: Callable[[], None] | None = None
    """Called once the body has returned or raised, before its outcome is recorded (a
    queue's claim loop frees the workflow's worker slot there)."""

    def body_ended(self) -> None:
        callback, self.on_body_end = self.on_body_end, None
        if callback is not None:
            callback()


def launch(
    runtime: Runtime,
    info: WorkflowInfo,
    workflow_id: str,
    owner_xid: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    checkpoints: dict[int, StepRecord],
    deadline_epoch_ms: int | None,
    shard_key: str | None,
    attributes: str | None = None,
    authentication: Authentication = NO_AUTHENTICATION,
    serialization: str | None = None,
    first_run: bool = False,
    telemetry: Telemetry | None = None,
) -> Execution:
    """Run a workflow body this execution owns, as a task of the runtime (``attributes``:
    its stored attributes, which may carry the trace its span continues; ``authentication``:
    the identity it runs under; ``serialization``: the format of its row; ``telemetry``:
    what it reports to, if read already, e.g. once for a claim round's workflows)."""
    execution = Execution(info)
    ctx = WorkflowContext(runtime, workflow_id, owner_xid, checkpoints, deadline_epoch_ms,
                          shard_key, authentication, serialization, first_run=first_run,
                          telemetry=telemetry)
    runtime.track(workflow_id, shard_key, execution.result)
    runtime.cancellation.attach(ctx)
    runtime.workflows.spawn(_run(ctx, execution, args, kwargs, attributes),
                            name=f"workflow {workflow_id}")
    return execution


async def launch_claimed(runtime: Runtime, info: WorkflowInfo, row: WorkflowRow,
                         telemetry: Telemetry | None = None) -> Execution:
    """Run a workflow this executor has just claimed (by recovery or from a queue) from its
    checkpoints; raises :class:`DBOSError` if its inputs or instance cannot be resolved.
    ``telemetry``: what it reports to, if read already (once for a claim round).

    Its recorded identity is checked against the roles it requires (a client or another
    SDK may have enqueued it without them): refused, it ends ``ERROR`` with
    :class:`NotAuthorizedError`, as it would on every later attempt."""
    assert row.owner_xid is not None
    try:
        authentication = authorize("workflow", info.name, info.required_roles,
                                   Authentication.from_columns(row.authenticated_user,
                                                               row.authenticated_roles,
                                                               row.assumed_role))
    except NotAuthorizedError as refused:
        return await _refuse(runtime, info, row, row.owner_xid, refused)
    args, kwargs = info.signature.deserialize_inputs(row.inputs, row.serialization,
                                                     runtime.formats)
    if info.is_method:
        args = (runtime.registry.instance(row.class_name, row.config_name), *args)
    # A resumed or forked workflow continues from its own or copied checkpoints; a queue
    # claim says whether there are any, so a fresh one costs no read.
    checkpoints: dict[int, StepRecord] = {}
    if row.has_checkpoints:
        with bind_shard_keys({row.workflow_id: row.shard_key}):
            checkpoints = await runtime.system_database.load_checkpoints(row.workflow_id)
    return launch(runtime, info, row.workflow_id, row.owner_xid, args, kwargs, checkpoints,
                  row.deadline_epoch_ms, row.shard_key, row.attributes, authentication,
                  row.serialization or PORTABLE_JSON, telemetry=telemetry)


async def _refuse(runtime: Runtime, info: WorkflowInfo, row: WorkflowRow, owner_xid: str,
                  refused: NotAuthorizedError) -> Execution:
    """End a claimed workflow with ``refused`` (fenced by this claim's owner) without
    running it; the execution returned has already failed with it."""
    logger.error("Workflow %s cannot run: %s", row.workflow_id, refused)
    text, recorded = recorded_error(refused, runtime.formats,
                                    row.serialization or PORTABLE_JSON)
    with bind_shard_keys({row.workflow_id: row.shard_key}):
        await runtime.system_database.record_outcome(row.workflow_id, owner_xid, error=text)
    execution = Execution(info)
    _fail(execution.result, recorded)
    return execution


async def _run(ctx: WorkflowContext, execution: Execution, args: tuple[Any, ...],
               kwargs: dict[str, Any], attributes: str | None) -> None:
    runtime, workflow_id = ctx.runtime, ctx.workflow_id
    future = execution.result
    run = observe.workflow_run(ctx, execution.info.name, future, attributes)
    handed_over = False
    # Everything the workflow writes, its outcome included, waits out a database outage:
    # an infrastructure error is never its outcome (see dbos_async/_sysdb/retry.py).
    with ctx.routed(), outlasting_outages(), run:
        try:
            value = await _body_within_deadline(ctx, execution, args, kwargs)
        except asyncio.CancelledError:
            # The executor is shutting down: the workflow stays PENDING and resumes on
            # recovery.
            _fail(future, DBOSError(
                f"Workflow {workflow_id!r} was interrupted by executor shutdown; it resumes "
                "from its last checkpoint when an executor recovers it"
            ))
            raise
        except _DeadlineExceeded:
            with contextlib.suppress(NonExistentWorkflowError):  # deleted meanwhile
                await runtime.system_database.cancel([workflow_id], children=False)
            runtime.notify_completion(workflow_id, ctx.shard_key)
            _fail(future, WorkflowCancelledError(workflow_id, "cancelled: its deadline passed"))
        except Exception as error:
            handed_over = await _finish(ctx, execution, run, error=error)
        else:
            handed_over = await _finish(ctx, execution, run, value=value)
        finally:
            if not handed_over:
                _release(ctx, future)


class _DeadlineExceeded(Exception):
    pass


async def _body_within_deadline(ctx: WorkflowContext, execution: Execution,
                                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    fn = execution.info.fn
    try:
        with running_workflow(ctx):
            if ctx.deadline_epoch_ms is None:
                return await fn(*args, **kwargs)
            deadline = ctx.runtime.system_database.clock.deadline(ctx.deadline_epoch_ms)
            try:
                async with deadline:
                    return await fn(*args, **kwargs)
            except TimeoutError:
                if deadline.expired():
                    raise _DeadlineExceeded() from None
                raise  # the body's own
    finally:
        execution.body_ended()


async def _finish(ctx: WorkflowContext, execution: Execution, run: observe.workflow_run, *,
                  value: Any = None, error: Exception | None = None) -> bool:
    """Record the outcome under the fence, or adopt the recorded one if the fence was lost.

    Where it can, the write is handed over to the group commit and the task ends here
    (True): the body is done, and the outcome's verdict settles the run when its batch
    commits (:class:`_Settling`). A round of workflows then costs no second step of each
    task, and what they held is freed at once."""
    runtime, workflow_id, future = ctx.runtime, ctx.workflow_id, execution.result
    sysdb = runtime.system_database
    try:
        if error is not None and _stops_execution(ctx, error):
            await _adopt(ctx, execution)
            return False
        output: str | None = None
        text: str | None = None
        if error is not None:
            # The caller gets the failure as a replay will: in its recorded form.
            text, error = recorded_error(error, runtime.formats, ctx.serialization)
        else:
            try:
                output = execution.info.signature.serialize_result(value, runtime.formats,
                                                                   ctx.serialization).text
            except SerializationError as bad:
                text, error = recorded_error(bad, runtime.formats, ctx.serialization)
        verdict = sysdb.outcome_handed_over(workflow_id, ctx.owner_xid, output=output,
                                            error=text)
        if verdict is not None:
            run.report_later()
            verdict.add_done_callback(_Settling(ctx, execution, run, value, error))
            return True
        if await sysdb.record_outcome(workflow_id, ctx.owner_xid, output=output, error=text):
            _resolve(future, value, error)
        else:
            await _adopt(ctx, execution)
    except asyncio.CancelledError:
        future.cancel()
        raise
    except Exception as failure:
        if not future.done():
            _fail(future, failure)
    return False


class _Settling:
    """An outcome handed over to be written: settles the run as :func:`_finish` would have
    once the verdict of its write is in (called with the verdict's future). A lost fence
    is adopted in a task of the runtime's workflow owner."""

    __slots__ = ("_ctx", "_error", "_execution", "_run", "_value")

    def __init__(self, ctx: WorkflowContext, execution: Execution, run: observe.workflow_run,
                 value: Any, error: Exception | None) -> None:
        self._ctx, self._execution, self._run = ctx, execution, run
        self._value, self._error = value, error

    def __call__(self, verdict: asyncio.Future[bool]) -> None:
        ctx, execution, run = self._ctx, self._execution, self._run
        future = execution.result
        if verdict.cancelled():  # the executor closed before the write was made
            future.cancel()
        elif (failure := verdict.exception()) is not None:
            _fail(future, failure)
        elif verdict.result():
            _resolve(future, self._value, self._error)
        else:
            try:
                ctx.runtime.workflows.spawn(_adopted(ctx, execution, run),
                                            name=f"workflow {ctx.workflow_id} adoption")
            except RuntimeError as closing:  # the executor is closing: nothing starts
                _fail(future, DBOSError(f"Workflow {ctx.workflow_id!r}: {closing}"))
            else:
                return
        _release(ctx, future)
        run.report()


async def _adopted(ctx: WorkflowContext, execution: Execution,
                   run: observe.workflow_run) -> None:
    try:
        await _adopt(ctx, execution)
    except asyncio.CancelledError:
        execution.result.cancel()
        raise
    except Exception as failure:
        if not execution.result.done():
            _fail(execution.result, failure)
    finally:
        _release(ctx, execution.result)
        run.report()


async def _adopt(ctx: WorkflowContext, execution: Execution) -> None:
    """Another execution owns the workflow now, or it was cancelled: report what is
    recorded."""
    runtime, workflow_id = ctx.runtime, ctx.workflow_id
    logger.info("Workflow %s is recorded by another execution; adopting its outcome",
                workflow_id)
    outcome = await runtime.system_database.wait_outcome(
        workflow_id, runtime.config.result_poll_interval)
    execution.result.set_result(outcome_value(workflow_id, outcome, execution.info.signature,
                                              runtime.formats))


def _resolve(future: asyncio.Future[Any], value: Any, error: Exception | None) -> None:
    """The recorded outcome, as the run's result."""
    if error is not None:
        _fail(future, error)
    else:
        future.set_result(value)


def _release(ctx: WorkflowContext, future: asyncio.Future[Any]) -> None:
    """The run is over here: no longer running in this process, nor cancellable."""
    ctx.runtime.untrack(ctx.workflow_id, ctx.shard_key, future)
    ctx.runtime.cancellation.detach(ctx)


def _stops_execution(ctx: WorkflowContext, error: Exception) -> bool:
    """Whether ``error`` is this workflow being cancelled or taken over, or this executor
    losing its ID (nothing to record: the status says it, or the new holder recovers it).
    Another workflow's cancellation, met by awaiting its handle, is a failure like any
    other, recorded as this workflow's outcome."""
    if isinstance(error, RecordedError):
        return False
    if isinstance(error, ExecutorIdLostError):
        return True
    return (isinstance(error, WorkflowCancelledError | WorkflowConflictError)
            and (ctx.cancelled or error.workflow_id == ctx.workflow_id))
