"""The statuses a workflow records, as one public type every layer reads them from.

Names and values are those of the ``dbos`` package's ``WorkflowStatusString``, so code that
compares statuses reads the same with either package.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["WorkflowStatusString"]


class WorkflowStatusString(StrEnum):
    """The status of a workflow, as stored in its row (``WorkflowStatus.status``).

    Each member is a ``str`` equal to the stored text, so ``status.status ==
    WorkflowStatusString.SUCCESS`` holds and a member can be passed wherever a status string
    is taken (``list_workflows(status=...)``). The active statuses come first.
    """

    PENDING = "PENDING"
    """Running, or waiting for recovery after its executor stopped."""
    ENQUEUED = "ENQUEUED"
    """On a queue, waiting for a worker to start it."""
    DELAYED = "DELAYED"
    """On a queue, not to start before its delay ends."""
    SUCCESS = "SUCCESS"
    """Finished with a result."""
    ERROR = "ERROR"
    """Finished with an exception."""
    CANCELLED = "CANCELLED"
    """Cancelled, or past its deadline; resumable."""
    MAX_RECOVERY_ATTEMPTS_EXCEEDED = "MAX_RECOVERY_ATTEMPTS_EXCEEDED"
    """Dead-lettered: recovered more times than ``max_recovery_attempts``; resumable."""
