"""What the FastAPI and aiohttp example services must both do, driven over HTTP.

Each scenario takes a running :class:`~tests.helpers.web_services.Service` and its
:class:`~tests.helpers.web_services.Warehouse`; ``tests/integrations/test_fastapi.py`` and
``tests/integrations/test_aiohttp.py`` run every one against their framework's example.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from typing import Any

import httpx2

from tests.helpers.web_services import Service, Warehouse

PROBLEM = "application/problem+json"

def order(order_id: str, **changes: Any) -> dict[str, Any]:
    return {"order_id": order_id, "customer": "acme", "items": ["book", "lamp"],
            "total_cents": 4200, **changes}


def key() -> str:
    return str(uuid.uuid4())


async def place(service: Service, body: dict[str, Any], idempotency_key: str | None = None,
                **headers: str) -> httpx2.Response:
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return await service.client.post("/orders", content=json.dumps(body),
                                      headers={"Content-Type": "application/json", **headers})


def problem(response: httpx2.Response, status: int) -> dict[str, Any]:
    """The problem body of ``response``, checked to be one with this status."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"] == "about:blank"
    return body


async def workflows(service: Service, **params: Any) -> list[dict[str, Any]]:
    response = await service.client.get("/workflows", params=params)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["workflows"]
    return found


async def concurrent_orders_each_run_once(service: Service, warehouse: Warehouse) -> None:
    """Twenty orders, each sent twice at once under its own key: every order is one
    workflow, shipped once, and both of its requests get the same answer."""
    keys = [key() for _ in range(20)]
    responses = await asyncio.gather(*(
        place(service, order(f"o-{i}"), k) for _ in range(2) for i, k in enumerate(keys)))
    assert [r.status_code for r in responses] == [200] * 40, [r.text for r in responses]
    answers: dict[str, list[Any]] = {}
    for response in responses:
        answers.setdefault(response.json()["workflow_id"], []).append(response.json())
    assert set(answers) == set(keys)
    assert all(first == second for first, second in answers.values())
    assert Counter(call["order_id"] for call in warehouse.calls) == {
        f"o-{i}": 1 for i in range(20)}
    assert len(await workflows(service, name="checkout")) == 20


async def same_key_same_answer_other_body_conflicts(service: Service,
                                                    warehouse: Warehouse) -> None:
    """The same key twice: one workflow, one shipment, the same answer. The same key with
    another body, path or query: a 409 problem, never the first order's receipt. A key on a
    safe method is ignored; a malformed key is a 400."""
    k = key()
    first = await place(service, order("o-1"), k)
    again = await place(service, order("o-1"), k)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.json() == again.json()
    assert first.json()["workflow_id"] == k
    assert first.json()["receipt"]["tracking"] == "track-o-1-1"
    assert len(warehouse.calls) == 1
    assert [w["workflow_id"] for w in await workflows(service, name="checkout")] == [k]

    conflict = problem(await place(service, order("o-1", total_cents=1), k), 409)
    assert conflict["error_type"] == "IdempotencyKeyConflictError"
    assert k in conflict["detail"]
    # Another query string is another request too.
    response = await service.client.post("/orders", params={"coupon": "x"},
                                         content=json.dumps(order("o-1")),
                                         headers={"Content-Type": "application/json",
                                                  "Idempotency-Key": k})
    problem(response, 409)
    assert len(warehouse.calls) == 1

    # The workflow keeps the endpoint's own attributes next to the request digest.
    detail = (await service.client.get(f"/workflows/{k}")).json()
    assert detail["attributes"]["customer"] == "acme"
    assert detail["attributes"]["dbos_async.request_digest"].startswith("sha256:")

    # GET is safe: the key names the workflow being read, not a request to deduplicate.
    read = await service.client.get(f"/orders/{k}", headers={"Idempotency-Key": k})
    assert read.status_code == 200, read.text
    assert read.json() == first.json()

    malformed = problem(await place(service, order("o-2"), "bad key with spaces"), 400)
    assert malformed["error_type"] == "InvalidRequestError"
    assert "Idempotency-Key" in malformed["detail"]
    # Header bytes arrive decoded as Latin-1: the error shows UTF-8 text as it was sent.
    accented = problem(await service.client.post(
        "/orders", content=json.dumps(order("o-2")),
        headers={"Content-Type": "application/json", "Idempotency-Key": "clé 1".encode()}), 400)
    assert "got 'clé 1'" in accented["detail"], accented
    # A quoted key (the IETF draft's structured-field form) is the same key.
    quoted = await place(service, order("o-1"), f'"{k}"')
    assert quoted.status_code == 200 and quoted.json() == first.json()


async def every_error_is_a_problem(service: Service, warehouse: Warehouse) -> None:
    """One format for every error: a body failing validation is a 422 problem listing what
    is wrong (not the framework's own ``{"detail": ...}``), an unknown route a 404 problem,
    a method the route lacks a 405 problem with its ``Allow`` header, a key reused for
    another request a 409 (see above)."""
    invalid = problem(await place(service, {"order_id": "o-bad"}), 422)
    assert {tuple(e["loc"])[-1] for e in invalid["errors"]} >= {"customer"}, invalid
    assert all(e["msg"] for e in invalid["errors"])
    missing = problem(await service.client.get("/no/such/route"), 404)
    assert missing["title"] == "Not Found"
    wrong_method = await service.client.delete("/orders")
    assert problem(wrong_method, 405)["title"] == "Method Not Allowed"
    assert "POST" in wrong_method.headers["allow"]  # the framework's header is kept
    assert warehouse.calls == []


async def declined_payment_reads_the_same(service: Service, warehouse: Warehouse) -> None:
    """A failing workflow: its error mapped to a 402 problem with the recorded type and
    message, the same body on the first call and on the retry (which runs nothing)."""
    k = key()
    first = await place(service, order("o-9", card="0000"), k)
    retry = await place(service, order("o-9", card="0000"), k)
    body = problem(retry, 402)
    assert body["error_type"] == "PaymentDeclined"
    assert body["detail"] == "card 0000 was declined for order o-9"
    assert first.status_code == 402, first.text
    assert first.json() == body
    assert warehouse.calls == []
    steps = (await service.client.get(f"/workflows/{k}/steps")).json()
    assert [s["name"] for s in steps] == ["reserve_stock", "charge_card"]
    assert steps[1]["error"] == {"type": "PaymentDeclined",
                                 "message": "card 0000 was declined for order o-9"}


async def cancelled_order_answers_404(service: Service, warehouse: Warehouse) -> None:
    """Cancelling an order while it ships: the waiting request, its retry and a read of the
    order answer 404 problems naming the workflow."""
    warehouse.hold()
    k = key()
    waiting = asyncio.ensure_future(place(service, order("o-5"), k))
    await warehouse.next_arrival()
    cancel = await service.client.post(f"/orders/{k}/cancel")
    assert cancel.status_code == 200, cancel.text
    assert cancel.json() == {"workflow_id": k, "status": "CANCELLED"}
    body = problem(await waiting, 404)
    assert body["error_type"] == "WorkflowCancelledError"
    assert body["workflow_id"] == k
    assert problem(await place(service, order("o-5"), k), 404) == body
    assert problem(await service.client.get(f"/orders/{k}"), 404) == body
    unknown = problem(await service.client.post("/orders/no-such-order/cancel"), 404)
    assert unknown["error_type"] == "NonExistentWorkflowError"


async def restart_mid_step_retry_gets_resumed_result(service: Service,
                                                     warehouse: Warehouse) -> None:
    """Kill the server while the workflow waits in its shipping step, start it again: the
    workflow resumes (the interrupted step runs again, the others do not), and the client's
    retry of the same request gets the resumed workflow's result."""
    warehouse.hold()
    k = key()
    doomed = asyncio.ensure_future(place(service, order("o-7"), k))
    assert (await warehouse.next_arrival())["order_id"] == "o-7"
    await service.kill()
    try:
        await doomed
    except httpx2.TransportError:
        pass
    else:
        raise AssertionError("the request to the killed server got an answer")
    warehouse.release()
    await service.start()
    retry = await place(service, order("o-7"), k)
    assert retry.status_code == 200, (retry.text, service.output())
    assert retry.json() == {"workflow_id": k, "receipt": {
        "order_id": "o-7", "charged_cents": 4200, "tracking": "track-o-7-2"}}
    assert [c["order_id"] for c in warehouse.calls] == ["o-7", "o-7"]
    steps = (await service.client.get(f"/workflows/{k}/steps")).json()
    assert [(s["name"], s["output"]) for s in steps] == [
        ("reserve_stock", ["book-reserved", "lamp-reserved"]), ("charge_card", 4200),
        ("ship", "track-o-7-2")]
    detail = (await service.client.get(f"/workflows/{k}")).json()
    assert detail["status"] == "SUCCESS"
    assert detail["recovery_attempts"] == 2


async def workflow_routes(service: Service, warehouse: Warehouse) -> None:
    """The read-only routes: a filtered, paged listing, one workflow with its input and
    output, its steps; 404 and 400 problems for unknown IDs and bad parameters."""
    ids = [f"tenant/{i}" for i in range(3)]   # IDs with a slash are reachable too
    for i, k in enumerate(ids):
        assert (await place(service, order(f"o-{i}"), k)).status_code == 200
    assert (await place(service, order("o-x", card="0000"), "failed")).status_code in (402, 500)

    query = {"name": "checkout", "status": "SUCCESS", "limit": 2, "sort_desc": "true"}
    page = (await service.client.get("/workflows", params=query)).json()
    rest = (await service.client.get("/workflows", params={**query, "offset": 2})).json()
    assert (page["offset"], page["limit"], page["next_offset"]) == (0, 2, 2)
    assert (rest["offset"], rest["next_offset"]) == (2, None)
    listed = page["workflows"] + rest["workflows"]
    assert sorted(w["workflow_id"] for w in listed) == ids
    created = [w["created_at"] for w in listed]
    assert created == sorted(created, reverse=True)
    listed = await workflows(service, status=["SUCCESS", "ERROR"])
    assert {w["workflow_id"] for w in listed} == {*ids, "failed"}
    assert all(w["output"] is None for w in listed)      # payloads only when asked for
    errors = await workflows(service, status="ERROR", load_output="true")
    assert errors[0]["error"]["type"] == "PaymentDeclined"
    assert await workflows(service, attributes=json.dumps({"customer": "nobody"})) == []
    assert len(await workflows(service, workflow_ids=ids[:2])) == 2

    detail = (await service.client.get("/workflows/tenant%2F1")).json()
    assert detail["workflow_id"] == "tenant/1"
    assert detail["input"] == {"args": [order("o-1", card="4242")], "kwargs": {}}
    assert detail["output"] == {"order_id": "o-1", "charged_cents": 4200,
                                "tracking": "track-o-1-2"}
    steps = (await service.client.get("/workflows/tenant%2F1/steps")).json()
    assert [s["function_id"] for s in steps] == [0, 1, 2]

    for path in ("/workflows/nope", "/workflows/nope/steps"):
        missing = problem(await service.client.get(path), 404)
        assert missing["error_type"] == "NonExistentWorkflowError"
    for params, named in (({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"),
                          ({"colour": "red"}, "colour"), ({"start_time": "soon"}, "start_time"),
                          ({"attributes": "[1]"}, "attributes"), ({"sort_desc": "maybe"},
                                                                  "sort_desc")):
        bad = problem(await service.client.get("/workflows", params=params), 400)
        assert named in bad["detail"], bad
