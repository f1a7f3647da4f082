"""The plain records the system database returns: each maps its statements' columns to
field names once, so no caller reads a column name.

Like the rest of this layer they hold strings; the executor deserializes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from dbos_async._sysdb.statements import ACTIVE_STATUSES
from dbos_async.errors import WorkflowIDInUseError


@dataclass(frozen=True)
class StepRecord:
    """A recorded step: its name and either its output or its error, as stored (its
    fields are the columns the checkpoint reads select)."""

    function_id: int
    function_name: str
    output: str | None
    error: str | None
    child_workflow_id: str | None
    serialization: str | None
    # The shard key of the child a step started (sharded databases record it).
    child_shard_key: str | None = None


@dataclass(kw_only=True)
class WorkflowRow:
    """The columns of workflow_status that every statement returning a workflow to run or
    report has: the start and claim statements (start, queues, recovery) and the status
    reads. Not frozen: a claim builds one per workflow it starts, and a frozen dataclass
    takes twice as long to build; nothing changes one once read."""

    workflow_id: str
    status: str
    name: str
    class_name: str | None
    config_name: str | None
    serialization: str | None
    deadline_epoch_ms: int | None
    recovery_attempts: int
    # The owner token (None where the statement does not return it: the status reads).
    owner_xid: str | None = None
    inputs: str | None = None
    # Whether the workflow has recorded steps to load (unknown, so assumed, unless the
    # statement says).
    has_checkpoints: bool = True
    # The workflow's shard key, read back from a sharded database.
    shard_key: str | None = None
    # Its custom attributes, the jsonb as text (where the statement returns them).
    attributes: str | None = None
    # Who it runs for, as recorded (authenticated_roles: a JSON list as text).
    authenticated_user: str | None = None
    assumed_role: str | None = None
    authenticated_roles: str | None = None
    # How long a claimed workflow waited on its queue, its start minus its creation (ms;
    # the claim statements return it).
    queued_ms: int | None = None


@dataclass(kw_only=True)
class StatusRecord(WorkflowRow):
    """A workflow's whole status row, as the status reads (``status_select``) return it,
    under the field names of the executor's WorkflowStatus. ``attributes`` is the jsonb as
    text; ``inputs``, ``output`` and ``error`` are set only when the read loaded them."""

    queue_name: str | None
    executor_id: str | None
    application_version: str | None
    application_id: str | None
    created_at: int
    updated_at: int
    timeout_ms: int | None
    parent_workflow_id: str | None
    completed_at: int | None
    forked_from: str | None
    started_at_epoch_ms: int | None
    deduplication_id: str | None
    priority: int
    queue_partition_key: str | None
    application_name: str | None
    was_forked_from: bool = False
    schedule_name: str | None = None
    output: str | None = None
    error: str | None = None
    parent_shard_key: str | None = None


@dataclass(frozen=True)
class StartResult:
    """What starting a workflow found: the row, and whether this call created it."""

    row: WorkflowRow
    created: bool

    def refuse_reuse(self) -> None:
        """The reuse policy "reject": a row another start created refuses this one
        (raises :class:`WorkflowIDInUseError`)."""
        if not self.created:
            raise WorkflowIDInUseError(self.row.workflow_id, self.row.status, self.row.name)


@dataclass(frozen=True)
class BatchStart:
    """What a batch insert made of one of its rows: ``created`` (this batch wrote it, on
    this attempt or a retried one); else the workflow already under its ID
    (``existing_name``), or the active holder of its deduplication ID (``holder``: its ID
    and name)."""

    created: bool
    existing_name: str | None = None
    holder: tuple[str, str] | None = None


@dataclass(frozen=True)
class VersionBacklog:
    """The PENDING and ENQUEUED workflows of one application version: work only an
    executor of that version runs (or an operator moves to another)."""

    application_version: str
    pending: int
    enqueued: int

    def __str__(self) -> str:
        return (f"{self.application_version} ({self.pending} PENDING, "
                f"{self.enqueued} ENQUEUED)")


@dataclass(frozen=True)
class Outcome:
    """A workflow's recorded state; output and error are set once it is terminal."""

    name: str
    status: str
    output: str | None
    error: str | None
    serialization: str | None

    @property
    def terminal(self) -> bool:
        return self.status not in ACTIVE_STATUSES


R = TypeVar("R", bound=WorkflowRow)


def _named(value: str | None) -> str | None:
    """An optional name column: DBOS's TypeScript client writes "" for none (an enqueued
    row's executor_id and application_id; class and instance names in older versions)."""
    return value or None


def _from_row(cls: type[R], row: asyncpg.Record | Mapping[str, Any], **columns: Any) -> R:
    return cls(
        workflow_id=row["workflow_uuid"],
        status=row["status"],
        name=row["name"],
        class_name=_named(row["class_name"]),
        config_name=_named(row["config_name"]),
        serialization=row["serialization"],
        deadline_epoch_ms=row["workflow_deadline_epoch_ms"],
        recovery_attempts=row["recovery_attempts"] or 0,
        owner_xid=row.get("owner_xid"),
        inputs=row.get("inputs"),
        has_checkpoints=row.get("has_checkpoints", True),
        shard_key=row.get("shard_key"),
        attributes=row.get("attributes"),
        authenticated_user=row.get("authenticated_user"),
        assumed_role=row.get("assumed_role"),
        authenticated_roles=row.get("authenticated_roles"),
        queued_ms=row.get("queued_ms"),
        **columns,
    )


def workflow_row(row: asyncpg.Record | Mapping[str, Any]) -> WorkflowRow:
    """The workflow a start or claim statement returned."""
    return _from_row(WorkflowRow, row)


def status_record(row: asyncpg.Record) -> StatusRecord:
    """A row of a status read (``get_workflow``, ``list_workflows``)."""
    return _from_row(
        StatusRecord, row,
        queue_name=row["queue_name"],
        executor_id=_named(row["executor_id"]),
        application_version=row["application_version"],
        application_id=_named(row["application_id"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        timeout_ms=row["workflow_timeout_ms"],
        parent_workflow_id=row["parent_workflow_id"],
        completed_at=row["completed_at"],
        forked_from=row["forked_from"],
        started_at_epoch_ms=row["started_at_epoch_ms"],
        deduplication_id=row["deduplication_id"],
        priority=row["priority"] or 0,
        queue_partition_key=row["queue_partition_key"],
        application_name=row["application_name"],
        was_forked_from=bool(row.get("was_forked_from")),
        schedule_name=row.get("schedule_name"),
        output=row.get("output"),
        error=row.get("error"),
        parent_shard_key=row.get("parent_shard_key"),
    )
