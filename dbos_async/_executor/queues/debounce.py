"""Debouncing: collapse a burst of enqueues of one workflow into one run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, Generic, ParamSpec, TypeVar

import asyncpg

from dbos_async._executor.context import WorkflowContext, current_workflow
from dbos_async._executor.handles import WorkflowHandle, workflow_handle
from dbos_async._executor.queues.enqueue import DELAYED_KEY, EnqueueTarget, announce, placement_of
from dbos_async._executor.queues.options import EnqueueOptions, check_options, current_options
from dbos_async._executor.registry import WorkflowInfo, workflow_info_of
from dbos_async._executor.runtime import RuntimeSource
from dbos_async._executor.start import (
    Arguments,
    CallContext,
    StartPlan,
    authorized,
    plan_registered,
    read_call,
    record_child_step,
    replayed_child,
)
from dbos_async._sysdb.database import SystemDatabase
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL
from dbos_async._sysdb.shard_keys import shard_key_scope
from dbos_async._sysdb.statements import ParentStep, Payload, is_dedup_conflict
from dbos_async._validation import check_identifier
from dbos_async.errors import DBOSError, QueueDeduplicatedError

P = ParamSpec("P")
R = TypeVar("R")


def check_window(period: float, max_delay: float | None) -> None:
    """Refuse a debounce ``period`` that is not a positive number of seconds, or a
    ``max_delay`` that is not a delay."""
    check_options({"delay": period})
    if not period > 0:
        raise DBOSError(f"A debounce period must be positive, got {period!r}")
    if max_delay is not None:
        check_options({"delay": max_delay})


class Debouncer(Generic[P, R]):
    """Collapse bursts of enqueues of one workflow into one run with the latest arguments.

    ``await debouncer.debounce(key, *args, **kwargs)``: if a workflow debounced under ``key``
    on this queue has not started yet, it gets these arguments and its start moves to
    ``period`` seconds from now, but never past ``max_delay`` seconds after the first call
    of the burst; otherwise a new workflow is enqueued to start in ``period`` seconds.
    Returns the handle of the workflow that will run. From a workflow body the handle is
    checkpointed, so a replay returns it without debouncing again.
    """

    def __init__(self, queue: EnqueueTarget, fn: Callable[P, Coroutine[Any, Any, R]],
                 period: float, max_delay: float | None) -> None:
        check_window(period, max_delay)
        self.queue = queue
        self.fn = fn
        self.period = float(period)
        self.max_delay = float(max_delay) if max_delay is not None else None

    def debounce(self, key: str, /, *args: P.args,
                 **kwargs: P.kwargs) -> Coroutine[Any, Any, WorkflowHandle[R]]:
        check_identifier(key, "debounce key")
        owner = self.queue.owner
        info, full_args = workflow_info_of(self.fn, args, owner)
        options = replace(current_options(), deduplication_id=key, delay=self.period)
        # Not a child of a calling workflow: the burst may gather calls from many.
        call = read_call(workflow_id=options.workflow_id, timeout=options.timeout,
                         as_child=False)
        if call.rejects_reuse:
            raise DBOSError("Cannot debounce a workflow with workflow_id_reuse_policy "
                            "'reject': a debounce owns how its workflow is started")
        parent = current_workflow()
        if parent is None:
            return self._debounce(owner, info, call, options, full_args, dict(kwargs))
        # Its position is fixed at the call, as for any step.
        return self._debounce_in(parent, parent.allocate_step_id(), owner, info, call,
                                 options, full_args, dict(kwargs))

    async def _debounce_in(self, parent: WorkflowContext, step_id: int, owner: RuntimeSource,
                           info: WorkflowInfo, call: CallContext, options: EnqueueOptions,
                           args: tuple[Any, ...], kwargs: dict[str, Any]
                           ) -> WorkflowHandle[Any]:
        """A debounce from a workflow body, checkpointed as the handle it returned (at least
        once: a crash before the checkpoint debounces again on replay)."""
        runtime = owner._current_runtime
        recorded = parent.recorded(step_id, info.name)
        if recorded is not None:
            return replayed_child(runtime, parent, step_id, info, recorded)
        step = ParentStep(parent.workflow_id, step_id, parent.owner_xid,
                          runtime.system_database.clock.now_ms())
        handle = await self._debounce(owner, info, call, options, args, kwargs)
        return await record_child_step(runtime, parent, step, info,
                                       child=(handle.workflow_id, info.name),
                                       child_shard_key=handle.shard_key)

    async def _debounce(self, owner: RuntimeSource, info: WorkflowInfo, call: CallContext,
                        options: EnqueueOptions, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> WorkflowHandle[Any]:
        runtime = owner._current_runtime
        runtime.require_running()
        call = authorized(call, info)  # before a call joins a burst, too
        queue, key = self.queue, options.deduplication_id
        assert key is not None
        placement = replace(placement_of(queue, options), debounced=True,
                            max_delay=self.max_delay)
        arguments = Arguments.of(info, args, kwargs, runtime.formats)
        workflow_id, shard_key = await debounce_start(
            runtime.system_database, queue.name, key, info.name, arguments.inputs,
            self.period, call.shard_key,
            lambda: plan_registered(runtime, call, info, arguments, placement=placement,
                                    application_version=options.application_version))
        return workflow_handle(runtime, workflow_id, signature=info.signature,
                               shard_key=shard_key)


async def debounce_start(sysdb: SystemDatabase, queue_name: str, key: str, name: str,
                         inputs: Payload, period: float, shard_key: str | None,
                         plan: Callable[[], StartPlan]) -> tuple[str, str | None]:
    """One call of a burst (an executor's :class:`Debouncer` or a client's): the waiting
    workflow debounced under ``key`` on the queue gets ``inputs`` and its start moved to
    ``period`` seconds from now, or, if none waits, the workflow ``plan`` makes is started.
    Returns the ID and shard key of the workflow that will run."""
    for _ in range(50):
        until = sysdb.clock.now_ms() + int(period * 1000)
        # Deduplication, so debouncing, is per shard key.
        with shard_key_scope(shard_key):
            bounced = await sysdb.debounce_existing(queue_name, key, name, inputs, until)
        if bounced is not None:
            # Its start moved: wake the queue watchers.
            sysdb.notify(ENQUEUE_CHANNEL, DELAYED_KEY)
            return bounced, shard_key
        planned = plan()
        try:
            started = await sysdb.start_workflow(planned.row, planned.creator_xid)
        except asyncpg.UniqueViolationError as error:
            if not is_dedup_conflict(error):
                raise
            # A concurrent call started the burst first: join it (a real pause, for
            # its commit to land; no durable time).
            await asyncio.sleep(0.001)
            continue
        announce(sysdb, planned.row)
        return started.row.workflow_id, planned.shard_key
    raise QueueDeduplicatedError(queue_name, key)
