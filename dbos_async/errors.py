"""Exceptions raised by dbos_async.

Every error the library raises derives from :class:`DBOSError`, so callers can catch the
library's failures apart from their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class DBOSError(Exception):
    """Base class of every error raised by dbos_async."""


class ConfigurationError(DBOSError):
    """The configuration is invalid (a malformed URL, a bad schema name, ...)."""


class InvalidArgumentError(DBOSError, ValueError):
    """An argument the system database cannot store or the API does not accept (a workflow ID
    with a NUL character or over the length limit, an infinite or NaN timeout, ...); raised
    before anything is written. Also a :class:`ValueError`."""

    def __init__(self, argument: str, problem: str) -> None:
        super().__init__(f"Invalid {argument}: {problem}")
        self.argument = argument
        self.problem = problem


class DatabaseUnavailableError(DBOSError):
    """The system database could not be reached."""


class DatabaseAuthenticationError(ConfigurationError, DatabaseUnavailableError):
    """The database server refused the login (an unknown user, a wrong password, a user
    not allowed in by its ``pg_hba.conf``): a configuration problem that waiting does not
    fix, so it is also a :class:`ConfigurationError`."""


class StaleServerError(DatabaseUnavailableError):
    """A server was refused: a primary on an older timeline than one this process already
    used on the same system database, as an old primary is when it comes back after a
    failover with data that may be stale. Its connection is closed; the operation is retried
    (on the next server of a multi-host URL). Fencing the old primary off is the job of its
    HA manager."""


class MigrationError(DBOSError):
    """The system database schema is missing, too old, or from an unknown future version."""


class MissingExtraError(DBOSError, ModuleNotFoundError):
    """A part of dbos_async was imported without the extra it needs installed. Also a
    :class:`ModuleNotFoundError`."""

    def __init__(self, module: str, extra: str, missing: str) -> None:
        super().__init__(
            f"{module} needs the {extra!r} extra ({missing} is not installed): "
            f"pip install 'dbos_async[{extra}]'")
        self.name = missing
        self.extra = extra


class SerializationError(DBOSError):
    """A value could not be serialized for, or read back from, the system database."""


class NonExistentWorkflowError(DBOSError):
    """No workflow with this ID exists."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"Workflow {workflow_id!r} does not exist")
        self.workflow_id = workflow_id


class WorkflowStateError(DBOSError):
    """The workflow's status does not allow the operation (a priority or delay change of a
    workflow that has already started, for instance); nothing was changed."""

    def __init__(self, workflow_id: str, status: str, operation: str, allowed: str) -> None:
        super().__init__(f"Cannot {operation} workflow {workflow_id!r}: it is {status}, and "
                         f"only {allowed} workflows allow it")
        self.workflow_id = workflow_id
        self.status = status


def workflow_id_taken(workflow_id: str, used_by: str, name: str) -> DBOSError:
    """The error of a start whose workflow ID is another workflow function's."""
    return DBOSError(f"Workflow ID {workflow_id!r} is already used by workflow {used_by!r}, "
                     f"not {name!r}")


class WorkflowIDInUseError(DBOSError):
    """A start under ``workflow_id_reuse_policy="reject"`` found its workflow ID in use
    (as the ``dbos`` package's ``DBOSWorkflowIDInUseError``)."""

    def __init__(self, workflow_id: str, workflow_status: str, workflow_name: str) -> None:
        super().__init__(f"Workflow ID {workflow_id!r} is already in use by workflow "
                         f"{workflow_name!r} with status {workflow_status}")
        self.workflow_id = workflow_id
        self.workflow_status = workflow_status
        self.workflow_name = workflow_name


class WorkflowNotRegisteredError(DBOSError):
    """A workflow's function is not registered with this executor."""

    def __init__(self, workflow_id: str, name: str, queue_name: str | None = None) -> None:
        where = f" (enqueued on queue {queue_name!r}; it stays ENQUEUED)" if queue_name else ""
        super().__init__(
            f"Workflow {workflow_id!r} runs function {name!r}, which is not registered "
            f"with this executor{where}; decorate it with @dbos.workflow() before entering DBOS"
        )
        self.workflow_id = workflow_id
        self.name = name
        self.queue_name = queue_name


class NondeterminismError(DBOSError):
    """A replayed workflow called a different step than the one recorded at this position."""

    def __init__(self, workflow_id: str, step_id: int, recorded: str, called: str) -> None:
        super().__init__(
            f"Workflow {workflow_id!r} is not deterministic: step {step_id} was recorded as "
            f"{recorded!r} but this execution called {called!r}"
        )
        self.workflow_id = workflow_id
        self.step_id = step_id
        self.recorded = recorded
        self.called = called


class WorkflowConflictError(DBOSError):
    """This execution no longer owns the workflow: another execution took it over."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"Workflow {workflow_id!r} is owned by another execution")
        self.workflow_id = workflow_id


class WorkflowCancelledError(DBOSError):
    """The workflow was cancelled (by an operator or by its deadline)."""

    def __init__(self, workflow_id: str, reason: str = "cancelled") -> None:
        super().__init__(f"Workflow {workflow_id!r} was {reason}")
        self.workflow_id = workflow_id


class ExecutorIdLostError(DBOSError):
    """Another process holds this executor's ID: the connection holding it was lost, and
    before it was back another process claimed the ID. This executor starts, claims and
    recovers nothing more; restart it to claim a free ID."""

    def __init__(self, executor_id: str) -> None:
        super().__init__(
            f"Executor ID {executor_id!r} was taken by another process while this "
            "executor's connection holding it was down; this executor no longer starts, "
            "claims or recovers workflows: restart it to claim a free executor ID"
        )
        self.executor_id = executor_id


class DeadLetteredError(DBOSError):
    """The workflow exceeded its recovery attempts and was moved to the dead-letter state."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(
            f"Workflow {workflow_id!r} exceeded its maximum recovery attempts"
        )
        self.workflow_id = workflow_id


class StepRetriesExceededError(DBOSError):
    """A step failed on every attempt its retry policy allowed."""

    def __init__(self, step_name: str, attempts: int, errors: list[BaseException]) -> None:
        last = errors[-1] if errors else None
        super().__init__(
            f"Step {step_name!r} failed after {attempts} attempts; last error: "
            f"{type(last).__name__}: {last}"
        )
        self.step_name = step_name
        self.attempts = attempts
        self.errors = errors


class RecordedError(DBOSError):
    """An error as the system database records it: a workflow's or step's failure.

    Workflows and steps record their exceptions as portable JSON (name, message, code, data),
    and every caller gets them in this form, on the first run (with the original exception
    as ``__cause__``) as on a replay or in another process, so the two read the same:
    ``str()`` is the original message. Where the recorded type can be found (a builtin
    exception, one of dbos_async's errors, or a module-level class of a module this process
    has imported) the raised object is also an instance of it, so ``except ValueError`` or
    ``except MyError`` catches it either way.
    """

    def __init__(
        self, name: str, message: str, code: int | str | None = None, data: Any = None
    ) -> None:
        # Exception's own initializer, not the next class in the MRO: a RecordedError that is
        # also a dbos_async error must not run that error's initializer.
        Exception.__init__(self, message)
        self.name = name
        self.message = message
        self.code = code
        self.data = data

    def __str__(self) -> str:
        return self.message


class QueueDeduplicatedError(DBOSError):
    """An enqueue's deduplication ID is held by an active workflow on that queue."""

    def __init__(self, queue_name: str, deduplication_id: str,
                 workflow_id: str | None = None) -> None:
        holder = f" (held by workflow {workflow_id!r})" if workflow_id else ""
        super().__init__(
            f"Queue {queue_name!r} already has an active workflow with deduplication ID "
            f"{deduplication_id!r}{holder}"
        )
        self.queue_name = queue_name
        self.deduplication_id = deduplication_id
        self.workflow_id = workflow_id


class QueueNotFoundError(DBOSError):
    """No queue with this name is declared in code or stored in the ``queues`` table."""

    def __init__(self, queue_name: str) -> None:
        super().__init__(
            f"Queue {queue_name!r} is not declared with this DBOS instance "
            "(dbos.queue(...) / dbos.register_queue(...)) nor stored in the queues table"
        )
        self.queue_name = queue_name


class InvalidRequestError(DBOSError):
    """An HTTP request the web integrations refuse before doing anything: a malformed
    ``Idempotency-Key`` header, an unknown or malformed query parameter."""


class IdempotencyKeyConflictError(DBOSError):
    """An idempotency key sent again with a different request (method, path, query or
    body) than the one whose workflow it names."""

    def __init__(self, key: str, header: str = "Idempotency-Key") -> None:
        super().__init__(
            f"{header} {key!r} was already used for a different request (another method, "
            "path, query or body); reuse a key only to retry the same request"
        )
        self.key = key
        self.header = header


class ApplicationOwnershipError(DBOSError):
    """A queue or application version name is already owned by another application sharing
    the system database (names are unique across applications)."""


class ScheduleError(DBOSError):
    """A schedule definition was rejected (cron expression, time zone, workflow), or the
    named schedule does not exist or exists already; nothing was stored."""


class NotAuthorizedError(DBOSError):
    """A workflow or step declared with ``required_roles`` was called by an identity
    (``SetAuthentication``) holding none of them; nothing was started or run."""

    def __init__(self, kind: str, function_name: str, required_roles: Sequence[str],
                 user: str | None, roles: Sequence[str]) -> None:
        who = (f"user {user!r} with roles {list(roles)!r}" if user is not None or roles
               else "a caller without authentication (set it with SetAuthentication)")
        super().__init__(
            f"{kind.capitalize()} {function_name!r} requires one of the roles "
            f"{list(required_roles)!r}, but was called by {who}"
        )
        self.function_name = function_name
        self.user = user
class StatementCanceledError(DBOSError):
    """The database server canceled a statement of the system database: a
    ``statement_timeout`` or ``lock_timeout`` the system database URL sets, or an
    administrator's ``pg_cancel_backend``. (The settings of the role or database are not
    used: see docs/operations/configuration.md.)"""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(
            f"The system database canceled a statement while {what}: {reason} (a "
            "statement_timeout or lock_timeout set in the system database URL, or "
            "pg_cancel_backend)")
        self.what = what
        self.reason = reason

    @property
    def timed_out(self) -> bool:
        """Whether ``statement_timeout`` stopped it."""
        return "statement timeout" in self.reason


class QueryTimeoutError(DBOSError):
    """An observability read (a workflow or step listing, a queue count, an export) ran
    longer than the ``observability_query_timeout`` setting and was stopped."""

    def __init__(self, what: str, timeout_seconds: float) -> None:
        super().__init__(
            f"{what[:1].upper()}{what[1:]} ran longer than observability_query_timeout "
            f"({timeout_seconds:g} s) and was stopped; narrow the filters, read a smaller page "
            "(limit/offset), or raise observability_query_timeout (0 turns the cap off)"
        )
        self.what = what
        self.timeout_seconds = timeout_seconds


class StreamTimeoutError(DBOSError):
    """``read_stream(..., timeout=...)`` waited that long for the stream's next value, or
    ``read_stream_offset`` found the stream ended before its offset (``ended_before``)."""

    def __init__(self, workflow_id: str, key: str, timeout_seconds: float, *,
                 ended_before: int | None = None) -> None:
        if ended_before is None:
            super().__init__(f"No value of stream {key!r} of workflow {workflow_id!r} "
                             f"arrived within {timeout_seconds:g} s")
        else:
            super().__init__(f"Stream {key!r} of workflow {workflow_id!r} ended before "
                             f"offset {ended_before}")
        self.workflow_id = workflow_id
        self.key = key
        self.timeout_seconds = timeout_seconds
        self.ended_before = ended_before


class WorkflowImportError(DBOSError):
    """Exported workflow lines an import refused before writing anything: malformed JSON,
    an unknown format version, a missing or unknown column, a value of the wrong type, or a
    missing shard key; the message names the line (or the workflow) and the problem."""


class WorkflowImportConflictError(WorkflowImportError):
    """An imported workflow's ID is taken in the target database by a workflow whose rows
    differ (or a deduplication ID it carries is held there); the batch was not written."""

    def __init__(self, workflow_id: str, detail: str) -> None:
        super().__init__(f"Cannot import workflow {workflow_id!r}: {detail}; the batch "
                         "holding it was not written")
        self.workflow_id = workflow_id


class TransactionError(DBOSError):
    """The database refused the SQL of a transaction (``@dbos.transaction()``): its
    ``sqlstate`` (e.g. ``23505`` for a unique violation, ``40001`` for a serialization
    failure that outlasted the retries) and the server's message."""

    def __init__(self, transaction: str, sqlstate: str, message: str) -> None:
        super().__init__(f"Transaction {transaction!r} failed: SQLSTATE {sqlstate}: {message}")
        self.transaction = transaction
        self.sqlstate = sqlstate
        self.server_message = message
