"""Enqueue options: what ``SetEnqueueOptions`` gives the enqueues of a block, checked once."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Literal

from dbos_async._validation import check_identifier, check_seconds
from dbos_async.errors import DBOSError

DeduplicationPolicy = Literal["reject", "return_existing"]
"""What an enqueue does when an active workflow of the queue holds its deduplication ID:
raise :class:`~dbos_async.QueueDeduplicatedError`, or return that workflow's handle."""


@dataclass(frozen=True)
class EnqueueOptions:
    workflow_id: str | None = None
    priority: int = 0
    deduplication_id: str | None = None
    deduplication_policy: DeduplicationPolicy = "reject"
    partition_key: str | None = None
    delay: float | None = None
    application_version: str | None = None
    timeout: float | None = None


_DEFAULT_OPTIONS = EnqueueOptions()
_enqueue_options: ContextVar[EnqueueOptions | None] = ContextVar("dbos_enqueue_options",
                                                                 default=None)


def current_options() -> EnqueueOptions:
    return _enqueue_options.get() or _DEFAULT_OPTIONS


class SetEnqueueOptions:
    """Options for every enqueue in this block (nested blocks override the fields they set).

    - ``workflow_id``: the enqueued workflow's ID (an existing ID returns that workflow);
    - ``priority``: lower runs first (default 0);
    - ``deduplication_id`` with ``deduplication_policy``: while a workflow with this ID is
      enqueued or running on the queue, another enqueue raises
      :class:`~dbos_async.errors.QueueDeduplicatedError` (``"reject"``) or returns the
      existing workflow's handle (``"return_existing"``);
    - ``partition_key``: required on (and only on) a partitioned queue;
    - ``delay``: seconds before the workflow may start (it is DELAYED until then);
    - ``application_version``: only executors of this version run it;
    - ``timeout``: start-to-close timeout in seconds, counted from when it starts.
    """

    _UNSET: Any = object()

    def __init__(
        self,
        *,
        workflow_id: str | None = _UNSET,
        priority: int = _UNSET,
        deduplication_id: str | None = _UNSET,
        deduplication_policy: DeduplicationPolicy = _UNSET,
        partition_key: str | None = _UNSET,
        delay: float | None = _UNSET,
        application_version: str | None = _UNSET,
        timeout: float | None = _UNSET,
    ) -> None:
        given: dict[str, Any] = {k: v for k, v in {
            "workflow_id": workflow_id, "priority": priority,
            "deduplication_id": deduplication_id, "deduplication_policy": deduplication_policy,
            "partition_key": partition_key, "delay": delay,
            "application_version": application_version, "timeout": timeout,
        }.items() if v is not self._UNSET}
        check_options(given)
        self._given = given

    def __enter__(self) -> SetEnqueueOptions:
        self._token = _enqueue_options.set(replace(current_options(), **self._given))
        return self

    def __exit__(self, *exc: object) -> None:
        _enqueue_options.reset(self._token)


def check_options(given: dict[str, Any]) -> None:
    """Refuse an enqueue option of the wrong type or range, naming it."""
    priority = given.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not 0 <= priority <= 2**31 - 1:
        raise DBOSError(f"priority must be an integer in [0, 2**31-1], got {priority!r}")
    if given.get("deduplication_policy", "reject") not in ("reject", "return_existing"):
        raise DBOSError("deduplication_policy must be 'reject' or 'return_existing', got "
                        f"{given['deduplication_policy']!r}")
    check_seconds(given.get("delay"), "delay")
    check_seconds(given.get("timeout"), "timeout", positive=True)
    for key in ("workflow_id", "deduplication_id", "partition_key", "application_version"):
        check_identifier(given.get(key), key, optional=True)
