"""Operating workflows from an executor or a client: cancel, delete, list, steps, versions.

The public methods over these functions are defined once, in
:class:`~dbos_async.executor.operator.Operator`.

The SQL runs in :mod:`dbos_async.sysdb.operations`; this module turns rows into typed values
(inputs, outputs and errors deserialized with the registered workflow's signature when this
executor has it, as plain JSON otherwise) and sends the notifications a cancel owes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dbos_async.errors import DBOSError, NonExistentWorkflowError, SerializationError
from dbos_async.executor.context import attributes_json
from dbos_async.executor.handles import WorkflowInputs, WorkflowStatus
from dbos_async.executor.peer import Peer
from dbos_async.executor.queues.enqueue import DELAYED_KEY
from dbos_async.executor.queues.options import check_options
from dbos_async.executor.recorded_errors import deserialize_error
from dbos_async.executor.serialization import from_json
from dbos_async.executor.start import CallContext, new_workflow_id
from dbos_async.sysdb.notifications import (
    ENQUEUE_CHANNEL,
    WORKFLOW_CANCEL_CHANNEL,
    WORKFLOW_COMPLETION_CHANNEL,
    keyed,
)
from dbos_async.sysdb.operations import CancelledWorkflow
from dbos_async.sysdb.records import StatusRecord
from dbos_async.sysdb.shard_keys import bind_shard_keys
from dbos_async.sysdb.statements import INTERNAL_QUEUE_NAME, VersionRecord, WorkflowFilter
from dbos_async.validation import check_identifier

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
    def from_record(cls, record: VersionRecord) -> ApplicationVersion:
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


# ---- Listing ----


def _status(peer: Peer, row: StatusRecord, load_input: bool,
            load_output: bool) -> WorkflowStatus:
    status = WorkflowStatus.from_record(row)
    if not (load_input or load_output):
        return status
    signature = peer.signature_of(status.name)
    serialization = row.serialization
    changes: dict[str, Any] = {}
    try:
        if load_input and row.inputs is not None:
            if signature is not None:
                args, kwargs = signature.deserialize_inputs(row.inputs, serialization)
                changes["input"] = WorkflowInputs(args, kwargs)
            else:
                data = from_json(row.inputs, serialization, f"the inputs of {status.name}")
                if isinstance(data, dict):
                    changes["input"] = WorkflowInputs(tuple(data.get("positionalArgs") or ()),
                                                      dict(data.get("namedArgs") or {}))
        if load_output:
            if row.error is not None:
                changes["error"] = deserialize_error(row.error, serialization)
            elif row.output is not None:
                changes["output"] = (
                    signature.deserialize_result(row.output, serialization)
                    if signature is not None
                    else from_json(row.output, serialization, f"the result of {status.name}")
                )
    except SerializationError as error:
        # A payload another library stored in a format we do not read (e.g. py_pickle): the
        # status is still listed, with what could be read.
        logger.debug("Workflow %s: payload not loaded: %s", status.workflow_id, error)
    return dataclasses.replace(status, **changes)


def check_page(limit: int | None, offset: int | None) -> None:
    """Refuse a page that is not a count of rows."""
    for what, value in (("limit", limit), ("offset", offset)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise DBOSError(f"{what} must be an integer >= 0, got {value!r}")


async def list_workflows(peer: Peer, f: WorkflowFilter) -> list[WorkflowStatus]:
    check_page(f.limit, f.offset)
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
                error = deserialize_error(row["error"], serialization)
            elif row["output"] is not None:
                output = from_json(row["output"], serialization,
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


async def resume(peer: Peer, workflow_ids: Sequence[str], queue_name: str | None) -> list[str]:
    """Re-enqueue cancelled, dead-lettered or stuck workflows; they continue from their
    last checkpoint. SUCCESS and ERROR workflows are left as they are. Returns the IDs
    that were re-enqueued."""
    queue = queue_name or INTERNAL_QUEUE_NAME
    resumed = await peer.system_database.resume(workflow_ids, queue)
    if resumed:
        _announce_enqueued(peer, queue)
        logger.info("Resumed workflows on queue %s: %s", queue, ", ".join(resumed))
    return resumed


def _timeout_ms(timeout: float | None) -> int | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise DBOSError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return int(timeout * 1000)


async def fork(peer: Peer, workflow_id: str, start_step: int, call: CallContext, *,
               application_version: str | None, queue_name: str | None,
               replacement_children: dict[str, str] | None) -> str:
    """A new ENQUEUED workflow with the original's inputs, whose steps below
    ``start_step`` replay from copies of the original's checkpoints; its ID and timeout
    come from ``call`` as for any start. Returns its ID."""
    new_id = new_workflow_id(call)
    queue = queue_name or INTERNAL_QUEUE_NAME
    sysdb = peer.system_database
    # The fork lives under its original's key.
    with bind_shard_keys({new_id: sysdb.sql.key_hint(workflow_id)}):
        await sysdb.fork(
            workflow_id, new_id, start_step, queue_name=queue,
            application_version=application_version, timeout_ms=_timeout_ms(call.timeout),
            replacement_children=dict(replacement_children or {}))
    _announce_enqueued(peer, queue)
    logger.info("Forked workflow %s from step %s as %s", workflow_id, start_step, new_id)
    return new_id


async def rewind(peer: Peer, workflow_id: str, start_step: int, *,
                 application_version: str | None, queue_name: str | None) -> None:
    """Discard a finished workflow's history from ``start_step`` on and re-enqueue it
    under its own ID; steps from ``start_step`` run again."""
    queue = queue_name or INTERNAL_QUEUE_NAME
    await peer.system_database.rewind(workflow_id, start_step, queue_name=queue,
                                      application_version=application_version)
    _announce_enqueued(peer, queue)
    logger.info("Rewound workflow %s to step %s", workflow_id, start_step)


# ---- Changes in place: priority, delay, attributes, application name ----


async def set_priority(peer: Peer, workflow_id: str, priority: int) -> None:
    check_options({"priority": priority})
    await peer.system_database.set_priority(workflow_id, priority)
    logger.info("Workflow %s now has priority %s", workflow_id, priority)


LAST_EPOCH_MS = 2**63 - 1
"""The latest time a bigint column stores."""


def delay_until_ms(delay_seconds: float | None, delay_until_epoch_ms: int | None) -> int:
    """The time (epoch ms) a delay given either way ends."""
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
    return int((time.time() + delay_seconds) * 1000)


async def set_delay(peer: Peer, workflow_id: str, until_ms: int) -> None:
    """Make a waiting workflow DELAYED until ``until_ms``, then wake the promoters (here
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
