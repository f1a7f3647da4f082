"""Group commit: the durable writes of one kind from many workflows, sent as one statement.

A write that finds its lane idle goes in its caller's task as soon as the event loop has run
what was already ready: the writes that the same turn of the loop makes (the workflows one
claim started, finishing together) join it, and a lone workflow's latency stays one round
trip. While it is in flight, the next writes of that kind queue up; when it returns, every
write queued meanwhile goes together as one statement, in a flusher task the lane owns, and
so on until the queue is empty. There is no timer: the batch is whatever arrived during one
turn of the loop, then during one round trip.

Each caller waits for its own row's verdict (a batch statement judges every row on its
own), so a workflow continues only after its write has committed, exactly as alone. A
writer with nothing left to do after its write (a workflow whose body has ended) hands it
over instead (:meth:`GroupCommit.enqueue`): a flusher task writes it, and the verdict's
future settles what depended on it.

Workflows wait out an outage and other callers do not (see
:func:`~dbos_async._sysdb.retry.outlasting_outages`), so the two never share a batch: each
has lanes of its own, and a batch is written as patiently as its writers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from dbos_async import _metrics as metrics
from dbos_async._sysdb.retry import outlasts_outages

Item = TypeVar("Item")
Result = TypeVar("Result")

DEFAULT_MAX_BATCH = 256
"""The most rows one statement carries: big enough to take what queues up behind a round trip
at thousands of workflows a second, small enough that one statement stays short."""


class _Entry(NamedTuple, Generic[Item, Result]):
    """A write and the future of its verdict (a named tuple: one per write)."""

    item: Item
    future: asyncio.Future[Result]


@dataclass
class _Lane(Generic[Item, Result]):
    """The writes of one kind and one shard key (a batch statement addresses one key)."""

    waiting: list[_Entry[Item, Result]] = field(default_factory=list)
    busy: bool = False


class GroupCommit(Generic[Item, Result]):
    """The lanes of one kind of write. ``write`` runs one batch statement (with its retries)
    and returns a verdict per item, in order; an exception it raises is every item's."""

    def __init__(self, write: Callable[[Hashable, Sequence[Item]],
                                       Awaitable[Sequence[Result | BaseException]]],
                 *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self._write = write
        self._max_batch = max_batch
        # By (lane key, whether its writers outlast outages).
        self._lanes: dict[tuple[Hashable, bool], _Lane[Item, Result]] = {}
        self._flushers: set[asyncio.Task[None]] = set()

    def _queued(self, lane_key: Hashable, item: Item
                ) -> tuple[tuple[Hashable, bool], _Lane[Item, Result], asyncio.Future[Result]]:
        """``item`` queued in its lane: the lane, its key, and the future of its verdict."""
        key = (lane_key, outlasts_outages())
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        lane.waiting.append(_Entry(item, future))
        return key, lane, future

    def enqueue(self, lane_key: Hashable, item: Item) -> asyncio.Future[Result]:
        """Hand ``item`` over to be written with the others of its lane, without waiting:
        the future of its verdict, set once its batch committed. A flusher task writes
        it, from the next turn of the loop (the writes of this turn join it)."""
        key, lane, future = self._queued(lane_key, item)
        if not lane.busy:
            lane.busy = True
            self._start_flusher(key, lane)
        return future

    async def submit(self, lane_key: Hashable, item: Item) -> Result:
        """Write ``item`` with the others of its lane; its verdict once its batch committed."""
        key, lane, future = self._queued(lane_key, item)
        if lane.busy:
            return await future
        lane.busy = True
        try:
            try:
                # One turn of the loop: the writes already due in it join this one.
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                future.cancel()  # not written: the batch skips it
                raise
            batch = [e for e in lane.waiting[:self._max_batch] if not e.future.done()]
            del lane.waiting[:self._max_batch]
            if batch:
                await self._run(key, batch)
        finally:
            self._hand_on(key, lane)
        return future.result()

    def _hand_on(self, lane_key: tuple[Hashable, bool], lane: _Lane[Item, Result]) -> None:
        """After a batch: the writes that queued behind it go next, in a flusher task (it
        inherits this writer's context, and so its patience: the lane's)."""
        if not lane.waiting:
            lane.busy = False
            if lane_key in self._lanes and self._lanes[lane_key] is lane:
                del self._lanes[lane_key]
            return
        self._start_flusher(lane_key, lane)

    def _start_flusher(self, lane_key: tuple[Hashable, bool], lane: _Lane[Item, Result]
                       ) -> None:
        task = asyncio.get_running_loop().create_task(self._flush(lane_key, lane),
                                                      name="dbos-group-commit")
        self._flushers.add(task)
        task.add_done_callback(self._flushers.discard)

    async def _flush(self, lane_key: tuple[Hashable, bool], lane: _Lane[Item, Result]) -> None:
        try:
            while lane.waiting:
                # A caller cancelled while waiting has left: its row is not written.
                live = [e for e in lane.waiting[:self._max_batch] if not e.future.done()]
                del lane.waiting[:self._max_batch]
                if live:
                    await self._run(lane_key, live)
        finally:
            lane.busy = False
            for entry in lane.waiting:  # only on cancellation of the flusher (at close)
                if not entry.future.done():
                    entry.future.cancel()
            lane.waiting.clear()
            if self._lanes.get(lane_key) is lane:
                del self._lanes[lane_key]

    async def _run(self, lane_key: tuple[Hashable, bool], batch: list[_Entry[Item, Result]]
                   ) -> None:
        try:
            metrics.batch_committed(len(batch))
            verdicts = await self._write(lane_key[0], [e.item for e in batch])
        except asyncio.CancelledError:
            for entry in batch:
                entry.future.cancel()
            raise
        except Exception as error:
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(error)
            return
        for entry, verdict in zip(batch, verdicts, strict=True):
            if entry.future.done():
                continue
            if isinstance(verdict, BaseException):
                entry.future.set_exception(verdict)
            else:
                entry.future.set_result(verdict)

    async def aclose(self, grace: float | None = None) -> None:
        """Wait for the batches in flight (called before the pool closes); with a
        ``grace`` period, for at most that many seconds, then stop those left (their
        writers' futures are cancelled: what they wrote may or may not have committed)."""
        if grace is not None and self._flushers:
            await asyncio.wait(self._flushers, timeout=grace)
            for task in self._flushers:
                task.cancel()
        while self._flushers:
            await asyncio.gather(*self._flushers, return_exceptions=True)
