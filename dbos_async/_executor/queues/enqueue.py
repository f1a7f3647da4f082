"""Enqueueing: writing a workflow ENQUEUED (or DELAYED) on a queue, to be claimed by any
executor listening to it.

Inside a workflow an enqueue is a checkpointed child start: the parent's fence, the insert
and the parent's step row are one statement, so a replay finds the child instead of
enqueueing it again. A deduplication ID held by an active workflow of the queue rejects the
enqueue or returns the holder, for executors and clients alike (:func:`start_deduplicated`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import asyncpg

from dbos_async._executor.handles import WorkflowHandle, workflow_handle
from dbos_async._executor.queues.options import DeduplicationPolicy, EnqueueOptions
from dbos_async._executor.registry import WorkflowInfo
from dbos_async._executor.runtime import Runtime, RuntimeSource
from dbos_async._executor.start import (
    Arguments,
    CallContext,
    Placement,
    check_name,
    plan_registered,
    record_child_step,
    refused_child,
    replayed_start,
)
from dbos_async._sysdb.database import StartResult, SystemDatabase
from dbos_async._sysdb.shard_keys import shard_key_scope
from dbos_async._sysdb.statements import ENQUEUED, NewWorkflow, is_dedup_conflict
from dbos_async.errors import DBOSError, QueueDeduplicatedError, WorkflowIDInUseError

DELAYED_KEY = "dbos_async:delayed"
"""ENQUEUE_CHANNEL payload announcing a new DELAYED workflow (wakes the queue watchers,
which promote DELAYED workflows when due)."""


class EnqueueTarget(Protocol):
    """What an enqueue needs of its queue (a :class:`~dbos_async.Queue`)."""

    name: str
    partition_queue: bool

    @property
    def owner(self) -> RuntimeSource: ...


def check_partition(queue: EnqueueTarget, partition_key: str | None) -> None:
    if queue.partition_queue and partition_key is None:
        raise DBOSError(f"Queue {queue.name!r} is partitioned: enqueue with "
                        "SetEnqueueOptions(partition_key=...)")
    if not queue.partition_queue and partition_key is not None:
        raise DBOSError(f"Queue {queue.name!r} is not partitioned; a partition key was given")


def placement_of(queue: EnqueueTarget, options: EnqueueOptions) -> Placement:
    check_partition(queue, options.partition_key)
    return Placement(queue.name, priority=options.priority,
                     deduplication_id=options.deduplication_id,
                     partition_key=options.partition_key, delay=options.delay)


def announcement_key(row: NewWorkflow) -> str:
    """What wakes the claimers of a new row: its queue's loops, or for a DELAYED one the
    queue watchers (which promote it when due)."""
    return (row.queue_name or "") if row.status == ENQUEUED else DELAYED_KEY


def announce(sysdb: SystemDatabase, row: NewWorkflow) -> None:
    """Wake the claimers of a new row, here and elsewhere (after it committed)."""
    sysdb.announce_insert(announcement_key(row))


async def start_deduplicated(
    sysdb: SystemDatabase, start: Callable[[], Awaitable[StartResult]], queue_name: str,
    deduplication_id: str | None, policy: DeduplicationPolicy, shard_key: str | None = None,
) -> StartResult | tuple[str, str]:
    """Run ``start`` (an enqueue's insert) under the deduplication policy: if an active
    workflow of the queue holds ``deduplication_id`` (under the same ``shard_key``, on a
    sharded database: deduplication is per key), raise :class:`QueueDeduplicatedError`
    naming it (``"reject"``) or return its (ID, name) (``"return_existing"``); a holder
    that finished in between is enqueued afresh."""
    for _ in range(10):
        try:
            return await start()
        except asyncpg.UniqueViolationError as error:
            if not is_dedup_conflict(error) or deduplication_id is None:
                raise
            with shard_key_scope(shard_key):
                holder = await sysdb.find_deduplicated(queue_name, deduplication_id)
            if policy == "reject":
                raise QueueDeduplicatedError(queue_name, deduplication_id,
                                             holder[0] if holder else None) from None
            if holder is not None:
                return holder
    raise QueueDeduplicatedError(queue_name, deduplication_id or "")


async def enqueue(runtime: Runtime, queue: EnqueueTarget, info: WorkflowInfo,
                  call: CallContext, options: EnqueueOptions, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> WorkflowHandle[Any]:
    """Enqueue a registered workflow (a child, from a workflow body) and return its handle."""
    runtime.require_running()
    replayed = replayed_start(runtime, call, info)
    if replayed is not None:
        return replayed
    placement = placement_of(queue, options)
    arguments = Arguments.of(info, args, kwargs, runtime.formats)
    plan = plan_registered(runtime, call, info, arguments, placement=placement,
                           application_version=options.application_version)
    sysdb, parent, step = runtime.system_database, call.parent, plan.parent_step
    try:
        started = await start_deduplicated(
            sysdb, lambda: sysdb.start_workflow(plan.row, plan.creator_xid, step,
                                                reject=call.rejects_reuse),
            queue.name, options.deduplication_id, options.deduplication_policy,
            plan.shard_key)
    except WorkflowIDInUseError as rejected:
        return await refused_child(runtime, call, plan, info, rejected)
    except QueueDeduplicatedError as rejected:
        if parent is not None and step is not None:
            await record_child_step(runtime, parent, step, info, error=rejected)
        raise
    if isinstance(started, tuple):  # "return_existing": the holder's handle
        if parent is not None and step is not None:
            return await record_child_step(runtime, parent, step, info, child=started,
                                           child_shard_key=plan.shard_key)
        return workflow_handle(runtime, started[0], workflow_name=started[1],
                               shard_key=plan.shard_key)
    check_name(started, plan.workflow_id, info.name)
    if started.created:
        announce(sysdb, plan.row)
    return workflow_handle(runtime, plan.workflow_id, signature=info.signature,
                           shard_key=plan.shard_key)
