"""Traces of a workflow, its steps and a child it enqueues, under the caller's span.

Run: python examples/tracing.py (needs the `otel` extra: pip install 'dbos_async[otel]').
The application sets an OpenTelemetry tracer provider, here with an in-memory exporter so
the example can print the span tree; a service would export with OTLP instead. A second run
finds the workflow finished and returns its recorded result: nothing runs, nothing is traced.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import dbos_async
from dbos_async import DBOS, SetWorkflowID

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # before the first workflow runs

dbos = DBOS(name="traced_shop")  # system_database_url=... or DBOS_SYSTEM_DATABASE_URL
emails = dbos.queue("emails")


@dbos.step()
async def reserve(item: str) -> str:
    return f"reservation-{item}"


@dbos.step(retries=2, retry_interval=0.01)
async def charge(item: str) -> int:
    return 4200


@dbos.workflow()
async def send_receipt(item: str) -> str:
    return f"receipt for {item}"


@dbos.workflow()
async def checkout(item: str) -> str:
    reservation = await reserve(item)
    await charge(item)
    receipt = await emails.enqueue(send_receipt, item)  # runs on any executor of the queue
    return f"{reservation}, {await receipt.get_result()}"


def print_tree(spans: tuple[ReadableSpan, ...]) -> None:
    ids = {span.context.span_id for span in spans if span.context is not None}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        parent = span.parent.span_id if span.parent and span.parent.span_id in ids else None
        children.setdefault(parent, []).append(span)

    def show(parent: int | None, depth: int) -> None:
        for span in children.get(parent, []):
            attributes = span.attributes or {}
            where = "".join(f" {key}={attributes[key]}" for key in
                            ("dbos.workflow.id", "dbos.step.id", "dbos.workflow.status")
                            if key in attributes)
            print(f"{'  ' * depth}{span.name}{where}")
            assert span.context is not None
            show(span.context.span_id, depth + 1)

    show(None, 0)


async def main() -> None:
    async with dbos:
        with trace.get_tracer("shop").start_as_current_span("POST /checkout"), \
                SetWorkflowID("checkout-1"):
            result = await checkout("lamp")
    print_tree(exporter.get_finished_spans())  # after the executor left: every span ended
    print(result)


if __name__ == "__main__":
    dbos_async.run(main())  # uvloop when installed; DBOS_UVLOOP=0 turns it off
