"""A running executor with workflows in every status, for the console's tests, and a
uvicorn server on a free port of 127.0.0.1 for an ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2
import uvicorn

from dbos_async import DBOS, SetEnqueueOptions, SetWorkflowID
from tests.helpers import execute, new_dbos, wait_until

XSS_NAME = "<script>alert(1)</script>"
XSS_INPUT = "<img src=x onerror=alert(2)>"


@dataclass
class Scenario:
    dbos: DBOS
    succeeded: str
    failed: str
    child: str
    grandchild: str
    waiting: str
    cancelled: str
    exhausted: str
    running_on_queue: str
    backlog: list[str]
    delayed: str
    xss: str


async def status_of(dbos: DBOS, workflow_id: str) -> str | None:
    status = await dbos.get_workflow_status(workflow_id)
    return status.status if status else None


@contextlib.asynccontextmanager
async def scenario(url: str) -> AsyncIterator[Scenario]:
    """The executor, running, once every workflow has reached its status."""
    # Waiting workflows stay PENDING: leaving needs no grace period for them.
    dbos = new_dbos(url, shutdown_grace_period=0.2)
    backlog_queue = dbos.queue("backlog", concurrency=1)

    @dbos.step(name="load_order")
    async def load_order(order: str) -> dict[str, Any]:
        return {"order": order, "lines": [{"sku": f"sku-{i}", "qty": i} for i in range(200)]}

    @dbos.step(name="charge_card", retries=2, retry_interval=0.01, backoff_rate=1.0)
    async def charge_card() -> None:
        raise ValueError("card declined")

    @dbos.workflow(name="pack_box")
    async def pack_box(sku: str) -> str:
        return f"packed {sku}"

    @dbos.workflow(name="ship_item")
    async def ship_item(sku: str) -> str:
        with SetWorkflowID(f"pack-{sku}"):
            packed = await dbos.start_workflow(pack_box, sku)
        return f"shipped {await packed.get_result()}"

    @dbos.workflow(name="checkout")
    async def checkout(order: str) -> str:
        loaded = await load_order(order)
        await dbos.set_event("progress", "loaded")
        await dbos.write_stream("log", "loaded")
        with SetWorkflowID(f"{order}-ship"):
            shipped = await dbos.start_workflow(ship_item, "sku-1")
        await shipped.get_result()
        await dbos.set_event("progress", "shipped")
        return f"{order}: {len(loaded['lines'])} lines"

    @dbos.workflow(name="pay")
    async def pay() -> None:
        await charge_card()

    @dbos.workflow(name="await_approval")
    async def await_approval() -> Any:
        return await dbos.recv("approval", timeout=600)

    @dbos.workflow(name="nightly_report")
    async def nightly_report(scheduled_time: Any, context: Any) -> None:
        return None

    @dbos.workflow(name=XSS_NAME)
    async def xss(text: str) -> str:
        return text

    async with dbos:
        with SetWorkflowID("order-1"):
            done = await dbos.start_workflow(checkout, "order-1")
        await done.get_result()
        with SetWorkflowID("pay-1"):
            failing = await dbos.start_workflow(pay)
        with contextlib.suppress(Exception):
            await failing.get_result()
        with SetWorkflowID("xss-1"):
            await (await dbos.start_workflow(xss, XSS_INPUT)).get_result()
        ids: dict[str, str] = {}
        for name in ("approval-waiting", "approval-cancelled", "approval-exhausted"):
            with SetWorkflowID(name):
                ids[name] = (await dbos.start_workflow(await_approval)).workflow_id
        await dbos.send("approval-waiting", "note for later", topic="unrelated")
        backlog = []
        for i in range(4):
            with SetWorkflowID(f"backlog-{i}"):
                backlog.append((await backlog_queue.enqueue(await_approval)).workflow_id)
        with SetWorkflowID("later-1"), SetEnqueueOptions(delay=3600):
            delayed = (await backlog_queue.enqueue(ship_item, "sku-9")).workflow_id
        await dbos.create_schedule("nightly", nightly_report, "0 3 * * *")
        await dbos.cancel_workflow("approval-cancelled")
        await dbos.cancel_workflow("approval-exhausted")
        # A workflow recovery gave up on: no executor reaches this status on purpose in a
        # test, so the row is set as the recovery path sets it.
        await execute(url, "UPDATE dbos.workflow_status SET status = "
                           "'MAX_RECOVERY_ATTEMPTS_EXCEEDED' WHERE workflow_uuid = $1",
                      "approval-exhausted")

        async def settled() -> bool:
            return (await status_of(dbos, "backlog-0") == "PENDING"
                    and await status_of(dbos, "approval-waiting") == "PENDING")

        await wait_until(settled, what="the waiting workflows to run")
        yield Scenario(dbos, "order-1", "pay-1", "order-1-ship", "pack-sku-1",
                       "approval-waiting",
                       "approval-cancelled", "approval-exhausted", backlog[0], backlog[1:],
                       delayed, "xss-1")


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free port of 127.0.0.1 until the block ends; yields
    its base URL once it answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    host, port = sock.getsockname()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    base = f"http://{host}:{port}"
    try:
        async with httpx2.AsyncClient(base_url=base, timeout=60) as client:
            probe = asyncio.ensure_future(client.get("/static/console.css"))
            await asyncio.wait({probe, task}, return_when=asyncio.FIRST_COMPLETED)
            assert probe.done(), "the console did not start"
        yield base
    finally:
        server.should_exit = True
        await task
        sock.close()
