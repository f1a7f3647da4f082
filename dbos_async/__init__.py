"""dbos_async: durable workflows for asyncio, checkpointed in PostgreSQL."""

from dbos_async.client import DBOSClient
from dbos_async.config import DBOSConfig
from dbos_async.errors import (
    ApplicationOwnershipError,
    ConfigurationError,
    DatabaseAuthenticationError,
    DatabaseUnavailableError,
    DBOSError,
    DeadLetteredError,
    ExecutorIdLostError,
    IdempotencyKeyConflictError,
    InvalidArgumentError,
    InvalidRequestError,
    MigrationError,
    NondeterminismError,
    NonExistentWorkflowError,
    NotAuthorizedError,
    QueryTimeoutError,
    QueueDeduplicatedError,
    QueueNotFoundError,
    RecordedError,
    ScheduleError,
    SerializationError,
    StaleServerError,
    StatementCanceledError,
    StepRetriesExceededError,
    StreamTimeoutError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowIDInUseError,
    WorkflowImportConflictError,
    WorkflowImportError,
    WorkflowNotRegisteredError,
    WorkflowStateError,
)
from dbos_async.eventloop import run
from dbos_async.executor.authentication import (
    Authentication,
    SetAuthentication,
    current_authentication,
)
from dbos_async.executor.context import (
    SetShardKey,
    SetWorkflowAttributes,
    SetWorkflowID,
    SetWorkflowTimeout,
    WorkflowIDReusePolicy,
    current_shard_key,
    current_step_attempt,
    current_step_id,
    current_workflow_id,
)
from dbos_async.executor.control import (
    ApplicationVersion,
    ForkRequest,
    TimeBound,
    WorkflowStepInfo,
)
from dbos_async.executor.dbos import DBOS
from dbos_async.executor.exports import ExportedWorkflow, ImportSummary
from dbos_async.executor.handles import WorkflowHandle, WorkflowInputs, WorkflowStatus
from dbos_async.executor.logs import log_to_stderr
from dbos_async.executor.messaging import SendMessage
from dbos_async.executor.observability import (
    EventChange,
    ExecutorActivity,
    PendingMessage,
    QueueMinute,
    RunningWorkflow,
    StreamValue,
    WaitingWorkflow,
)
from dbos_async.executor.queues import (
    Debouncer,
    DeduplicationPolicy,
    LimiterSpec,
    Queue,
    RateLimit,
    SetEnqueueOptions,
)
from dbos_async.executor.queues.batch import EnqueueOutcome, EnqueueRequest, EnqueueResult
from dbos_async.executor.replay import Divergence, ReplayResult
from dbos_async.executor.schedule_api import ScheduleDefinition
from dbos_async.executor.schedules import WorkflowSchedule
from dbos_async.executor.serialization import Serializer
from dbos_async.executor.steps import RetryOn
from dbos_async.executor.tasks import ExecutorHealth, TaskHealth
from dbos_async.sysdb.health import DatabaseHealth
from dbos_async.sysdb.migrations import holds_sharded_schema
from dbos_async.sysdb.records import VersionBacklog
from dbos_async.sysdb.setup import migrate

__version__ = "0.1.0"

__all__ = [
    "DBOS",
    "ApplicationOwnershipError",
    "ApplicationVersion",
    "Authentication",
    "ConfigurationError",
    "DBOSClient",
    "DBOSConfig",
    "DBOSError",
    "DatabaseAuthenticationError",
    "DatabaseHealth",
    "DatabaseUnavailableError",
    "DeadLetteredError",
    "Debouncer",
    "DeduplicationPolicy",
    "Divergence",
    "EnqueueOutcome",
    "EnqueueRequest",
    "EnqueueResult",
    "EventChange",
    "ExecutorActivity",
    "ExecutorHealth",
    "ExecutorIdLostError",
    "ExportedWorkflow",
    "ForkRequest",
    "IdempotencyKeyConflictError",
    "ImportSummary",
    "InvalidArgumentError",
    "InvalidRequestError",
    "LimiterSpec",
    "MigrationError",
    "NonExistentWorkflowError",
    "NondeterminismError",
    "NotAuthorizedError",
    "PendingMessage",
    "QueryTimeoutError",
    "Queue",
    "QueueDeduplicatedError",
    "QueueMinute",
    "QueueNotFoundError",
    "RateLimit",
    "RecordedError",
    "ReplayResult",
    "RetryOn",
    "RunningWorkflow",
    "ScheduleDefinition",
    "ScheduleError",
    "SendMessage",
    "SerializationError",
    "Serializer",
    "SetAuthentication",
    "SetEnqueueOptions",
    "SetShardKey",
    "SetWorkflowAttributes",
    "SetWorkflowID",
    "SetWorkflowTimeout",
    "StaleServerError",
    "StatementCanceledError",
    "StepRetriesExceededError",
    "StreamTimeoutError",
    "StreamValue",
    "TaskHealth",
    "TimeBound",
    "VersionBacklog",
    "WaitingWorkflow",
    "WorkflowCancelledError",
    "WorkflowConflictError",
    "WorkflowHandle",
    "WorkflowIDInUseError",
    "WorkflowIDReusePolicy",
    "WorkflowImportConflictError",
    "WorkflowImportError",
    "WorkflowInputs",
    "WorkflowNotRegisteredError",
    "WorkflowSchedule",
    "WorkflowStateError",
    "WorkflowStatus",
    "WorkflowStepInfo",
    "current_authentication",
    "current_shard_key",
    "current_step_attempt",
    "current_step_id",
    "current_workflow_id",
    "holds_sharded_schema",
    "log_to_stderr",
    "migrate",
    "run",
]
