"""The SQL of the system database, one named builder per statement.

Each family of statements lives in its own module, all built on the shard-key seam of
:class:`~dbos_async._sysdb.statements.base.StatementBase`; :class:`Statements` joins them for
one schema.
"""

from dbos_async._sysdb.statements.base import (
    ACTIVE_STATUSES,
    CANCELLED,
    DELAYED,
    ENQUEUED,
    ERROR,
    MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    PENDING,
    PORTABLE_JSON,
    SUCCESS,
    Checkpoint,
    FinalOutcome,
    NewWorkflow,
    Params,
    ParentStep,
    Payload,
    Query,
    StatementBase,
    StatementParts,
    WorkflowAddress,
    qualify,
)
from dbos_async._sysdb.statements.executor_ids import ExecutorIdStatements
from dbos_async._sysdb.statements.management.admin import APPLICATION_TABLES, AdminStatements
from dbos_async._sysdb.statements.management.control import (
    BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS,
    PAYLOAD_TABLES,
    STREAM_CLOSED_SERIALIZED,
    TERMINAL_STATUSES,
    WORKFLOW_STATUSES,
    ControlStatements,
    RetentionCutoff,
    WorkflowFilter,
    advisory_lock_key,
    job_lock_key,
)
from dbos_async._sysdb.statements.messaging import (
    SEND_BULK,
    Consume,
    MessagingStatements,
    OutgoingMessage,
)
from dbos_async._sysdb.statements.observability import ObservabilityStatements
from dbos_async._sysdb.statements.permissions import PermissionStatements
from dbos_async._sysdb.statements.queues import (
    CLAIMED_COLUMNS,
    DEDUP_INDEX,
    INTERNAL_QUEUE_NAME,
    QUEUE_COLUMNS,
    QueueRecord,
    QueueStatements,
    is_dedup_conflict,
)
from dbos_async._sysdb.statements.recovery import RecoveryStatements
from dbos_async._sysdb.statements.routed import RoutedStatements
from dbos_async._sysdb.statements.schedules import ScheduleStatements
from dbos_async._sysdb.statements.transfer import EXPORT_COLUMNS, ExportStatements
from dbos_async._sysdb.statements.versions import VersionRecord, VersionStatements
from dbos_async._sysdb.statements.workflows import WorkflowStatements


class Statements(RoutedStatements, WorkflowStatements, RecoveryStatements,
                 MessagingStatements, QueueStatements, VersionStatements, ExportStatements,
                 ControlStatements, ExecutorIdStatements, ScheduleStatements,
                 PermissionStatements, AdminStatements, ObservabilityStatements):
    """Every statement of the system database, for one schema."""


__all__ = [
    "ACTIVE_STATUSES",
    "APPLICATION_TABLES",
    "BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS",
    "CANCELLED",
    "CLAIMED_COLUMNS",
    "DEDUP_INDEX",
    "DELAYED",
    "ENQUEUED",
    "ERROR",
    "EXPORT_COLUMNS",
    "INTERNAL_QUEUE_NAME",
    "MAX_RECOVERY_ATTEMPTS_EXCEEDED",
    "PAYLOAD_TABLES",
    "PENDING",
    "PORTABLE_JSON",
    "QUEUE_COLUMNS",
    "SEND_BULK",
    "STREAM_CLOSED_SERIALIZED",
    "SUCCESS",
    "TERMINAL_STATUSES",
    "WORKFLOW_STATUSES",
    "Checkpoint",
    "Consume",
    "FinalOutcome",
    "NewWorkflow",
    "OutgoingMessage",
    "Params",
    "ParentStep",
    "Payload",
    "Query",
    "QueueRecord",
    "RetentionCutoff",
    "StatementBase",
    "StatementParts",
    "Statements",
    "VersionRecord",
    "WorkflowAddress",
    "WorkflowFilter",
    "advisory_lock_key",
    "is_dedup_conflict",
    "job_lock_key",
    "qualify",
]
