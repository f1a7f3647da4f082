"""The SQL of the system database, one named builder per statement.

Each family of statements lives in its own module, all built on the shard-key seam of
:class:`~dbos_async.sysdb.statements.base.StatementBase`; :class:`Statements` joins them for
one schema.
"""

from dbos_async.sysdb.statements.base import (
    ACTIVE_STATUSES,
    CANCELLED,
    DELAYED,
    ENQUEUED,
    ERROR,
    MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    PENDING,
    PORTABLE_JSON,
    SUCCESS,
    NewWorkflow,
    Params,
    ParentStep,
    Query,
    StatementBase,
    qualify,
)
from dbos_async.sysdb.statements.messaging import MessagingStatements
from dbos_async.sysdb.statements.queues import (
    CLAIMED_COLUMNS,
    DEDUP_INDEX,
    INTERNAL_QUEUE_NAME,
    QUEUE_COLUMNS,
    QueueRecord,
    QueueStatements,
)
from dbos_async.sysdb.statements.workflows import WorkflowStatements


class Statements(WorkflowStatements, MessagingStatements, QueueStatements):
    """Every statement of the system database, for one schema."""


__all__ = [
    "ACTIVE_STATUSES",
    "CANCELLED",
    "CLAIMED_COLUMNS",
    "DEDUP_INDEX",
    "DELAYED",
    "ENQUEUED",
    "ERROR",
    "INTERNAL_QUEUE_NAME",
    "MAX_RECOVERY_ATTEMPTS_EXCEEDED",
    "PENDING",
    "PORTABLE_JSON",
    "QUEUE_COLUMNS",
    "SUCCESS",
    "NewWorkflow",
    "Params",
    "ParentStep",
    "Query",
    "QueueRecord",
    "StatementBase",
    "Statements",
    "qualify",
]
