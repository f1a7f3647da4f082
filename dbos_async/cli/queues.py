"""``dbos-async queue list``: the stored queues, their limits and how many workflows wait
or run on each."""

from __future__ import annotations

from typing import Any

import click

from dbos_async.cli import render
from dbos_async.cli.target import Target, run, target_options
from dbos_async.executor.queues.declaration import Queue
from dbos_async.sysdb.statements import DELAYED, ENQUEUED, PENDING

DEPTH_STATUSES = (DELAYED, ENQUEUED, PENDING)


@click.group("queue")
def queue() -> None:
    """Inspect queues."""


def _limits(q: Queue | None) -> dict[str, Any]:
    if q is None:  # workflows on a queue no process stored
        return {"stored": False}
    limiter = q.limiter
    return {
        "stored": True,
        "concurrency": q.concurrency,
        "worker_concurrency": q.worker_concurrency,
        "rate_limit": (None if limiter is None
                       else {"limit": limiter.limit, "period": limiter.period}),
        "partitioned": q.partition_queue,
    }


@queue.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@target_options
def list_queues(target: Target, as_json: bool) -> None:
    """List queues, their limits and depth.

    The depth is how many workflows are DELAYED, ENQUEUED and PENDING on each queue; a queue
    with workflows but no stored settings is listed too."""

    async def read() -> tuple[list[Queue], dict[str, dict[str, int]]]:
        async with target.client() as client:
            return await client.list_queues(), await client.queue_depths()

    stored, depths = run(read())
    by_name = {q.name: q for q in stored}
    names = sorted(set(by_name) | set(depths))
    entries = [{"name": name, **_limits(by_name.get(name)),
                "depth": {s: depths.get(name, {}).get(s, 0) for s in DEPTH_STATUSES}}
               for name in names]
    if as_json:
        render.print_json(entries)
        return

    def shown(value: Any) -> str:
        return "" if value is None else str(value)

    rows = []
    for e in entries:
        rate = e.get("rate_limit")
        rows.append([
            e["name"], shown(e.get("concurrency")), shown(e.get("worker_concurrency")),
            f"{rate['limit']}/{rate['period']:g}s" if rate else "",
            *(str(e["depth"][s]) for s in DEPTH_STATUSES),
        ])
    render.table(["QUEUE", "CONCURRENCY", "PER WORKER", "RATE", *DEPTH_STATUSES], rows)
