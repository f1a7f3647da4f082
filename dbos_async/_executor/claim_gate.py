"""The claim gate: workflow starts and queue claims run together; recovery runs alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable


class ClaimGate:
    """Workflow starts and queue claims run together; recovery runs alone.

    A workflow this process has just made PENDING (started, or flipped by a queue claim loop)
    but not launched yet looks, to recovery, exactly like one a crash left behind: recovery
    would claim, re-enqueue or dead-letter it under the starter's feet, and it would run
    twice. So each start and each claim round, from its statement until its workflows are
    launched (and known as running here), holds the gate shared, and recovery exclusive. A
    waiting recovery holds back new ones, so a busy process cannot starve it.

    The gate is also where work waits for the executor ID: the ``guard`` (set when the
    executor claimed its ID) is awaited before each start, claim round and recovery, and
    raises while this process may not work under that ID.
    """

    def __init__(self) -> None:
        self._claims = 0
        self._recoveries = 0  # the one running, or waiting for claim rounds to end
        self._changed = asyncio.Condition()
        self._one_recovery = asyncio.Lock()
        self.guard: Callable[[], Awaitable[None]] | None = None

    @contextlib.asynccontextmanager
    async def claiming(self) -> AsyncIterator[None]:
        if self.guard is not None:
            await self.guard()
        # The condition is taken only when a recovery is there to wait for or to wake: a
        # start is otherwise two counter updates (the event loop runs one task at a time).
        if self._recoveries:
            async with self._changed:
                await self._changed.wait_for(lambda: self._recoveries == 0)
                self._claims += 1
        else:
            self._claims += 1
        try:
            yield
        finally:
            self._claims -= 1
            if self._recoveries and not self._claims:
                async with self._changed:
                    self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def recovering(self) -> AsyncIterator[None]:
        if self.guard is not None:
            await self.guard()
        async with self._one_recovery:
            async with self._changed:
                self._recoveries += 1
            try:
                async with self._changed:
                    await self._changed.wait_for(lambda: self._claims == 0)
                yield
            finally:
                async with self._changed:
                    self._recoveries -= 1
                    self._changed.notify_all()
