"""Queue depth samples: an executor whose queue has work stores the queue's waiting count
near the end of each minute, and the depth history reads those minutes as measured,
seeing what working back from the rows cannot (a waiting workflow cancelled since); the
retention job deletes the samples with their minutes."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime

from helpers import fetch, new_dbos, wait_until

from dbos_async import SetEnqueueOptions
from dbos_async.testing import TestClock

MINUTE_MS = 60_000
SAMPLES = """SELECT application_name, minute_epoch_ms, waiting FROM dbos.dbos_async_depth_samples
             WHERE queue_name = 'jobs'"""


async def test_a_queue_with_work_is_sampled_and_its_history_measured(database_url: str) -> None:
    # The sampler waits in real time for the end of the clock's minute (its last 10 s):
    # from 40 s into a minute, that is 10 to 20 s away, time to set up the backlog first.
    start = datetime.now(UTC).replace(second=40, microsecond=0)
    clock = TestClock(start)
    dbos = new_dbos(database_url, clock=clock)
    queue = dbos.queue("jobs", concurrency=1, polling_interval=0.1)
    release = asyncio.Event()

    @dbos.workflow(name="job")
    async def job(x: int) -> int:
        await release.wait()
        return x

    async with dbos:
        first = clock.now_ms() // MINUTE_MS
        handles = [await queue.enqueue(job, i) for i in range(4)]
        with SetEnqueueOptions(delay=3600):
            later = await queue.enqueue(job, 9)

        async def one_running() -> bool:
            statuses = Counter([(await h.get_status()).status for h in handles])
            return statuses == Counter({"PENDING": 1, "ENQUEUED": 3})

        await wait_until(one_running, what="one job running, three waiting")

        async def history() -> list[tuple[int, int, bool]]:
            return [(d.minute_epoch_ms // MINUTE_MS - first, d.waiting, d.measured)
                    for d in await dbos.get_queue_depth_history(minutes=3)
                    if d.queue_name == "jobs"]

        async def sampled() -> bool:
            return bool(await fetch(database_url, SAMPLES))

        # At the minute's end the queue has work (its one slot taken): it is sampled,
        # four waiting (three ENQUEUED, one DELAYED).
        await wait_until(sampled, patience=60, what="the minute's sample")
        assert [tuple(r) for r in await fetch(database_url, SAMPLES)] == [
            ("", first * MINUTE_MS, 4)]
        await clock.advance(seconds=60)
        # A waiting workflow cancelled (it leaves the queue): the count now drops, the
        # sampled minute keeps what was measured (worked back from now it would read 3),
        # and the minute before it is worked back from the sample: 4, less the 4 enqueued
        # still on the queue, plus the 1 started.
        statuses = [(await h.get_status()).status for h in handles]
        waiting = handles[statuses.index("ENQUEUED")]
        await dbos.cancel_workflow(waiting.workflow_id)
        assert await history() == [(-1, 1, False), (0, 4, True), (1, 3, True)]

        # The retention job deletes the samples before its cutoff (no workflow finished
        # before it): that minute is worked back from now again.
        assert await dbos.garbage_collect(cutoff_epoch_ms=(first + 1) * MINUTE_MS) == 0
        assert await history() == [(-1, 0, False), (0, 3, False), (1, 3, True)]

        release.set()
        for handle in handles:
            if handle is not waiting:
                assert await handle.get_result() in range(4)
        await dbos.cancel_workflow(later.workflow_id)
