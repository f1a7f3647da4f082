"""dbos_async: durable workflows for asyncio, checkpointed in PostgreSQL.

The public names load on first use (PEP 562), so ``import dbos_async`` is quick and
importing one name loads only what it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dbos_async._eventloop import run
    from dbos_async._executor.authentication import (
        Authentication,
        SetAuthentication,
        current_authentication,
    )
    from dbos_async._executor.context import (
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
    from dbos_async._executor.dbos import DBOS
    from dbos_async._executor.handles import WorkflowHandle, WorkflowInputs, WorkflowStatus
    from dbos_async._executor.management.control import (
        ApplicationVersion,
        ForkRequest,
        StartPoint,
        StepNamed,
        TimeBound,
        WorkflowStepInfo,
    )
    from dbos_async._executor.messaging import SendMessage
    from dbos_async._executor.observability import (
        EventChange,
        ExecutorActivity,
        MetricData,
        PendingMessage,
        QueueDepth,
        QueueMetrics,
        QueueMinute,
        RunningWorkflow,
        StepAggregate,
        StreamValue,
        WaitingWorkflow,
        WorkflowActivity,
        WorkflowAggregate,
    )
    from dbos_async._executor.queues import (
        Debouncer,
        DeduplicationPolicy,
        LimiterSpec,
        Queue,
        RateLimit,
        SetEnqueueOptions,
    )
    from dbos_async._executor.queues.batch import EnqueueOutcome, EnqueueRequest, EnqueueResult
    from dbos_async._executor.replay import Divergence, ReplayResult
    from dbos_async._executor.schedules.definition import WorkflowSchedule
    from dbos_async._executor.schedules.operator import ScheduleDefinition
    from dbos_async._executor.serialization import Serializer, WorkflowSerializationFormat
    from dbos_async._executor.steps import RetryOn, StepOptions
    from dbos_async._executor.tasks import ExecutorHealth, TaskHealth
    from dbos_async._executor.telemetry.logs import log_to_stderr
    from dbos_async._executor.transactions import transaction_connection
    from dbos_async._executor.transfer import ExportedWorkflow, ImportSummary
    from dbos_async._sysdb.health import DatabaseHealth
    from dbos_async._sysdb.migrations import holds_sharded_schema
    from dbos_async._sysdb.records import VersionBacklog
    from dbos_async._sysdb.setup import migrate
    from dbos_async.client import DBOSClient, DebouncerClient
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
        MissingExtraError,
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
        TransactionError,
        WorkflowCancelledError,
        WorkflowConflictError,
        WorkflowIDInUseError,
        WorkflowImportConflictError,
        WorkflowImportError,
        WorkflowNotRegisteredError,
        WorkflowStateError,
    )
    from dbos_async.statuses import WorkflowStatusString

# Each public name and the module defining it.
_EXPORTS: dict[str, str] = {
    "DBOSClient": "dbos_async.client",
    "DebouncerClient": "dbos_async.client",
    "DBOSConfig": "dbos_async.config",
    "ApplicationOwnershipError": "dbos_async.errors",
    "ConfigurationError": "dbos_async.errors",
    "DatabaseAuthenticationError": "dbos_async.errors",
    "DatabaseUnavailableError": "dbos_async.errors",
    "DBOSError": "dbos_async.errors",
    "DeadLetteredError": "dbos_async.errors",
    "ExecutorIdLostError": "dbos_async.errors",
    "IdempotencyKeyConflictError": "dbos_async.errors",
    "InvalidArgumentError": "dbos_async.errors",
    "InvalidRequestError": "dbos_async.errors",
    "MigrationError": "dbos_async.errors",
    "MissingExtraError": "dbos_async.errors",
    "NondeterminismError": "dbos_async.errors",
    "NonExistentWorkflowError": "dbos_async.errors",
    "NotAuthorizedError": "dbos_async.errors",
    "QueryTimeoutError": "dbos_async.errors",
    "QueueDeduplicatedError": "dbos_async.errors",
    "QueueNotFoundError": "dbos_async.errors",
    "RecordedError": "dbos_async.errors",
    "ScheduleError": "dbos_async.errors",
    "SerializationError": "dbos_async.errors",
    "StaleServerError": "dbos_async.errors",
    "StatementCanceledError": "dbos_async.errors",
    "StepRetriesExceededError": "dbos_async.errors",
    "StreamTimeoutError": "dbos_async.errors",
    "TransactionError": "dbos_async.errors",
    "WorkflowCancelledError": "dbos_async.errors",
    "WorkflowConflictError": "dbos_async.errors",
    "WorkflowIDInUseError": "dbos_async.errors",
    "WorkflowImportConflictError": "dbos_async.errors",
    "WorkflowImportError": "dbos_async.errors",
    "WorkflowNotRegisteredError": "dbos_async.errors",
    "WorkflowStateError": "dbos_async.errors",
    "run": "dbos_async._eventloop",
    "Authentication": "dbos_async._executor.authentication",
    "SetAuthentication": "dbos_async._executor.authentication",
    "current_authentication": "dbos_async._executor.authentication",
    "SetShardKey": "dbos_async._executor.context",
    "SetWorkflowAttributes": "dbos_async._executor.context",
    "SetWorkflowID": "dbos_async._executor.context",
    "SetWorkflowTimeout": "dbos_async._executor.context",
    "WorkflowIDReusePolicy": "dbos_async._executor.context",
    "current_shard_key": "dbos_async._executor.context",
    "current_step_attempt": "dbos_async._executor.context",
    "current_step_id": "dbos_async._executor.context",
    "current_workflow_id": "dbos_async._executor.context",
    "ApplicationVersion": "dbos_async._executor.management.control",
    "ForkRequest": "dbos_async._executor.management.control",
    "StartPoint": "dbos_async._executor.management.control",
    "StepNamed": "dbos_async._executor.management.control",
    "TimeBound": "dbos_async._executor.management.control",
    "WorkflowStepInfo": "dbos_async._executor.management.control",
    "DBOS": "dbos_async._executor.dbos",
    "ExportedWorkflow": "dbos_async._executor.transfer",
    "ImportSummary": "dbos_async._executor.transfer",
    "WorkflowHandle": "dbos_async._executor.handles",
    "WorkflowInputs": "dbos_async._executor.handles",
    "WorkflowStatus": "dbos_async._executor.handles",
    "log_to_stderr": "dbos_async._executor.telemetry.logs",
    "SendMessage": "dbos_async._executor.messaging",
    "EventChange": "dbos_async._executor.observability",
    "ExecutorActivity": "dbos_async._executor.observability",
    "PendingMessage": "dbos_async._executor.observability",
    "QueueMinute": "dbos_async._executor.observability",
    "RunningWorkflow": "dbos_async._executor.observability",
    "StreamValue": "dbos_async._executor.observability",
    "WaitingWorkflow": "dbos_async._executor.observability",
    "MetricData": "dbos_async._executor.observability",
    "QueueMetrics": "dbos_async._executor.observability",
    "StepAggregate": "dbos_async._executor.observability",
    "WorkflowAggregate": "dbos_async._executor.observability",
    "QueueDepth": "dbos_async._executor.observability",
    "WorkflowActivity": "dbos_async._executor.observability",
    "Debouncer": "dbos_async._executor.queues",
    "DeduplicationPolicy": "dbos_async._executor.queues",
    "LimiterSpec": "dbos_async._executor.queues",
    "Queue": "dbos_async._executor.queues",
    "RateLimit": "dbos_async._executor.queues",
    "SetEnqueueOptions": "dbos_async._executor.queues",
    "EnqueueOutcome": "dbos_async._executor.queues.batch",
    "EnqueueRequest": "dbos_async._executor.queues.batch",
    "EnqueueResult": "dbos_async._executor.queues.batch",
    "Divergence": "dbos_async._executor.replay",
    "ReplayResult": "dbos_async._executor.replay",
    "ScheduleDefinition": "dbos_async._executor.schedules.operator",
    "WorkflowSchedule": "dbos_async._executor.schedules.definition",
    "Serializer": "dbos_async._executor.serialization",
    "WorkflowSerializationFormat": "dbos_async._executor.serialization",
    "RetryOn": "dbos_async._executor.steps",
    "StepOptions": "dbos_async._executor.steps",
    "ExecutorHealth": "dbos_async._executor.tasks",
    "TaskHealth": "dbos_async._executor.tasks",
    "transaction_connection": "dbos_async._executor.transactions",
    "WorkflowStatusString": "dbos_async.statuses",
    "DatabaseHealth": "dbos_async._sysdb.health",
    "holds_sharded_schema": "dbos_async._sysdb.migrations",
    "VersionBacklog": "dbos_async._sysdb.records",
    "migrate": "dbos_async._sysdb.setup",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dbos_async' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


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
    "DebouncerClient",
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
    "MetricData",
    "MigrationError",
    "MissingExtraError",
    "NonExistentWorkflowError",
    "NondeterminismError",
    "NotAuthorizedError",
    "PendingMessage",
    "QueryTimeoutError",
    "Queue",
    "QueueDeduplicatedError",
    "QueueDepth",
    "QueueMetrics",
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
    "StartPoint",
    "StatementCanceledError",
    "StepAggregate",
    "StepNamed",
    "StepOptions",
    "StepRetriesExceededError",
    "StreamTimeoutError",
    "StreamValue",
    "TaskHealth",
    "TimeBound",
    "TransactionError",
    "VersionBacklog",
    "WaitingWorkflow",
    "WorkflowActivity",
    "WorkflowAggregate",
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
    "WorkflowSerializationFormat",
    "WorkflowStateError",
    "WorkflowStatus",
    "WorkflowStatusString",
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
    "transaction_connection",
]
