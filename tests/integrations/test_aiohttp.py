"""dbos_async.aiohttp: the example service as a subprocess (its own ``main``), driven over
HTTP (see tests/helpers/web_scenarios.py), and small apps served in this process by
aiohttp's AppRunner for what needs a hook inside a handler (a race for one key) or another
set-up (a client, a sub-application, the app's own cleanup context)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
from aiohttp import web

from dbos_async import DBOSClient, SetWorkflowID, current_shard_key
from dbos_async.aiohttp import (
    CLIENT_KEY,
    DBOS_KEY,
    current_idempotent_request,
    setup,
    workflow_routes,
)
from dbos_async.errors import ConfigurationError
from tests.helpers import new_dbos
from tests.helpers import web_scenarios as scenarios
from tests.helpers.web_services import AIOHTTP_COMMAND, Service, Warehouse, running_service


@pytest.fixture
async def service(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Service, Warehouse]]:
    async with running_service(AIOHTTP_COMMAND, database_url, tmp_path) as running:
        yield running


async def test_concurrent_orders_each_run_once(service: tuple[Service, Warehouse]) -> None:
    await scenarios.concurrent_orders_each_run_once(*service)


async def test_same_key_same_answer_other_body_conflicts(
        service: tuple[Service, Warehouse]) -> None:
    await scenarios.same_key_same_answer_other_body_conflicts(*service)


async def test_every_error_is_a_problem(service: tuple[Service, Warehouse]) -> None:
    await scenarios.every_error_is_a_problem(*service)


async def test_declined_payment_reads_the_same(service: tuple[Service, Warehouse]) -> None:
    await scenarios.declined_payment_reads_the_same(*service)


async def test_cancelled_order_answers_404(service: tuple[Service, Warehouse]) -> None:
    await scenarios.cancelled_order_answers_404(*service)


async def test_restart_mid_step_retry_gets_resumed_result(
        service: tuple[Service, Warehouse]) -> None:
    await scenarios.restart_mid_step_retry_gets_resumed_result(*service)


async def test_workflow_routes(service: tuple[Service, Warehouse]) -> None:
    await scenarios.workflow_routes(*service)


# ---- Apps served in this process ----

@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[httpx2.AsyncClient]:
    """Serve ``app`` on a free port of 127.0.0.1 (started: its cleanup contexts entered)
    until the block ends."""
    runner = web.AppRunner(app, shutdown_timeout=5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        async with httpx2.AsyncClient(base_url=f"http://{host}:{port}", timeout=60) as client:
            yield client
    finally:
        await runner.cleanup()


async def test_the_loser_of_a_race_for_a_key_answers_conflict(database_url: str) -> None:
    """Two requests with one key and different bodies both pass the check before the
    handler (no workflow yet); one start wins, the other joins its workflow, and the check
    after the handler turns the joiner's answer into a 409."""
    dbos = new_dbos(database_url)
    arrived: list[str] = []
    both_arrived = asyncio.Event()

    @dbos.workflow()
    async def echo(text: str) -> str:
        return text

    async def handler(request: web.Request) -> web.Response:
        text = await request.text()
        arrived.append(text)
        if len(arrived) % 2 == 0:
            both_arrived.set()
        await both_arrived.wait()
        return web.json_response({"echo": await echo(text)})

    app = web.Application()
    setup(app, dbos)
    app.router.add_post("/echo", handler)
    async with serving(app) as client:
        racing = await asyncio.gather(*(
            client.post("/echo", content=text, headers={"Idempotency-Key": "race"})
            for text in ("a", "b")))
        both_arrived.clear()
        same = await asyncio.gather(*(
            client.post("/echo", content="c", headers={"Idempotency-Key": "same"})
            for _ in range(2)))
    assert sorted(r.status_code for r in racing) == [200, 409], [r.text for r in racing]
    winner = next(r for r in racing if r.status_code == 200)
    loser = next(r for r in racing if r.status_code == 409)
    assert winner.json() == {"echo": winner.request.content.decode()}
    assert loser.json()["error_type"] == "IdempotencyKeyConflictError"
    assert [r.json() for r in same] == [{"echo": "c"}] * 2


async def test_a_key_on_a_request_that_starts_no_workflow_is_not_deduplicated(
        database_url: str) -> None:
    """The key only names the request's workflow: a handler that starts none runs again on
    a retry, and no workflow appears under the key."""
    dbos = new_dbos(database_url)
    calls: list[int] = []

    async def ping(request: web.Request) -> web.Response:
        calls.append(1)
        return web.json_response({"calls": len(calls)})

    app = web.Application()
    setup(app, dbos)
    app.router.add_post("/ping", ping)
    app.add_routes(workflow_routes())
    async with serving(app) as client:
        answers = [(await client.post("/ping", headers={"Idempotency-Key": "k"})).json()
                   for _ in range(2)]
        missing = await client.get("/workflows/k")
    assert answers == [{"calls": 1}, {"calls": 2}]
    assert missing.status_code == 404


async def test_setup_composes_with_the_apps_contexts_and_serves_a_client(
        database_url: str) -> None:
    """A cleanup context added after setup runs inside the executor's (it can start a
    workflow); a second app runs on a DBOSClient, with the read-only routes on a
    sub-application that finds the client through the parent's key, and idempotent
    enqueues."""
    dbos = new_dbos(database_url)
    dbos.queue("greetings")
    greetings: list[str] = []

    @dbos.workflow(name="greet")
    async def greet(name: str) -> str:
        return f"hello {name}"

    async def greeting_context(app: web.Application) -> AsyncIterator[None]:
        assert app[DBOS_KEY] is dbos
        with SetWorkflowID("greeting"):
            greetings.append(await greet("startup"))
        yield

    app = web.Application()
    setup(app, dbos)
    app.cleanup_ctx.append(greeting_context)

    client = DBOSClient(system_database_url=database_url)
    client_app = web.Application()
    setup(client_app, client)
    admin = web.Application()
    admin.add_routes(workflow_routes())
    client_app.add_subapp("/admin", admin)

    async def status(request: web.Request) -> web.Response:
        found = await request.app[CLIENT_KEY].get_workflow_status("greeting")
        return web.json_response({"status": found.status if found else None})

    async def enqueue_greeting(request: web.Request) -> web.Response:
        keyed = current_idempotent_request()
        assert keyed is not None
        handle = await request.app[CLIENT_KEY].enqueue(
            "greetings", "greet", await request.text(), workflow_id=keyed.key,
            attributes=keyed.attributes)
        return web.json_response({"workflow_id": handle.workflow_id,
                                  "greeting": await handle.get_result()})

    client_app.router.add_get("/status", status)
    client_app.router.add_post("/greet", enqueue_greeting)
    async with serving(app), serving(client_app) as client_http:
        assert (await client_http.get("/status")).json() == {"status": "SUCCESS"}
        detail = (await client_http.get("/admin/workflows/greeting")).json()
        enqueued = [await client_http.post("/greet", content=name,
                                           headers={"Idempotency-Key": "g1"})
                    for name in ("ann", "ann", "bob")]
    assert [g.status_code for g in enqueued] == [200, 200, 409], [g.text for g in enqueued]
    assert enqueued[0].json() == enqueued[1].json() == {"workflow_id": "g1",
                                                        "greeting": "hello ann"}
    assert greetings == ["hello startup"]
    assert detail["output"] == "hello startup"
    assert client_app[CLIENT_KEY] is client and DBOS_KEY not in client_app


def test_error_statuses_are_checked_at_setup(database_url: str) -> None:
    for statuses in ({"PaymentDeclined": 200}, {"PaymentDeclined": 799}, {"": 402}):
        with pytest.raises(ConfigurationError, match="error_statuses"):
            setup(web.Application(), new_dbos(database_url), error_statuses=statuses)


async def test_idempotent_requests_on_a_sharded_database(database_url: str) -> None:
    """With ``shard_key_header`` the request's workflows run under the header's key, and the
    same idempotency key under two tenants is two workflows."""
    dbos = new_dbos(database_url, sharding=True)
    runs: list[str] = []

    @dbos.workflow(name="tenant_order")
    async def tenant_order(item: str) -> str:
        runs.append(item)
        return f"{current_shard_key()}:{item}"

    async def order(request: web.Request) -> web.Response:
        handle = await request.app[DBOS_KEY].start_workflow(
            tenant_order, request.match_info["item"])
        return web.json_response({"id": handle.workflow_id,
                                  "result": await handle.get_result()})

    app = web.Application()
    setup(app, dbos, shard_key_header="X-Tenant")
    app.router.add_post("/orders/{item}", order)
    async with serving(app) as client:
        async def post(tenant: str | None, item: str = "lamp") -> httpx2.Response:
            headers = {"Idempotency-Key": "k-1"} | ({"X-Tenant": tenant} if tenant else {})
            return await client.post(f"/orders/{item}", headers=headers)

        first, again, other = await post("acme"), await post("acme"), await post("globex")
        conflict, missing = await post("acme", "book"), await post(None)
    assert first.json() == again.json() == {"id": "k-1", "result": "acme:lamp"}
    assert other.json() == {"id": "k-1", "result": "globex:lamp"}
    assert runs == ["lamp", "lamp"]
    assert conflict.status_code == 409
    assert missing.status_code == 400
    assert "X-Tenant" in missing.json()["detail"]
