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
    QueryTimeoutError,
    QueueDeduplicatedError,
    QueueNotFoundError,
    RecordedError,
    ScheduleError,
    SerializationError,
    StepRetriesExceededError,
    StreamTimeoutError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowNotRegisteredError,
    WorkflowStateError,
)
from dbos_async.executor.context import (
    SetShardKey,
    SetWorkflowAttributes,
    SetWorkflowID,
    SetWorkflowTimeout,
    current_shard_key,
    current_step_attempt,
    current_step_id,
    current_workflow_id,
)
from dbos_async.executor.control import ApplicationVersion, TimeBound, WorkflowStepInfo
from dbos_async.executor.dbos import DBOS
from dbos_async.executor.handles import WorkflowHandle, WorkflowInputs, WorkflowStatus
from dbos_async.executor.logs import log_to_stderr
from dbos_async.executor.queues import (
    Debouncer,
    DeduplicationPolicy,
    LimiterSpec,
    Queue,
    RateLimit,
    SetEnqueueOptions,
)
from dbos_async.executor.schedule_api import ScheduleDefinition
from dbos_async.executor.schedules import WorkflowSchedule
from dbos_async.executor.steps import RetryOn
from dbos_async.sysdb.migrations import holds_sharded_schema
from dbos_async.sysdb.setup import migrate

__version__ = "0.1.0"

__all__ = [
    "DBOS",
    "ApplicationOwnershipError",
    "ApplicationVersion",
    "ConfigurationError",
    "DBOSClient",
    "DBOSConfig",
    "DBOSError",
    "DatabaseAuthenticationError",
    "DatabaseUnavailableError",
    "DeadLetteredError",
    "Debouncer",
    "DeduplicationPolicy",
    "ExecutorIdLostError",
    "IdempotencyKeyConflictError",
    "InvalidArgumentError",
    "InvalidRequestError",
    "LimiterSpec",
    "MigrationError",
    "NonExistentWorkflowError",
    "NondeterminismError",
    "QueryTimeoutError",
    "Queue",
    "QueueDeduplicatedError",
    "QueueNotFoundError",
    "RateLimit",
    "RecordedError",
    "RetryOn",
    "ScheduleDefinition",
    "ScheduleError",
    "SerializationError",
    "SetEnqueueOptions",
    "SetShardKey",
    "SetWorkflowAttributes",
    "SetWorkflowID",
    "SetWorkflowTimeout",
    "StepRetriesExceededError",
    "StreamTimeoutError",
    "TimeBound",
    "WorkflowCancelledError",
    "WorkflowConflictError",
    "WorkflowHandle",
    "WorkflowInputs",
    "WorkflowNotRegisteredError",
    "WorkflowSchedule",
    "WorkflowStateError",
    "WorkflowStatus",
    "WorkflowStepInfo",
    "current_shard_key",
    "current_step_attempt",
    "current_step_id",
    "current_workflow_id",
    "holds_sharded_schema",
    "log_to_stderr",
    "migrate",
]
