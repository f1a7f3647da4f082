"""Metrics of workflows: the executor's, rendered for Prometheus, and the database's
aggregates.

Run: python examples/metrics.py (needs the `prometheus` extra:
pip install 'dbos_async[prometheus]'). The application creates a PrometheusMetrics (which
turns the executor's metrics on, no OpenTelemetry needed), runs an order workflow (its
payment step fails once and is retried), then prints what a Prometheus scrape of /metrics
would read, and the aggregates of the last hour from the system database. A second run
finds the order finished: nothing runs, so the executor counts nothing, and the aggregates
still count it.
"""

from __future__ import annotations

import dbos_async
from dbos_async import DBOS, SetWorkflowID
from dbos_async.prometheus import PrometheusMetrics

dbos = DBOS(name="metered_shop")  # system_database_url=... or DBOS_SYSTEM_DATABASE_URL
# The executor's metrics (recorded from now on) and, through it, the database's aggregates.
prometheus = PrometheusMetrics(aggregates=dbos)

attempts = 0


@dbos.step(retries=2, retry_interval=0.01)
async def charge(cents: int) -> int:
    global attempts
    attempts += 1
    if attempts == 1:
        raise ConnectionError("the payment service hung up")
    return cents


@dbos.step()
async def ship(order: str) -> str:
    return f"shipment-{order}"


@dbos.workflow()
async def checkout(order: str, cents: int) -> str:
    charged = await charge(cents)
    return f"{order}: charged {charged}, {await ship(order)}"


async def main() -> None:
    async with dbos:
        with SetWorkflowID("order-1"):
            result = await checkout("order-1", 4200)
        # What `GET /metrics` answers: app.add_route("/metrics", prometheus) in FastAPI,
        # dbos_async.aiohttp.metrics_handler(prometheus) in aiohttp.
        exposition = (await prometheus.render()).decode()
        shown = ("dbos_workflow_completed_total", "dbos_step_retries_total",
                 "dbos_step_duration_seconds_count", "dbos_recent_workflows{")
        for line in exposition.splitlines():
            if line.startswith(shown):
                print(" ", line)
        for aggregate in await dbos.get_workflow_aggregates(group_by=["status", "name"]):
            print(f"  last hour: {aggregate.count} {aggregate.name} {aggregate.status}, "
                  f"p50 {aggregate.p50_ms} ms")
        for step in await dbos.get_step_aggregates():
            print(f"  last hour: {step.count} {step.name} steps {step.outcome}")
    print(result)


if __name__ == "__main__":
    dbos_async.run(main())
