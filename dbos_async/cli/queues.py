"""``dbos-async queue ...``: the stored queues, their limits and how many workflows wait
or run on each; reading, changing and deleting one queue's stored settings."""

from __future__ import annotations

from typing import Any

import click

from dbos_async._executor.queues.declaration import Queue
from dbos_async.cli import render
from dbos_async.cli.target import Target, run, target_options
from dbos_async.errors import QueueNotFoundError
from dbos_async.statuses import WorkflowStatusString

DEPTH_STATUSES = (WorkflowStatusString.DELAYED, WorkflowStatusString.ENQUEUED,
                  WorkflowStatusString.PENDING)


@click.group("queue")
def queue() -> None:
    """Inspect and change stored queues."""


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
        "polling_interval": q.polling_interval,
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


@queue.command("get")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
@target_options
def get_queue(target: Target, name: str, as_json: bool) -> None:
    """Show a stored queue's settings."""

    async def read() -> Queue:
        async with target.client() as client:
            found = await client.get_queue_definition(name)
        if found is None:
            raise QueueNotFoundError(name)
        return found

    _print_queue(run(read()), as_json)


def _print_queue(q: Queue, as_json: bool) -> None:
    limits = _limits(q)
    del limits["stored"]
    if as_json:
        render.print_json({"name": q.name, **limits})
        return
    rate = limits["rate_limit"]
    render.fields([("Queue", q.name), ("Concurrency", q.concurrency),
                   ("Per worker", q.worker_concurrency),
                   ("Rate", f"{rate['limit']}/{rate['period']:g}s" if rate else None),
                   ("Partitioned", q.partition_queue),
                   ("Polling interval", f"{q.polling_interval:g}s")])


REMOVABLE = {"concurrency": "concurrency", "worker-concurrency": "worker_concurrency",
             "rate-limit": "limiter"}


def _rate(value: str | None) -> tuple[int, float] | None:
    if value is None:
        return None
    limit, _, period = value.partition("/")
    try:
        return int(limit), float(period.removesuffix("s"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not LIMIT/SECONDS (e.g. 50/60)",
                                 param_hint="--rate-limit") from None


@queue.command("update")
@click.argument("name")
@click.option("--concurrency", type=int, help="At most N running, across every executor.")
@click.option("--worker-concurrency", type=int, help="At most N running per executor.")
@click.option("--rate-limit", metavar="LIMIT/SECONDS",
              help="At most LIMIT starts per SECONDS (e.g. 50/60).")
@click.option("--polling-interval", type=float, metavar="SECONDS",
              help="The longest a claim loop sleeps between claims.")
@click.option("--remove", "removed", multiple=True, type=click.Choice(sorted(REMOVABLE)),
              help="Remove this limit (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
@target_options
def update_queue(target: Target, name: str, concurrency: int | None,
                 worker_concurrency: int | None, rate_limit: str | None,
                 polling_interval: float | None, removed: tuple[str, ...],
                 as_json: bool) -> None:
    """Change a stored queue's limits, keeping those not named. Executors apply them when
    they next start listening to the queue."""
    changes: dict[str, Any] = {key: value for key, value in {
        "concurrency": concurrency, "worker_concurrency": worker_concurrency,
        "limiter": _rate(rate_limit), "polling_interval": polling_interval,
    }.items() if value is not None}
    for limit in removed:
        if REMOVABLE[limit] in changes:
            raise click.UsageError(f"--remove {limit} contradicts a new value for it")
        changes[REMOVABLE[limit]] = None
    if not changes:
        raise click.UsageError("Nothing to change: give a new limit or --remove one")

    async def change() -> Queue:
        async with target.client() as client:
            return await client.update_queue(name, **changes)

    _print_queue(run(change()), as_json)


@queue.command("delete")
@click.argument("name")
@target_options
def delete_queue(target: Target, name: str) -> None:
    """Delete a stored queue's settings (its workflows stay; executors that declare it in
    code store it again when they start)."""

    async def delete() -> None:
        async with target.client() as client:
            await client.delete_queue(name)

    run(delete())
    click.echo(f"Deleted queue {name}")
