"""dbos_async.fastapi: the example service under uvicorn in a subprocess, driven over HTTP
(see tests/helpers/web_scenarios.py), and small apps served by uvicorn in this process for
what needs a hook inside an endpoint (a race for one key) or another set-up (a client, the
app's own lifespan)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from fastapi import FastAPI, Request

from dbos_async import DBOSClient, SetAuthentication, SetWorkflowID, current_shard_key
from dbos_async.errors import ConfigurationError
from dbos_async.fastapi import (
    DBOSClientDep,
    DBOSDep,
    current_idempotent_request,
    install,
    lifespan,
    workflow_router,
)
from tests.helpers import new_dbos
from tests.helpers import web_scenarios as scenarios
from tests.helpers.web_services import FASTAPI_COMMAND, Service, Warehouse, running_service


@pytest.fixture
async def service(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Service, Warehouse]]:
    async with running_service(FASTAPI_COMMAND, database_url, tmp_path) as running:
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
async def serving(app: FastAPI) -> AsyncIterator[httpx2.AsyncClient]:
    """Serve ``app`` with uvicorn on a free port of 127.0.0.1 until the block ends, once its
    lifespan has started (it answers the OpenAPI document)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    host, port = sock.getsockname()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        async with httpx2.AsyncClient(base_url=f"http://{host}:{port}", timeout=60) as client:
            probe = asyncio.ensure_future(client.get("/openapi.json"))
            await asyncio.wait({probe, task}, return_when=asyncio.FIRST_COMPLETED)
            assert probe.done(), "the app did not start"
            yield client
    finally:
        server.should_exit = True
        await task
        sock.close()


async def test_the_loser_of_a_race_for_a_key_answers_conflict(database_url: str) -> None:
    """Two requests with one key and different bodies both pass the check before the
    endpoint (no workflow yet); one start wins, the other joins its workflow, and the check
    when the response starts turns the joiner's answer into a 409."""
    dbos = new_dbos(database_url)
    arrived: list[str] = []
    both_arrived = asyncio.Event()

    @dbos.workflow()
    async def echo(text: str) -> str:
        return text

    app = FastAPI(lifespan=lifespan(dbos))
    install(app)

    @app.post("/echo")
    async def endpoint(request: Request) -> dict[str, str]:
        text = (await request.body()).decode()
        arrived.append(text)
        if len(arrived) % 2 == 0:
            both_arrived.set()
        await both_arrived.wait()
        return {"echo": await echo(text)}

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
    """The key only names the request's workflow: an endpoint that starts none runs again on
    a retry, and no workflow appears under the key."""
    dbos = new_dbos(database_url)
    calls: list[int] = []
    app = FastAPI(lifespan=lifespan(dbos))
    install(app)
    app.include_router(workflow_router())

    @app.post("/ping")
    async def ping() -> dict[str, int]:
        calls.append(1)
        return {"calls": len(calls)}

    async with serving(app) as client:
        answers = [(await client.post("/ping", headers={"Idempotency-Key": "k"})).json()
                   for _ in range(2)]
        missing = await client.get("/workflows/k")
    assert answers == [{"calls": 1}, {"calls": 2}]
    assert missing.status_code == 404


async def test_lifespan_composes_with_the_apps_and_serves_a_client(database_url: str) -> None:
    """The executor is entered around the app's own lifespan (which can start a workflow,
    and whose state reaches requests); a second app runs on a DBOSClient, with its
    dependency, idempotent enqueues and the read-only routes; the wrong dependency is a
    clear problem."""
    dbos = new_dbos(database_url)
    dbos.queue("greetings")

    @dbos.workflow(name="greet")
    async def greet(name: str) -> str:
        return f"hello {name}"

    @contextlib.asynccontextmanager
    async def app_lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        with SetWorkflowID("greeting"):
            greeting = await greet("startup")
        yield {"greeting": greeting}

    app = FastAPI(lifespan=lifespan(dbos, app_lifespan))
    install(app)

    @app.get("/greeting")
    async def greeting(request: Request, executor: DBOSDep) -> dict[str, Any]:
        return {"greeting": request.state.greeting, "same": executor is dbos}

    client_app = FastAPI(lifespan=lifespan(DBOSClient(system_database_url=database_url)))
    install(client_app)
    client_app.include_router(workflow_router(prefix="/admin/workflows"))

    @client_app.get("/status/{workflow_id}")
    async def status(workflow_id: str, client: DBOSClientDep) -> dict[str, Any]:
        found = await client.get_workflow_status(workflow_id)
        return {"status": found.status if found else None}

    @client_app.post("/greet")
    async def enqueue_greeting(request: Request, client: DBOSClientDep) -> dict[str, Any]:
        keyed = current_idempotent_request()
        assert keyed is not None
        handle = await client.enqueue("greetings", "greet", (await request.body()).decode(),
                                      workflow_id=keyed.key, attributes=keyed.attributes)
        return {"workflow_id": handle.workflow_id, "greeting": await handle.get_result()}

    @client_app.get("/wrong")
    async def wrong(executor: DBOSDep) -> dict[str, str]:
        return {}

    async with serving(app) as http, serving(client_app) as client_http:
        assert (await http.get("/greeting")).json() == {"greeting": "hello startup",
                                                        "same": True}
        assert (await client_http.get("/status/greeting")).json() == {"status": "SUCCESS"}
        detail = (await client_http.get("/admin/workflows/greeting")).json()
        assert detail["output"] == "hello startup"
        # Statuses by name, in any case; an unknown one is refused naming the choices.
        succeeded = (await client_http.get("/admin/workflows",
                                           params={"status": "success"})).json()
        assert "greeting" in {w["workflow_id"] for w in succeeded["workflows"]}
        unknown = await client_http.get("/admin/workflows", params={"status": "DONE"})
        greetings = [await client_http.post("/greet", content=name,
                                            headers={"Idempotency-Key": "g1"})
                     for name in ("ann", "ann", "bob")]
        wrong_dependency = await client_http.get("/wrong")
    assert [g.status_code for g in greetings] == [200, 200, 409], [g.text for g in greetings]
    assert greetings[0].json() == greetings[1].json() == {"workflow_id": "g1",
                                                          "greeting": "hello ann"}
    assert unknown.status_code == 400
    assert "Unknown status 'DONE': choose from PENDING, ENQUEUED" in unknown.text
    assert wrong_dependency.status_code == 500
    assert "get_client" in wrong_dependency.json()["detail"]
    assert not hasattr(app.state, "dbos_async")


def test_error_statuses_are_checked_at_install() -> None:
    for statuses in ({"PaymentDeclined": 200}, {"PaymentDeclined": 799}, {"": 402}):
        with pytest.raises(ConfigurationError, match="error_statuses"):
            install(FastAPI(), error_statuses=statuses)


async def test_idempotent_requests_on_a_sharded_database(database_url: str) -> None:
    """With ``shard_key_header`` the request's workflows run under the header's key, and the
    same idempotency key under two tenants is two workflows."""
    dbos = new_dbos(database_url, sharding=True)
    runs: list[str] = []

    @dbos.workflow(name="tenant_order")
    async def tenant_order(item: str) -> str:
        runs.append(item)
        return f"{current_shard_key()}:{item}"

    app = FastAPI(lifespan=lifespan(dbos))
    install(app, shard_key_header="X-Tenant")

    @app.post("/orders/{item}")
    async def order(item: str, dbos: DBOSDep) -> dict[str, str]:
        handle = await dbos.start_workflow(tenant_order, item)
        return {"id": handle.workflow_id, "result": await handle.get_result()}

    async with serving(app) as client:
        def post(tenant: str | None, item: str = "lamp") -> Any:
            headers = {"Idempotency-Key": "k-1"} | ({"X-Tenant": tenant} if tenant else {})
            return client.post(f"/orders/{item}", headers=headers)

        first, again, other = await post("acme"), await post("acme"), await post("globex")
        conflict, missing = await post("acme", "book"), await post(None)
    assert first.json() == again.json() == {"id": "k-1", "result": "acme:lamp"}
    assert other.json() == {"id": "k-1", "result": "globex:lamp"}
    assert runs == ["lamp", "lamp"]
    assert conflict.status_code == 409
    assert missing.status_code == 400
    assert "X-Tenant" in missing.json()["detail"]


async def test_refused_arguments_roles_and_states_answer_4xx(database_url: str) -> None:
    """A workflow ID the API refuses is the client's fault (400), a missing role is 403, and
    a change a workflow's status does not allow is 409."""
    dbos = new_dbos(database_url)
    app = FastAPI(lifespan=lifespan(dbos))
    install(app)

    @dbos.workflow(name="guarded", required_roles=["admin"])
    async def guarded() -> str:
        return "ok"

    @dbos.workflow(name="plain")
    async def plain() -> str:
        return "ok"

    @app.get("/status/{workflow_id}")
    async def status(workflow_id: str) -> dict[str, str | None]:
        found = await dbos.get_workflow_status(workflow_id)
        return {"status": found.status if found else None}

    @app.post("/guarded")
    async def call_guarded() -> str:
        with SetAuthentication("bob", roles=["user"]):
            return await guarded()

    @app.post("/prioritise")
    async def prioritise() -> None:
        with SetWorkflowID("done"):
            await plain()
        await dbos.set_workflow_priority("done", 1)

    async with serving(app) as client:
        refused = await client.get("/status/a%00b")  # a NUL no ID can hold
        forbidden = await client.post("/guarded")
        conflict = await client.post("/prioritise")
    assert refused.status_code == 400 and "workflow" in refused.json()["detail"].lower()
    assert forbidden.status_code == 403
    assert conflict.status_code == 409
