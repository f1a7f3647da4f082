"""Large batches a chunk at a time, the event loop let run between chunks.

A batch of many thousand rows (``enqueue_many``) is checked, serialized, written and
answered :data:`CHUNK_ROWS` rows at a time: no stretch of it holds the event loop for long,
so the process's other tasks (heartbeats, claims, requests) keep running, and what is built
for one chunk (a statement's parameters, its reply) is dropped before the next is built.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

CHUNK_ROWS = 1000
"""Rows handled between two turns of the event loop, and rows per statement of a batch
written as several: a chunk takes a few milliseconds to plan or to encode."""


async def spans(total: int, size: int = CHUNK_ROWS) -> AsyncIterator[range]:
    """The indexes ``0 .. total - 1``, ``size`` at a time, the event loop let run before
    every span but the first (so a batch of one span costs no turn of the loop)."""
    for start in range(0, total, size):
        if start:
            await asyncio.sleep(0)
        yield range(start, min(start + size, total))
