"""dbos_async: durable workflows for asyncio, checkpointed in PostgreSQL."""

from dbos_async.client import DBOSClient
from dbos_async.config import DBOSConfig
from dbos_async.errors import (
    ApplicationOwnershipError,
    ConfigurationError,
    DatabaseUnavailableError,
    DBOSError,
    DeadLetteredError,
    MigrationError,
    NondeterminismError,
    NonExistentWorkflowError,
    QueueDeduplicatedError,
    QueueNotFoundError,
    RecordedError,
    SerializationError,
    StepRetriesExceededError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowNotRegisteredError,
)
from dbos_async.executor.context import (
    SetWorkflowAttributes,
    SetWorkflowID,
    SetWorkflowTimeout,
)
from dbos_async.executor.dbos import DBOS
from dbos_async.executor.handles import WorkflowHandle, WorkflowInputs, WorkflowStatus
from dbos_async.executor.operations import ApplicationVersion, WorkflowStepInfo
from dbos_async.executor.queues import Debouncer, Queue, RateLimit, SetEnqueueOptions
from dbos_async.sysdb.shard_keys import bind_shard_keys, shard_key_scope

__version__ = "0.1.0"

__all__ = [
    "DBOS",
    "ApplicationOwnershipError",
    "ApplicationVersion",
    "ConfigurationError",
    "DBOSClient",
    "DBOSConfig",
    "DBOSError",
    "DatabaseUnavailableError",
    "DeadLetteredError",
    "Debouncer",
    "MigrationError",
    "NonExistentWorkflowError",
    "NondeterminismError",
    "Queue",
    "QueueDeduplicatedError",
    "QueueNotFoundError",
    "RateLimit",
    "RecordedError",
    "SerializationError",
    "SetEnqueueOptions",
    "SetWorkflowAttributes",
    "SetWorkflowID",
    "SetWorkflowTimeout",
    "StepRetriesExceededError",
    "WorkflowCancelledError",
    "WorkflowConflictError",
    "WorkflowHandle",
    "WorkflowInputs",
    "WorkflowNotRegisteredError",
    "WorkflowStatus",
    "WorkflowStepInfo",
    "bind_shard_keys",
    "shard_key_scope",
]
