"""Operating workflows from an executor or a client: cancel, delete, list, steps, versions.

The public methods over these functions are defined once, in
:class:`~dbos_async._executor.operator.Operator`.

The SQL runs in :mod:`dbos_async._sysdb.management.operations`; this module turns rows into
typed values (inputs, outputs and errors deserialized with the registered workflow's
signature when this executor has it, as plain JSON otherwise) and sends the notifications a
cancel owes.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypedDict

from dbos_async._executor.context import attributes_json
from dbos_async._executor.handles import WorkflowInputs, WorkflowStatus
from dbos_async._executor.peer import Peer
from dbos_async._executor.queues.enqueue import DELAYED_KEY
from dbos_async._executor.queues.options import check_options
from dbos_async._executor.recorded_errors import deserialize_error
from dbos_async._sysdb.clock import Clock
from dbos_async._sysdb.management.operations import CancelledWorkflow, ForkSpec
from dbos_async._sysdb.notifications import (
    ENQUEUE_CHANNEL,
    WORKFLOW_CANCEL_CHANNEL,
    WORKFLOW_COMPLETION_CHANNEL,
    keyed,
)
from dbos_async._sysdb.records import StatusRecord
from dbos_async._sysdb.shard_keys import WorkflowAddress, bind_shard_keys
from dbos_async._sysdb.statements import (
    ERROR,
    INTERNAL_QUEUE_NAME,
    VersionRecord,
    WorkflowFilter,
)
from dbos_async._validation import check_identifier, check_lookup, check_lookups
from dbos_async.errors import DBOSError, NonExistentWorkflowError, SerializationError

logger = logging.getLogger("dbos_async")

TimeBound = datetime | str | int
"""A time filter: a datetime (naive means UTC), an ISO 8601 string, or epoch milliseconds."""


@dataclass(frozen=True)
class WorkflowStepInfo:
    """One recorded step (or other checkpoint) of a workflow."""

    function_id: int
    name: str
    output: Any
    error: BaseException | None
    child_workflow_id: str | None
    started_at_epoch_ms: int | None
    completed_at_epoch_ms: int | None
    # The shard key the child lives under (sharded databases only).
    child_shard_key: str | None = None


@dataclass(frozen=True)
class ApplicationVersion:
    """A row of ``application_versions``; the latest is the one with the newest timestamp."""

    version_id: str
    version_name: str
    version_timestamp: int
    created_at: int

    @classmethod
    def _from_record(cls, record: VersionRecord) -> ApplicationVersion:
        return cls(record.version_id, record.version_name, record.version_timestamp,
                   record.created_at)


def epoch_ms(value: TimeBound | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise DBOSError(f"{what} must be a datetime, an ISO 8601 string or epoch milliseconds")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise DBOSError(f"{what} is not an ISO 8601 time: {value!r}") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return int(value.timestamp() * 1000)
    raise DBOSError(f"{what} must be a datetime, an ISO 8601 string or epoch milliseconds")


def as_list(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


class WorkflowFilters(TypedDict, total=False):
    """The filters of :meth:`~dbos_async._executor.operator.Operator.list_workflows`, which
    an export takes too: every one given must match; a list matches any of its values."""

    workflow_ids: Sequence[str] | None
    status: str | Sequence[str] | None
    name: str | Sequence[str] | None
    start_time: TimeBound | None
    end_time: TimeBound | None
    completed_after: TimeBound | None
    completed_before: TimeBound | None
    dequeued_after: TimeBound | None
    dequeued_before: TimeBound | None
    was_forked_from: bool | None
    is_fork: bool | None
    has_parent: bool | None
    schedule_name: str | Sequence[str] | None
    queue_name: str | Sequence[str] | None
    parent_workflow_id: str | Sequence[str] | None
    forked_from: str | Sequence[str] | None
    executor_id: str | Sequence[str] | None
    application_version: str | Sequence[str] | None
    authenticated_user: str | Sequence[str] | None
    workflow_id_prefix: str | Sequence[str] | None
    application_name: str | Sequence[str] | None
    attributes: dict[str, Any] | None
    shard_key: str | Sequence[str] | None
    parent_shard_key: str | Sequence[str] | None
    limit: int | None
    offset: int | None
    sort_desc: bool
    queues_only: bool


LOOKUP_FILTERS = ("workflow_ids", "status", "name", "queue_name", "parent_workflow_id",
                  "forked_from", "executor_id", "application_version", "authenticated_user",
                  "workflow_id_prefix", "application_name", "shard_key", "parent_shard_key",
                  "schedule_name")
"""The filters compared with stored names and IDs: a value no row can hold is refused."""


FLAG_FILTERS = ("was_forked_from", "is_fork", "has_parent", "queues_only", "sort_desc")
"""The filters that are yes-or-no questions: only a bool (or None: either) answers one."""


def workflow_filter(filters: WorkflowFilters, *, load_input: bool,
                    load_output: bool) -> WorkflowFilter:
    """The listing statement's filter for these keyword filters; an unknown one or a
    negative page bound raises :class:`DBOSError`."""
    unknown = sorted(set(filters) - WorkflowFilters.__optional_keys__)
    if unknown:
        raise DBOSError(f"Unknown workflow filter(s): {', '.join(unknown)}")
    check_page(filters.get("limit"), filters.get("offset"))
    for argument in LOOKUP_FILTERS:
        check_lookups(filters.get(argument), argument)
    for flag in FLAG_FILTERS:
        if not isinstance(filters.get(flag), bool | None):
            raise DBOSError(f"{flag} must be True, False or None, got {filters.get(flag)!r}")
    workflow_ids = filters.get("workflow_ids")
    return WorkflowFilter(
        workflow_ids=list(workflow_ids) if workflow_ids is not None else None,
        statuses=as_list(filters.get("status")),
        names=as_list(filters.get("name")),
        start_ms=epoch_ms(filters.get("start_time"), "start_time"),
        end_ms=epoch_ms(filters.get("end_time"), "end_time"),
        completed_after_ms=epoch_ms(filters.get("completed_after"), "completed_after"),
        completed_before_ms=epoch_ms(filters.get("completed_before"), "completed_before"),
        dequeued_after_ms=epoch_ms(filters.get("dequeued_after"), "dequeued_after"),
        dequeued_before_ms=epoch_ms(filters.get("dequeued_before"), "dequeued_before"),
        was_forked_from=filters.get("was_forked_from"),
        is_fork=filters.get("is_fork"),
        has_parent=filters.get("has_parent"),
        schedule_names=as_list(filters.get("schedule_name")),
        queue_names=as_list(filters.get("queue_name")),
        queues_only=bool(filters.get("queues_only")),
        parent_workflow_ids=as_list(filters.get("parent_workflow_id")),
        forked_from=as_list(filters.get("forked_from")),
        executor_ids=as_list(filters.get("executor_id")),
        application_versions=as_list(filters.get("application_version")),
        authenticated_users=as_list(filters.get("authenticated_user")),
        workflow_id_prefixes=as_list(filters.get("workflow_id_prefix")),
        application_names=as_list(filters.get("application_name")),
        attributes=attributes_json(filters.get("attributes")),
        shard_keys=as_list(filters.get("shard_key")),
        parent_shard_keys=as_list(filters.get("parent_shard_key")),
        limit=filters.get("limit"), offset=filters.get("offset"),
        sort_desc=bool(filters.get("sort_desc")),
        load_input=load_input, load_output=load_output,
    )


# ---- Cancel and delete ----


async def cancel(peer: Peer, workflow_ids: Sequence[str], cancel_children: bool) -> list[str]:
    rows = await peer.system_database.cancel(workflow_ids, children=cancel_children)
    announce_cancelled(peer, rows)
    cancelled = [row.workflow_id for row in rows]
    if cancelled:
        logger.info("Cancelled workflows: %s", ", ".join(cancelled))
    return cancelled


def announce_cancelled(peer: Peer, rows: Sequence[CancelledWorkflow]) -> None:
    """After a cancel committed: interrupt what runs here at once, and notify the rest
    (handles wake on completion, watchers on the cancel channel, the claim loops of the
    queues whose slots were freed on the enqueue channel)."""
    waiters = [keyed(row.workflow_id, row.shard_key) for row in rows]
    peer.interrupt_local(set(waiters))
    sysdb = peer.system_database
    for waiter in waiters:
        sysdb.notify(WORKFLOW_CANCEL_CHANNEL, waiter)
        sysdb.notify(WORKFLOW_COMPLETION_CHANNEL, waiter)
    for queue_name in sorted({row.queue_name for row in rows if row.queue_name is not None}):
        sysdb.notify(ENQUEUE_CHANNEL, queue_name)


async def delete(peer: Peer, workflow_ids: Sequence[str], delete_children: bool) -> None:
    sysdb = peer.system_database
    descendants = await sysdb.descendants(workflow_ids) if delete_children else []
    await sysdb.delete(workflow_ids, descendants)
    # Their transactions' outcomes too, once nothing can run them any more.
    refs = [*(WorkflowAddress(i, sysdb.sql.key_hint(i)) for i in workflow_ids), *descendants]
    for database in peer.application_databases.values():
        await database.delete_outputs(refs)


# ---- Listing ----


def _status(peer: Peer, row: StatusRecord, load_input: bool,
            load_output: bool) -> WorkflowStatus:
    status = WorkflowStatus._from_record(row)
    if not (load_input or load_output):
        return status
    signature = peer.signature_of(status.name)
    serialization, formats = row.serialization, peer.formats
    changes: dict[str, Any] = {}
    try:
        if load_input and row.inputs is not None:
            if signature is not None:
                args, kwargs = signature.deserialize_inputs(row.inputs, serialization, formats)
                changes["input"] = WorkflowInputs(args, kwargs)
            else:
                positional, named = formats.decode_inputs(row.inputs, serialization,
                                                          status.name)
                changes["input"] = WorkflowInputs(tuple(positional), named)
        if load_output:
            if row.error is not None:
                changes["error"] = deserialize_error(row.error, serialization, formats)
            elif row.output is not None:
                changes["output"] = (
                    signature.deserialize_result(row.output, serialization, formats)
                    if signature is not None
                    else formats.decode(row.output, serialization,
                                        f"the result of {status.name}")
                )
    except SerializationError as error:
        # A payload in a format this peer does not read (py_pickle without allow_pickle,
        # another serializer): the status is still listed, with what could be read.
        logger.debug("Workflow %s: payload not loaded: %s", status.workflow_id, error)
    return dataclasses.replace(status, **changes)


MAX_PAGE_BOUND = 2**63 - 1
"""The largest limit or offset: PostgreSQL's bigint, which LIMIT and OFFSET take."""


def check_page(limit: int | None, offset: int | None) -> None:
    """Refuse a page that is not a count of rows PostgreSQL can take."""
    for what, value in (("limit", limit), ("offset", offset)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= MAX_PAGE_BOUND):
            raise DBOSError(f"{what} must be an integer from 0 to {MAX_PAGE_BOUND}, "
                            f"got {value!r}")


async def list_workflows(peer: Peer, f: WorkflowFilter) -> list[WorkflowStatus]:
    rows = await peer.system_database.list_workflows(f)
    return [_status(peer, row, f.load_input, f.load_output) for row in rows]


async def list_steps(peer: Peer, workflow_id: str, *, limit: int | None = None,
                     offset: int | None = None,
                     load_output: bool = True) -> list[WorkflowStepInfo]:
    """A page of a workflow's checkpoints; an unknown ID raises
    :class:`NonExistentWorkflowError`."""
    check_page(limit, offset)
    sysdb = peer.system_database
    rows = await sysdb.list_steps(workflow_id, limit=limit, offset=offset,
                                  load_output=load_output)
    if not rows and await sysdb.get_workflow(workflow_id) is None:
        raise NonExistentWorkflowError(workflow_id)
    steps = []
    for row in rows:
        serialization = row["serialization"]
        output: Any = None
        error: BaseException | None = None
        try:
            if row["error"] is not None:
                error = deserialize_error(row["error"], serialization, peer.formats)
            elif row["output"] is not None:
                output = peer.formats.decode(row["output"], serialization,
                                             f"the output of step {row['function_id']}")
        except SerializationError as bad:
            logger.debug("Step %s of %s: output not loaded: %s", row["function_id"],
                         workflow_id, bad)
        steps.append(WorkflowStepInfo(
            function_id=row["function_id"], name=row["function_name"], output=output,
            error=error, child_workflow_id=row["child_workflow_id"],
            started_at_epoch_ms=row["started_at_epoch_ms"],
            completed_at_epoch_ms=row["completed_at_epoch_ms"],
            child_shard_key=row.get("child_shard_key"),
        ))
    return steps


# ---- Resume, fork, rewind ----


def _announce_enqueued(peer: Peer, queue_name: str) -> None:
    """After the re-enqueue committed: wake that queue's claim loops, here and elsewhere."""
    peer.system_database.notify(ENQUEUE_CHANNEL, queue_name)


async def resume(peer: Peer, workflow_ids: Sequence[str], queue_name: str | None,
                 application_version: str | None = None) -> list[str]:
    """Re-enqueue cancelled, dead-lettered or stuck workflows (under
    ``application_version``, if given); they continue from their last checkpoint. SUCCESS
    and ERROR workflows are left as they are. Returns the IDs that were re-enqueued."""
    queue = queue_name or INTERNAL_QUEUE_NAME
    resumed = await peer.system_database.resume(workflow_ids, queue, application_version)
    if resumed:
        _announce_enqueued(peer, queue)
        version = f" under version {application_version}" if application_version else ""
        logger.info("Resumed workflows on queue %s%s: %s", queue, version,
                    ", ".join(resumed))
    return resumed


def _timeout_ms(timeout: float | None) -> int | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise DBOSError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return int(timeout * 1000)


class StartPoint(enum.Enum):
    """Where a fork or a rewind starts, found in the workflow's recorded steps when the
    call is made."""

    LAST_FAILURE = "last_failure"
    """The last step that recorded an error (it and what follows run again); for a
    workflow whose body failed after its last checkpoint, one past that checkpoint."""
    LAST_STEP = "last_step"
    """The last recorded checkpoint: it and what follows run again."""


@dataclass(frozen=True)
class StepNamed:
    """A fork or rewind starting at the checkpoint named ``name``: its ``occurrence``-th
    one by position (from 0; negative counts back from the last, -1 being the last)."""

    name: str
    occurrence: int = 0


StartStep = int | StartPoint | StepNamed
"""A fork's or a rewind's first step to run again: a position (``function_id``), or a
point found in the recorded steps."""


async def start_position(peer: Peer, workflow_id: str, start: StartStep) -> int:
    """The position ``start`` names in ``workflow_id``'s recorded steps (a position is
    itself; its range is checked by the fork or rewind). Raises :class:`DBOSError` when
    the steps have no such point, :class:`NonExistentWorkflowError` for an unknown ID."""
    if isinstance(start, int) and not isinstance(start, bool):
        return start
    sysdb = peer.system_database
    if start is StartPoint.LAST_STEP:
        found = await sysdb.step_position(workflow_id)
    elif start is StartPoint.LAST_FAILURE:
        found = await sysdb.step_position(workflow_id, failed=True)
    elif isinstance(start, StepNamed):
        check_lookup(start.name, "step name")
        if isinstance(start.occurrence, bool) or not isinstance(start.occurrence, int):
            raise DBOSError(f"StepNamed.occurrence must be an integer, got "
                            f"{start.occurrence!r}")
        found = await sysdb.step_position(workflow_id, name=start.name,
                                          index=start.occurrence)
    else:
        raise DBOSError("start_step must be a step position (an int), StartPoint.LAST_FAILURE,"
                        f" StartPoint.LAST_STEP or StepNamed(name), got {start!r}")
    if found is not None:
        return found
    row = await sysdb.get_workflow(workflow_id)
    if row is None:
        raise NonExistentWorkflowError(workflow_id)
    if start is StartPoint.LAST_STEP:
        return 0  # nothing recorded: all of it runs again
    if start is StartPoint.LAST_FAILURE:
        if row.status != ERROR:
            raise DBOSError(f"Workflow {workflow_id!r} has no failure to start from: no step "
                            f"recorded an error and it is {row.status}")
        # The body failed after its last checkpoint: run on from there.
        last = await sysdb.step_position(workflow_id)
        return 0 if last is None else last + 1
    assert isinstance(start, StepNamed)
    raise DBOSError(f"Workflow {workflow_id!r} has no step named {start.name!r} "
                    f"(occurrence {start.occurrence})")


@dataclass(frozen=True)
class ForkRequest:
    """One fork of :meth:`~dbos_async.DBOS.fork_workflows`: workflow ``workflow_id``
    (under ``shard_key``, on a sharded database) re-run from ``start_step``, as
    ``new_workflow_id`` (random by default), its copied steps naming the children of
    ``replacement_children`` instead."""

    workflow_id: str
    start_step: StartStep = 0
    new_workflow_id: str | None = None
    shard_key: str | None = None
    replacement_children: dict[str, str] | None = None


async def fork(peer: Peer, forks: Sequence[ForkRequest], *, workflow_timeout: float | None,
               application_version: str | None, queue_name: str | None,
               partition_key: str | None) -> list[WorkflowAddress]:
    """New ENQUEUED workflows with their originals' inputs, whose steps below each
    ``start_step`` replay from copies of the original's checkpoints, all created in one
    transaction (or none). Returns each fork's ID and key (its original's), in order."""
    if isinstance(forks, ForkRequest) or not isinstance(forks, Sequence) or not forks:
        raise DBOSError("fork_workflows needs a non-empty list of ForkRequest")
    timeout_ms = _timeout_ms(workflow_timeout)
    queue = queue_name or INTERNAL_QUEUE_NAME
    sysdb = peer.system_database
    specs = []
    for index, f in enumerate(forks):
        if not isinstance(f, ForkRequest) or not isinstance(f.workflow_id, str) \
                or not f.workflow_id:
            raise DBOSError(f"fork_workflows row {index} is not a ForkRequest naming a "
                            f"workflow: {f!r}")
        with bind_shard_keys({f.workflow_id: f.shard_key}):
            key = sysdb.sql.key_hint(f.workflow_id)
            start = await start_position(peer, f.workflow_id, f.start_step)
        specs.append(ForkSpec(f.workflow_id, f.new_workflow_id or str(uuid.uuid4()),
                              start, key, dict(f.replacement_children or {})))
    new_ids = [(s.shard_key, s.fork_id) for s in specs]
    repeated = sorted(i for (_, i), n in Counter(new_ids).items() if n > 1)
    if repeated:
        raise DBOSError(f"fork_workflows got the new workflow ID {repeated[0]!r} twice")
    await sysdb.fork(specs, queue_name=queue, application_version=application_version,
                     timeout_ms=timeout_ms, partition_key=partition_key)
    _announce_enqueued(peer, queue)
    for s in specs:
        logger.info("Forked workflow %s from step %s as %s", s.original_id, s.start_step,
                    s.fork_id)
    return [WorkflowAddress(s.fork_id, s.shard_key) for s in specs]


async def rewind(peer: Peer, workflow_id: str, start_step: StartStep, *,
                 application_version: str | None, queue_name: str | None) -> None:
    """Discard a finished workflow's history from ``start_step`` on and re-enqueue it
    under its own ID; steps from ``start_step`` run again."""
    queue = queue_name or INTERNAL_QUEUE_NAME
    sysdb = peer.system_database
    ref = WorkflowAddress(workflow_id, sysdb.sql.key_hint(workflow_id))
    start = await start_position(peer, workflow_id, start_step)

    async def discard_transactions() -> None:
        # The outcomes transactions recorded from the cut on, or they would replay.
        for database in peer.application_databases.values():
            await database.delete_outputs([ref], start)

    await sysdb.rewind(workflow_id, start, queue_name=queue,
                       application_version=application_version,
                       while_locked=discard_transactions)
    _announce_enqueued(peer, queue)
    logger.info("Rewound workflow %s to step %s", workflow_id, start)


# ---- Changes in place: priority, delay, attributes, application name ----


async def set_priority(peer: Peer, workflow_id: str, priority: int) -> None:
    check_options({"priority": priority})
    await peer.system_database.set_priority(workflow_id, priority)
    logger.info("Workflow %s now has priority %s", workflow_id, priority)


LAST_EPOCH_MS = 2**63 - 1
"""The latest time a bigint column stores."""


def delay_until_ms(clock: Clock, delay_seconds: float | None,
                   delay_until_epoch_ms: int | None) -> int:
    """The time (epoch ms) a delay given either way ends (from ``clock``'s now)."""
    if (delay_seconds is None) == (delay_until_epoch_ms is None):
        raise DBOSError("Give either delay_seconds or delay_until_epoch_ms (exactly one)")
    if delay_until_epoch_ms is not None:
        if isinstance(delay_until_epoch_ms, bool) or not isinstance(delay_until_epoch_ms, int) \
                or not 0 <= delay_until_epoch_ms <= LAST_EPOCH_MS:
            raise DBOSError("delay_until_epoch_ms must be an integer >= 0 (epoch "
                            f"milliseconds), got {delay_until_epoch_ms!r}")
        return delay_until_epoch_ms
    check_options({"delay": delay_seconds})
    assert delay_seconds is not None
    return clock.now_ms() + int(delay_seconds * 1000)


async def set_delay(peer: Peer, workflow_id: str, until_ms: int) -> None:
    """Make a waiting workflow DELAYED until ``until_ms``, then wake the queue watchers (here
    and elsewhere) so that they pick up its new time."""
    sysdb = peer.system_database
    await sysdb.set_delay(workflow_id, until_ms)
    sysdb.notify(ENQUEUE_CHANNEL, DELAYED_KEY)
    logger.info("Workflow %s is delayed until %s", workflow_id, until_ms)


async def update_attributes(peer: Peer, workflow_id: str, attributes: dict[str, Any] | None,
                            merge: bool) -> None:
    if merge and attributes is None:
        raise DBOSError("merge=True needs a dict of attributes to merge (None clears them "
                        "only when replacing)")
    await peer.system_database.update_attributes(workflow_id, attributes_json(attributes),
                                                 merge)


async def rename_application(peer: Peer, old_name: str | None, new_name: str,
                             adopt_unclaimed_rows: bool) -> dict[str, int]:
    check_identifier(old_name, "old_name", optional=True)
    check_identifier(new_name, "new_name")
    if old_name is None and not adopt_unclaimed_rows:
        raise DBOSError("Nothing to rename: give old_name, adopt_unclaimed_rows=True, or both")
    if old_name == new_name:
        raise DBOSError(f"Application {new_name!r} already has that name")
    moved = await peer.system_database.rename_application(old_name, new_name,
                                                          adopt_unclaimed_rows)
    logger.info("Renamed application %r to %r: %s", old_name, new_name, moved)
    return moved
