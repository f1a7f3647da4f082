"""Enqueueing a batch: many workflows on one queue in one statement per shard key.

Each row is planned by the one start plan (:func:`~dbos_async.executor.start.plan_start`),
as a single enqueue is; the rows are then written together. Deduplication does not fail the
batch: each row reports what became of it (:class:`EnqueueResult`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dbos_async.errors import DBOSError
from dbos_async.executor.context import attributes_json
from dbos_async.executor.handles import WorkflowHandle, workflow_handle
from dbos_async.executor.peer import Peer
from dbos_async.executor.queues.enqueue import EnqueueTarget, announcement_key, check_partition
from dbos_async.executor.queues.options import check_options
from dbos_async.executor.registry import WorkflowInfo
from dbos_async.executor.runtime import Runtime
from dbos_async.executor.serialization import Signature
from dbos_async.executor.start import (
    Arguments,
    CallContext,
    Placement,
    StartPlan,
    plan_registered,
    read_call,
)
from dbos_async.executor.tracing import traced_attributes
from dbos_async.sysdb.notifications import ENQUEUE_CHANNEL

EnqueueOutcome = Literal["enqueued", "existing", "deduplicated"]
"""What became of a row of a batch: written now; found already under its workflow ID; or
not written because an active workflow of the queue holds its deduplication ID."""


@dataclass(frozen=True)
class EnqueueRequest:
    """One workflow of :meth:`~dbos_async.DBOS.enqueue_many`: the workflow (a registered
    workflow function or its name; a client names it), its arguments, and the options a
    single enqueue takes from ``SetEnqueueOptions`` (``shard_key``, on a sharded
    database, is its key)."""

    workflow: Callable[..., Any] | str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    workflow_id: str | None = None
    priority: int = 0
    deduplication_id: str | None = None
    partition_key: str | None = None
    delay: float | None = None
    application_version: str | None = None
    timeout: float | None = None
    attributes: dict[str, Any] | None = None
    shard_key: str | None = None

    def placement(self, queue_name: str) -> Placement:
        return Placement(queue_name, priority=self.priority,
                         deduplication_id=self.deduplication_id,
                         partition_key=self.partition_key, delay=self.delay)

    def call(self, base: CallContext) -> CallContext:
        """The start context of this row: its own ID, timeout, attributes and key over
        those of the block it is enqueued in (``base``)."""
        return dataclasses.replace(
            base, workflow_id=self.workflow_id,
            timeout=self.timeout if self.timeout is not None else base.timeout,
            attributes=(attributes_json(traced_attributes(self.attributes))
                        if self.attributes is not None else base.attributes),
            shard_key=self.shard_key if self.shard_key is not None else base.shard_key)


@dataclass(frozen=True)
class EnqueueResult:
    """A row of a batch enqueue: the handle on its workflow (for ``"deduplicated"``, on the
    active workflow holding its deduplication ID) and what became of it."""

    handle: WorkflowHandle[Any]
    outcome: EnqueueOutcome

    @property
    def workflow_id(self) -> str:
        return self.handle.workflow_id


def checked_requests(requests: Sequence[EnqueueRequest]) -> list[EnqueueRequest]:
    """Refuse an empty batch or a malformed row, naming it, before anything is planned."""
    if isinstance(requests, EnqueueRequest) or not isinstance(requests, Sequence) \
            or not requests:
        raise DBOSError("enqueue_many needs a non-empty list of EnqueueRequest")
    for index, r in enumerate(requests):
        if not isinstance(r, EnqueueRequest):
            raise DBOSError(f"enqueue_many row {index} is not an EnqueueRequest: {r!r}")
        if not isinstance(r.args, Sequence) or isinstance(r.args, str) \
                or not isinstance(r.kwargs, Mapping):
            raise DBOSError(f"enqueue_many row {index}: args must be a sequence and kwargs "
                            "a mapping")
        try:
            check_options({"priority": r.priority, "delay": r.delay, "timeout": r.timeout,
                           "workflow_id": r.workflow_id, "deduplication_id": r.deduplication_id,
                           "partition_key": r.partition_key})
        except DBOSError as error:
            raise DBOSError(f"enqueue_many row {index}: {error}") from None
    return list(requests)


async def enqueue_batch(peer: Peer, plans: Sequence[tuple[StartPlan, Signature | None]]
                        ) -> list[EnqueueResult]:
    """Write the planned rows together and return one result per row, in order; wake the
    claimers of the rows written. Two rows with one workflow ID (under one key) are
    refused before anything is written."""
    seen: set[tuple[str | None, str]] = set()
    for plan, _ in plans:
        ref = (plan.shard_key, plan.workflow_id)
        if ref in seen:
            raise DBOSError(f"enqueue_many got workflow ID {plan.workflow_id!r} twice")
        seen.add(ref)
    sysdb = peer.system_database
    starts = await sysdb.start_workflows([(plan.row, plan.creator_xid) for plan, _ in plans])
    results = []
    for (plan, signature), start in zip(plans, starts, strict=True):
        if start.holder is not None:
            handle = workflow_handle(peer, start.holder[0], workflow_name=start.holder[1],
                                     shard_key=plan.shard_key)
            results.append(EnqueueResult(handle, "deduplicated"))
            continue
        handle = workflow_handle(peer, plan.workflow_id, signature=signature,
                                 shard_key=plan.shard_key)
        results.append(EnqueueResult(handle, "enqueued" if start.created else "existing"))
    for key in dict.fromkeys(announcement_key(plan.row)
                             for (plan, _), start in zip(plans, starts, strict=True)
                             if start.created):
        sysdb.notify(ENQUEUE_CHANNEL, key)
    return results


async def enqueue_registered(
    runtime: Runtime, queue: EnqueueTarget, requests: Sequence[EnqueueRequest],
    workflow_of: Callable[[Callable[..., Any] | str, tuple[Any, ...]],
                          tuple[WorkflowInfo, tuple[Any, ...]]],
) -> list[EnqueueResult]:
    """An executor's batch of its registered workflows (``workflow_of`` finds each row's
    registration), every row's arguments serialized before anything is written."""
    runtime.require_running()
    base = read_call(as_child=False, take_id=False)
    plans = []
    for index, r in enumerate(checked_requests(requests)):
        try:
            check_partition(queue, r.partition_key)
            info, args = workflow_of(r.workflow, tuple(r.args))
            arguments = Arguments.of(info, args, dict(r.kwargs))
        except DBOSError as error:
            error.add_note(f"in row {index} of enqueue_many")
            raise
        plans.append((plan_registered(runtime, r.call(base), info, arguments,
                                      placement=r.placement(queue.name),
                                      application_version=r.application_version),
                      info.signature))
    return await enqueue_batch(runtime, plans)
