"""The system database: SQL, migrations, connection handling and shard-key routing.

Nothing here knows about Python functions or serialization; it stores and returns strings.
"""

from dbos_async._sysdb.database import StepRecord, SystemDatabase, WorkflowRow
from dbos_async._sysdb.records import StatusRecord, status_record

__all__ = ["StatusRecord", "StepRecord", "SystemDatabase", "WorkflowRow", "status_record"]
