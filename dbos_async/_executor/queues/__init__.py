"""Durable queues: declaration and limits (``declaration``), enqueue options (``options``),
enqueueing (``enqueue``), debouncing (``debounce``) and the claim loops that run queued
workflows (``claim_loop``)."""

from dbos_async._executor.queues.debounce import Debouncer
from dbos_async._executor.queues.declaration import LimiterSpec, Queue, RateLimit
from dbos_async._executor.queues.options import DeduplicationPolicy, SetEnqueueOptions

__all__ = [
    "Debouncer",
    "DeduplicationPolicy",
    "LimiterSpec",
    "Queue",
    "RateLimit",
    "SetEnqueueOptions",
]
