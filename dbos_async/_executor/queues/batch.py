"""Enqueueing a batch: many workflows on one queue in one statement per shard key.

Each row is planned by the one start plan (:func:`~dbos_async._executor.start.plan_start`),
as a single enqueue is; the rows are then written together. Deduplication does not fail the
batch: each row reports what became of it (:class:`EnqueueResult`). A large batch is
planned, written and answered a chunk at a time (:mod:`dbos_async._sysdb.chunks`), its
statements in one transaction, so it still lands whole or not at all.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from dbos_async._executor.context import WorkflowContext, attributes_json
from dbos_async._executor.handles import WorkflowHandle, workflow_handle
from dbos_async._executor.peer import Peer
from dbos_async._executor.queues.enqueue import EnqueueTarget, announcement_key, check_partition
from dbos_async._executor.queues.options import check_options
from dbos_async._executor.registry import WorkflowInfo
from dbos_async._executor.runtime import Runtime
from dbos_async._executor.serialization import Signature
from dbos_async._executor.start import (
    Arguments,
    CallContext,
    Placement,
    StartPlan,
    new_workflow_id,
    plan_registered,
    read_call,
)
from dbos_async._executor.steps import replay
from dbos_async._executor.telemetry.tracing import traced_attributes
from dbos_async._sysdb.chunks import spans
from dbos_async._sysdb.database import BatchStart, StepRecord, SystemDatabase
from dbos_async._sysdb.statements import NewWorkflow, ParentStep
from dbos_async.errors import DBOSError

ENQUEUE_MANY = "DBOS.enqueue_many"
"""The checkpoint a workflow body's batch enqueue records (its output: every row's
workflow ID, outcome, workflow name and shard key)."""

EnqueueOutcome = Literal["enqueued", "existing", "deduplicated"]
"""What became of a row of a batch: written now; found already under its workflow ID; or
not written because an active workflow of the queue holds its deduplication ID."""


RowOutcome = tuple[str, EnqueueOutcome, str, str | None]
"""A row's result as a workflow's checkpoint records it: the workflow ID of its handle, the
outcome, that workflow's name and its shard key."""


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


Planned = tuple[StartPlan, Signature | None]
"""A row of a batch ready to write: its start plan and the signature typing its handle's
result (None for a client, which decodes results as plain JSON)."""


async def planned_rows(requests: Sequence[EnqueueRequest],
                       plan: Callable[[int, EnqueueRequest], Planned]) -> list[Planned]:
    """Check and plan (``plan``: serialize its arguments, fill its columns) every row of a
    batch before anything is written, a chunk at a time so the event loop runs between
    chunks. An empty batch is refused; a bad row raises naming its index."""
    if isinstance(requests, EnqueueRequest) or not isinstance(requests, Sequence) \
            or not requests:
        raise DBOSError("enqueue_many needs a non-empty list of EnqueueRequest")
    plans = []
    async for span in spans(len(requests)):
        for index in span:
            r = _checked(index, requests[index])
            try:
                plans.append(plan(index, r))
            except DBOSError as error:
                error.add_note(f"in row {index} of enqueue_many")
                raise
    return plans


def _checked(index: int, r: object) -> EnqueueRequest:
    """Row ``index`` of a batch, refused naming it if malformed."""
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
    return r


async def enqueue_batch(peer: Peer, plans: Sequence[Planned],
                        parent_step: ParentStep | None = None) -> list[EnqueueResult]:
    """Write the planned rows together and return one result per row, in order; wake the
    claimers of the rows written. Two rows with one workflow ID (under one key) are
    refused before anything is written. With ``parent_step`` (a workflow body's batch)
    the parent's checkpoint of the results is written in the same transaction; a replay
    that finds it returns the recorded results. A large batch is answered a chunk at a
    time, the event loop let run between chunks."""
    sysdb = peer.system_database
    starts = await _written(sysdb, plans, parent_step)
    if isinstance(starts, StepRecord):
        return await recorded_results(peer, starts)
    results = []
    announced: set[str] = set()
    async for span in spans(len(plans)):
        for i in span:
            (plan, signature), start = plans[i], starts[i]
            if start.created and (key := announcement_key(plan.row)) not in announced:
                announced.add(key)
                sysdb.announce_insert(key)
            row = _outcome(plan, start)
            results.append(_result(peer, row, signature if row[1] != "deduplicated" else None))
    return results


async def _written(sysdb: SystemDatabase, plans: Sequence[Planned],
                   parent_step: ParentStep | None) -> list[BatchStart] | StepRecord:
    """Write the rows, with the parent's checkpoint of their outcomes if ``parent_step``
    (or find that checkpoint recorded already)."""
    rows = await _distinct_rows(plans)
    if parent_step is None:
        return await sysdb.start_workflows(rows)

    async def output_of(starts: Sequence[BatchStart]) -> str:
        """The checkpoint's JSON list of the rows' outcomes, encoded a chunk at a time."""
        chunks = []
        async for span in spans(len(plans)):
            chunks.append(json.dumps([_outcome(plans[i][0], starts[i]) for i in span])[1:-1])
        return f"[{', '.join(chunks)}]"

    return await sysdb.start_workflows_recorded(rows, parent_step, ENQUEUE_MANY, output_of)


async def _distinct_rows(plans: Sequence[Planned]) -> list[tuple[NewWorkflow, str]]:
    """The rows to write, each with its creator token; a workflow ID twice (under one
    key) is refused."""
    seen: set[tuple[str | None, str]] = set()
    rows = []
    async for span in spans(len(plans)):
        for i in span:
            plan = plans[i][0]
            ref = (plan.shard_key, plan.workflow_id)
            if ref in seen:
                raise DBOSError(f"enqueue_many got workflow ID {plan.workflow_id!r} twice")
            seen.add(ref)
            rows.append((plan.row, plan.creator_xid))
    return rows


def _outcome(plan: StartPlan, start: BatchStart) -> RowOutcome:
    if start.holder is not None:
        return (start.holder[0], "deduplicated", start.holder[1], plan.shard_key)
    return (plan.workflow_id, "enqueued" if start.created else "existing", plan.row.name,
            plan.shard_key)


def _result(peer: Peer, row: RowOutcome, signature: Signature | None) -> EnqueueResult:
    workflow_id, outcome, name, key = row
    return EnqueueResult(workflow_handle(peer, workflow_id, signature=signature,
                                         workflow_name=name, shard_key=key), outcome)


async def recorded_results(peer: Peer, record: StepRecord) -> list[EnqueueResult]:
    """The results a workflow body's batch enqueue recorded, as it returned them (their
    handles built a chunk at a time)."""
    rows = json.loads(record.output or "[]")
    results: list[EnqueueResult] = []
    async for span in spans(len(rows)):
        results.extend(_result(peer, (workflow_id, cast(EnqueueOutcome, outcome), name, key),
                               None)
                       for workflow_id, outcome, name, key in rows[span.start:span.stop])
    return results


async def enqueue_registered(
    runtime: Runtime, queue: EnqueueTarget, requests: Sequence[EnqueueRequest],
    workflow_of: Callable[[Callable[..., Any] | str, tuple[Any, ...]],
                          tuple[WorkflowInfo, tuple[Any, ...]]],
    parent: WorkflowContext | None = None, step_id: int | None = None,
) -> list[EnqueueResult]:
    """An executor's batch of its registered workflows (``workflow_of`` finds each row's
    registration), every row's arguments serialized before anything is written. From a
    workflow body (``parent``, at its step ``step_id``) the batch is one checkpoint: the
    rows are its children, a row without an ID gets ``<parent ID>-<step>-<row index>``,
    and a replay returns the recorded results without enqueueing again."""
    runtime.require_running()
    if parent is not None and step_id is not None:
        recorded = parent.recorded(step_id, ENQUEUE_MANY)
        if recorded is not None:
            replay(parent, step_id, ENQUEUE_MANY, recorded)  # checks the name
            return await recorded_results(runtime, recorded)
    base = dataclasses.replace(read_call(as_child=False, take_id=False), parent=parent)

    def plan(index: int, r: EnqueueRequest) -> Planned:
        check_partition(queue, r.partition_key)
        info, args = workflow_of(r.workflow, tuple(r.args))
        arguments = Arguments.of(info, args, dict(r.kwargs), runtime.formats)
        call = r.call(base)
        if parent is not None and r.workflow_id is None:
            child = new_workflow_id(dataclasses.replace(call, parent_step_id=step_id))
            call = dataclasses.replace(call, workflow_id=f"{child}-{index}")
        return (plan_registered(runtime, call, info, arguments,
                                placement=r.placement(queue.name),
                                application_version=r.application_version),
                info.signature)

    plans = await planned_rows(requests, plan)
    step = (ParentStep(parent.workflow_id, step_id, parent.owner_xid,
                       runtime.system_database.clock.now_ms(),
                       parent.shard_key)
            if parent is not None and step_id is not None else None)
    return await enqueue_batch(runtime, plans, step)
