"""dbos_async: durable workflows for asyncio, checkpointed in PostgreSQL."""

from dbos_async.config import DBOSConfig
from dbos_async.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DBOSError,
    DeadLetteredError,
    MigrationError,
    NondeterminismError,
    NonExistentWorkflowError,
    RecordedError,
    SerializationError,
    StepRetriesExceededError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowNotRegisteredError,
)
from dbos_async.executor.context import SetWorkflowID, SetWorkflowTimeout
from dbos_async.executor.dbos import DBOS
from dbos_async.executor.handles import WorkflowHandle, WorkflowStatus
from dbos_async.sysdb.shard_keys import bind_shard_keys, shard_key_scope

__version__ = "0.1.0"

__all__ = [
    "DBOS",
    "ConfigurationError",
    "DBOSConfig",
    "DBOSError",
    "DatabaseUnavailableError",
    "DeadLetteredError",
    "MigrationError",
    "NonExistentWorkflowError",
    "NondeterminismError",
    "RecordedError",
    "SerializationError",
    "SetWorkflowID",
    "SetWorkflowTimeout",
    "StepRetriesExceededError",
    "WorkflowCancelledError",
    "WorkflowConflictError",
    "WorkflowHandle",
    "WorkflowNotRegisteredError",
    "WorkflowStatus",
    "bind_shard_keys",
    "shard_key_scope",
]
