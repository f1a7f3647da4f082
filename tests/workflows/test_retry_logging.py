"""Retry loops log without a flood: through an outage of a real server, a line that repeats
the previous one of its loop (the notification listener reconnecting, a queue's claims)
is logged again only once the time since it first appeared has doubled; the repeats in
between go to DEBUG."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter

import pytest
from helpers import new_dbos, wait_until
from helpers.cluster import Cluster

OUTAGE = 6.0


async def test_an_outage_logs_each_repeated_line_once_per_doubling(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dbos_async")
    dbos = new_dbos(cluster.url("repeats"), notification_poll_interval=0.2)
    dbos.queue("jobs", polling_interval=0.1)
    async with dbos:
        caplog.clear()
        cluster.stop()
        started = time.monotonic()
        await asyncio.sleep(OUTAGE)  # the outage itself, not a synchronisation
        cluster.start()
        lasted = time.monotonic() - started

        async def healthy() -> bool:
            return dbos.health().healthy
        await wait_until(healthy, what="the executor to be healthy again")
    lines = Counter(r.getMessage() for r in caplog.records
                    if r.levelno >= logging.WARNING and r.name == "dbos_async")
    # Due after 0 s, then 1, 2, 4, ... seconds: at most this many in the outage (and one
    # more for a line that first appeared late in it).
    bound = 2 + math.ceil(math.log2(lasted))
    looped = {line: n for line, n in lines.items()
              if "could not connect" in line or "claim failed" in line}
    assert looped, lines
    assert all(n <= bound for n in looped.values()), (bound, looped)
