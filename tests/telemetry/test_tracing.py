"""OpenTelemetry spans of workflows and steps, and the trace context that travels with a
workflow (``dbos_async/_executor/telemetry/tracing.py``).

dbos_async traces through the global tracer provider, which a process can set only once; so
the spans are made in a process of their own (``tests/helpers/tracing_worker.py``, with the
SDK's in-memory exporter) that prints them as JSON. The test process sets no global
provider: a span of its own (the "request" of the cross-process test) comes from a local
provider, which is all that recording a trace context in a workflow's attributes needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from helpers import new_dbos
from helpers.tracing_worker import define_waiting
from helpers.tracing_worker import new_dbos as worker_dbos
from opentelemetry.sdk.trace import TracerProvider

from dbos_async import DBOSClient

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "tracing_worker.py"
CARRIER_KEY = "dbos.otelContext"


def run_worker(url: str, scenario: str, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run([sys.executable, str(WORKER), url, scenario, *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [span] = [s for s in spans if s["name"] == name]
    return span


def test_span_tree_of_a_workflow_with_two_steps_and_a_child(database_url: str) -> None:
    spans = run_worker(database_url, "tree")
    request, parent, child = one(spans, "request"), one(spans, "parent"), one(spans, "child")
    step_a, step_b, child_step = (one(spans, n) for n in ("step_a", "step_b", "child_step"))
    assert len(spans) == 6
    assert {s["trace_id"] for s in spans} == {request["trace_id"]}
    assert request["parent_span_id"] is None
    assert parent["parent_span_id"] == request["span_id"]
    for below_parent in (step_a, step_b, child):
        assert below_parent["parent_span_id"] == parent["span_id"]
    assert child_step["parent_span_id"] == child["span_id"]

    parent_id = parent["attributes"]["dbos.workflow.id"]
    assert parent["attributes"] == {
        "dbos.workflow.id": parent_id, "dbos.workflow.name": "parent",
        "dbos.executor.id": "tracing-worker", "dbos.workflow.status": "SUCCESS"}
    assert step_a["attributes"] == {"dbos.workflow.id": parent_id, "dbos.step.id": 0,
                                    "dbos.step.name": "step_a", "dbos.step.attempt": 1,
                                    "dbos.step.kind": "step"}
    assert step_b["attributes"]["dbos.step.id"] == 1
    assert child["attributes"]["dbos.workflow.id"] == f"{parent_id}-2"
    assert child_step["attributes"]["dbos.workflow.id"] == f"{parent_id}-2"
    assert all(s["status"] == "UNSET" and s["events"] == [] for s in spans)


def test_a_transaction_is_a_step_span_of_its_kind(database_url: str) -> None:
    spans = run_worker(database_url, "transaction")
    workflow, step = one(spans, "transacting"), one(spans, "read_one")
    assert step["parent_span_id"] == workflow["span_id"]
    assert step["attributes"]["dbos.step.kind"] == "transaction"
    assert step["attributes"]["dbos.step.id"] == 0


def test_each_attempt_of_a_retried_step_is_a_span(database_url: str) -> None:
    spans = run_worker(database_url, "retry")
    workflow = one(spans, "retrying")
    attempts = sorted((s for s in spans if s["name"] == "flaky"),
                      key=lambda s: s["attributes"]["dbos.step.attempt"])
    assert [a["attributes"]["dbos.step.attempt"] for a in attempts] == [1, 2, 3]
    assert all(a["parent_span_id"] == workflow["span_id"] for a in attempts)
    assert all(a["attributes"]["dbos.step.id"] == 0 for a in attempts)
    assert [a["status"] for a in attempts] == ["ERROR", "ERROR", "UNSET"]
    for number, failed in enumerate(attempts[:2], start=1):
        [event] = failed["events"]
        assert event["name"] == "exception"
        assert event["attributes"]["exception.type"] == "ConnectionError"
        assert event["attributes"]["exception.message"] == f"try {number}"
    assert workflow["status"] == "UNSET"
    assert workflow["attributes"]["dbos.workflow.status"] == "SUCCESS"


def test_a_failing_workflow_records_its_error(database_url: str) -> None:
    spans = run_worker(database_url, "failure")
    workflow, step = one(spans, "failing"), one(spans, "explode")
    assert step["parent_span_id"] == workflow["span_id"]
    for span in (workflow, step):
        assert span["status"] == "ERROR"
        [event] = span["events"]
        assert event["name"] == "exception"
        assert event["attributes"]["exception.type"] == "ValueError"
        assert event["attributes"]["exception.message"] == "bad 3"
    assert workflow["attributes"]["dbos.workflow.status"] == "ERROR"


async def test_a_trace_continues_across_a_queue_into_another_executor_process(
    database_url: str,
) -> None:
    tracer = TracerProvider().get_tracer("test")  # local: the global provider stays unset
    async with new_dbos(database_url):  # migrates the schema the client needs
        pass
    async with DBOSClient(database_url) as client:
        await client.register_queue("traced")
        with tracer.start_as_current_span("request") as request:
            handle = await client.enqueue("traced", "queued", 41, attributes={"team": "a"})
        status = await client.get_workflow_status(handle.workflow_id)
    assert status is not None and status.attributes is not None
    context = request.get_span_context()
    trace_id, span_id = format(context.trace_id, "032x"), format(context.span_id, "016x")
    flags = format(context.trace_flags, "02x")
    assert status.attributes == {  # the user's attributes, and the W3C trace context
        "team": "a", CARRIER_KEY: {"traceparent": f"00-{trace_id}-{span_id}-{flags}"}}

    spans = run_worker(database_url, "worker", handle.workflow_id)
    workflow, step = one(spans, "queued"), one(spans, "queued_step")
    assert workflow["trace_id"] == step["trace_id"] == trace_id
    assert workflow["parent_span_id"] == span_id
    assert step["parent_span_id"] == workflow["span_id"]
    assert workflow["attributes"]["dbos.workflow.id"] == handle.workflow_id


async def test_a_recovered_workflow_continues_the_trace_of_its_start(database_url: str) -> None:
    tracer = TracerProvider().get_tracer("test")
    dbos = worker_dbos(database_url, shutdown_grace_period=0)
    waiting = define_waiting(dbos)
    async with dbos:
        with tracer.start_as_current_span("request") as request:
            handle = await dbos.start_workflow(waiting)
    # Left at once: the workflow stays PENDING, for the worker (same executor ID) to recover.
    spans = run_worker(database_url, "recover", handle.workflow_id)
    workflow, step = one(spans, "waiting"), one(spans, "add_one")
    context = request.get_span_context()
    assert workflow["trace_id"] == step["trace_id"] == format(context.trace_id, "032x")
    assert workflow["parent_span_id"] == format(context.span_id, "016x")
    assert step["parent_span_id"] == workflow["span_id"]


NO_OTEL = textwrap.dedent(
    """
    import asyncio, sys
    sys.modules["opentelemetry"] = None  # as if the `otel` extra were not installed
    from dbos_async import DBOS, SetWorkflowAttributes

    dbos = DBOS(system_database_url=sys.argv[1], application_version="no-otel")
    calls = 0

    @dbos.step(retries=1, retry_interval=0.01)
    async def flaky() -> int:
        global calls
        calls += 1
        if calls == 1:
            raise ConnectionError("once")
        return 2

    @dbos.workflow()
    async def child() -> int:
        return await flaky()

    @dbos.workflow()
    async def parent() -> int:
        return await child() + 1

    async def main() -> None:
        async with dbos:
            with SetWorkflowAttributes({"team": "a"}):
                assert await parent() == 3
            statuses = await dbos.list_workflows()
            print(sorted(repr(s.attributes) for s in statuses))

    asyncio.run(main())
    """
)


def test_without_opentelemetry_workflows_run_and_record_no_trace(
    database_url: str, tmp_path: Path,
) -> None:
    script = tmp_path / "no_otel.py"
    script.write_text(NO_OTEL)
    proc = subprocess.run([sys.executable, str(script), database_url], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['None', \"{'team': 'a'}\"]"
