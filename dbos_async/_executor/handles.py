"""Handles on workflows: their ID, status and result."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from dbos_async._executor.authentication import Authentication
from dbos_async._executor.context import WorkflowContext, current_workflow
from dbos_async._executor.recorded_errors import deserialize_error
from dbos_async._executor.serialization import Formats, Signature, to_json
from dbos_async._executor.steps import record_read, recorded_read
from dbos_async._sysdb.database import Outcome
from dbos_async._sysdb.records import StatusRecord
from dbos_async._sysdb.shard_keys import bind_shard_keys
from dbos_async._sysdb.statements import (
    CANCELLED,
    ERROR,
    MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    SUCCESS,
    Payload,
)
from dbos_async.errors import (
    DBOSError,
    DeadLetteredError,
    NonExistentWorkflowError,
    SerializationError,
    WorkflowCancelledError,
)

if TYPE_CHECKING:
    from dbos_async._executor.peer import Peer

R = TypeVar("R", covariant=True)


@dataclass(frozen=True)
class WorkflowStatus:
    """A workflow's row in the system database."""

    workflow_id: str
    status: str
    name: str
    class_name: str | None
    config_name: str | None
    queue_name: str | None
    executor_id: str | None
    application_version: str | None
    created_at: int
    updated_at: int
    recovery_attempts: int
    timeout_ms: int | None
    deadline_epoch_ms: int | None
    parent_workflow_id: str | None
    completed_at: int | None
    authenticated_user: str | None = None
    assumed_role: str | None = None
    authenticated_roles: list[str] | None = None
    forked_from: str | None = None
    started_at_epoch_ms: int | None = None
    deduplication_id: str | None = None
    priority: int = 0
    queue_partition_key: str | None = None
    serialization: str | None = None
    # The owning application (None: unclaimed) and the custom attributes set at start.
    application_name: str | None = None
    attributes: dict[str, Any] | None = None
    # Whether a fork was made of it, and the schedule that started it (if one did).
    was_forked_from: bool = False
    schedule_name: str | None = None
    # Its shard key and its parent's (sharded databases only).
    shard_key: str | None = None
    parent_shard_key: str | None = None
    # Loaded only on request (list_workflows(load_input=..., load_output=...)).
    input: WorkflowInputs | None = None
    output: Any = None
    error: BaseException | None = None

    @property
    def started_at(self) -> int | None:
        """When it began to run (epoch milliseconds): when a claim took it from its queue,
        or its creation for one started directly; None while it waits on a queue."""
        if self.started_at_epoch_ms is not None:
            return self.started_at_epoch_ms
        return self.created_at if self.queue_name is None else None

    @classmethod
    def _from_record(cls, record: StatusRecord) -> WorkflowStatus:
        """The status of a row the system database read (payloads left unloaded)."""
        fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(cls)
                  if f.name not in _LOADED_ON_REQUEST}
        fields["attributes"] = _attributes(record.attributes)
        identity = Authentication.from_columns(record.authenticated_user,
                                               record.authenticated_roles, record.assumed_role)
        fields["authenticated_user"] = identity.user
        fields["assumed_role"] = identity.assumed_role
        fields["authenticated_roles"] = list(identity.roles) if identity.roles else None
        return cls(**fields)

    def checkpoint_json(self) -> str:
        """The status as a workflow's status read records it (payloads left out)."""
        return to_json({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                        if f.name not in _LOADED_ON_REQUEST}, "a workflow status")

    @classmethod
    def from_checkpoint(cls, value: Any) -> WorkflowStatus | None:
        """The status a recorded status read holds (None: there was no such workflow)."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise SerializationError(f"A recorded {GET_STATUS} holds {value!r}, not a status")
        known = {f.name for f in dataclasses.fields(cls)} - _LOADED_ON_REQUEST
        return cls(**{k: v for k, v in value.items() if k in known})


_LOADED_ON_REQUEST = frozenset({"input", "output", "error"})


def _attributes(value: Any) -> dict[str, Any] | None:
    # jsonb comes back from asyncpg as text unless a codec decodes it.
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class WorkflowInputs:
    """A workflow's recorded arguments, deserialized."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def outcome_value(workflow_id: str, outcome: Outcome, signature: Signature | None,
                  formats: Formats) -> Any:
    """The value a terminal outcome returns, or the exception it raises."""
    if outcome.status == SUCCESS:
        if signature is None:
            return formats.decode(outcome.output, outcome.serialization,
                                  f"the result of {workflow_id}")
        return signature.deserialize_result(outcome.output, outcome.serialization, formats)
    if outcome.status == ERROR:
        raise deserialize_error(outcome.error, outcome.serialization, formats)
    if outcome.status == CANCELLED:
        raise WorkflowCancelledError(workflow_id)
    if outcome.status == MAX_RECOVERY_ATTEMPTS_EXCEEDED:
        raise DeadLetteredError(workflow_id)
    raise DBOSError(f"Workflow {workflow_id!r} ended in unknown status {outcome.status!r}")


GET_STATUS = "DBOS.getStatus"
"""The checkpoint of a workflow's status read (as DBOS Transact and the ``dbos`` package
name it)."""


async def read_status(peer: Peer, workflow_id: str, ctx: WorkflowContext | None = None,
                      step_id: int | None = None) -> WorkflowStatus | None:
    """The status of ``workflow_id`` (None if there is none): a plain read, or, from a
    workflow's body (``ctx``, at ``step_id``), a checkpoint read once and replayed."""
    if ctx is not None and step_id is not None:
        done, value = recorded_read(ctx, step_id, GET_STATUS)
        if done:
            return WorkflowStatus.from_checkpoint(value)
    row = await peer.system_database.get_workflow(workflow_id)
    status = WorkflowStatus._from_record(row) if row is not None else None
    if ctx is None or step_id is None:
        return status
    with ctx.routed():
        value = await record_read(ctx, step_id, GET_STATUS,
                                  Payload(status.checkpoint_json() if status is not None
                                          else "null"))
    return WorkflowStatus.from_checkpoint(value)


def workflow_handle(peer: Peer, workflow_id: str, *, signature: Signature | None = None,
                    workflow_name: str | None = None,
                    shard_key: str | None = None) -> WorkflowHandle[Any]:
    """The handle on ``workflow_id`` (under ``shard_key``, on a sharded database) every
    start, lookup and operation returns: attached to its execution if it runs in this
    process, its result typed by ``signature`` (or by the signature registered for
    ``workflow_name``; plain JSON without either)."""
    if signature is None and workflow_name is not None:
        signature = peer.signature_of(workflow_name)
    return WorkflowHandle(peer, workflow_id, peer.running_result(workflow_id, shard_key),
                          signature, shard_key)


class WorkflowHandle(Generic[R]):
    """A workflow started or retrieved by this executor (see :func:`workflow_handle`).

    A workflow running in this process is awaited directly; any other is read from the
    system database until it finishes.
    """

    def __init__(
        self,
        peer: Peer,
        workflow_id: str,
        result: asyncio.Future[Any] | None = None,
        signature: Signature | None = None,
        shard_key: str | None = None,
    ) -> None:
        self._peer = peer
        self._result = result
        self._signature = signature
        self.workflow_id = workflow_id
        # Remembered, so its result and status need no key from the caller.
        self.shard_key = shard_key

    def __repr__(self) -> str:
        return f"WorkflowHandle({self.workflow_id!r})"

    async def get_result(self) -> R:
        """Wait for the workflow to finish; return its result or raise its error."""
        if self._result is not None:
            # Shielded: a caller that gives up waiting must not cancel the workflow.
            value: R = await asyncio.shield(self._result)
            return value
        running = self._peer.running_result(self.workflow_id, self.shard_key)
        if running is not None:
            value = await asyncio.shield(running)
            return value
        with bind_shard_keys({self.workflow_id: self.shard_key}):
            outcome = await self._peer.system_database.wait_outcome(
                self.workflow_id, self._peer.config.result_poll_interval
            )
        signature = self._signature or self._peer.signature_of(outcome.name)
        result: R = outcome_value(self.workflow_id, outcome, signature, self._peer.formats)
        return result

    def get_status(self) -> Coroutine[Any, Any, WorkflowStatus]:
        """The workflow's status; in a workflow of this executor, a checkpoint (its position
        fixed by this call)."""
        ctx = current_workflow()
        if ctx is not None and ctx.runtime is not self._peer:
            ctx = None  # another executor's or a client's handle: a plain read
        return self._status(ctx, ctx.allocate_step_id() if ctx is not None else None)

    async def _status(self, ctx: WorkflowContext | None,
                      step_id: int | None) -> WorkflowStatus:
        with bind_shard_keys({self.workflow_id: self.shard_key}):
            status = await read_status(self._peer, self.workflow_id, ctx, step_id)
        if status is None:
            raise NonExistentWorkflowError(self.workflow_id)
        return status
