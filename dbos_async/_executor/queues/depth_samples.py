"""The depth sampler: each queue's waiting workflows, counted once a minute and stored, so
that a queue's depth history is measured rather than worked back from the rows.

A history worked back from the count now through the enqueues and starts since cannot see
a waiting workflow cancelled, deleted or put back in its queue since; a stored count can.
Once a minute, near its end (at a second drawn at random in its last :data:`WINDOW_MS`, so
that executors sampling the same queues rarely meet), the sampler asks the queue watcher
whether this executor's queues had work in that minute (a claim loop claiming, or woken
from idle) and, if so, stores the waiting count (ENQUEUED or DELAYED) of each of them as
the minute's sample, in one statement (``SystemDatabase.sample_depths``). The first sample
of a minute stands: another executor's later one skips its count. The same statement
deletes the samples older than the longest history read (a day); the retention job
deletes those its cutoff passes.

A minute with no work is not sampled: an idle executor sends nothing more than its idle
poll, and the depth of an idle minute is worked back from the next sample (or now). Only
on an unsharded schema holding the samples table (``sql/additions/depth_samples.sql``).

The sampler waits in real time, as the polls do, and stores each sample under the minute
of the runtime's clock: under a test clock it sets no timer of that clock's.
"""

from __future__ import annotations

import asyncio
import logging
import random

from dbos_async._executor.queues.watcher import QueueWatcher
from dbos_async._executor.runtime import Runtime
from dbos_async._sysdb.repeats import Repeats
from dbos_async._sysdb.statements.observability import HISTORY_MINUTES, MINUTE_MS

logger = logging.getLogger("dbos_async")

WINDOW_MS = 10_000
"""The end of each minute the samples are taken in."""


class DepthSampler:
    """Samples the depths of one runtime's queues, in the minutes they have work."""

    def __init__(self, runtime: Runtime, watcher: QueueWatcher, queue_names: list[str]) -> None:
        self.runtime = runtime
        self.watcher = watcher
        self.queue_names = sorted(queue_names)

    async def run(self) -> None:
        sysdb = self.runtime.system_database
        clock = sysdb.clock
        repeats = Repeats(logger)
        sampled = -1  # the latest minute sampled (or skipped), in minutes
        while True:
            now = clock.now_ms()
            minute = now // MINUTE_MS
            at = (minute + 1) * MINUTE_MS - random.randint(1, WINDOW_MS)
            if at <= now or minute <= sampled:  # this one's window has begun, or is done
                at += MINUTE_MS
            # A period in real time, as the polls' (the samples are keyed by the clock's
            # minute, but they are no durable timer: a test clock's timers stay its own).
            await asyncio.sleep((at - now) / 1000)
            now = clock.now_ms()
            sampled = now // MINUTE_MS
            if not self.watcher.worked():
                continue
            try:
                await sysdb.sample_depths(self.queue_names, sampled * MINUTE_MS,
                                          (sampled - HISTORY_MINUTES + 1) * MINUTE_MS)
                repeats.reset()
            except Exception as error:  # the database away: the next minute's sample
                repeats.log(logging.WARNING, "Sampling the queues' depths failed: %r", error)
