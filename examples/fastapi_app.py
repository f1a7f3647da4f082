"""A checkout service on FastAPI: every order is a durable workflow.

Run it (the system database from DBOS_SYSTEM_DATABASE_URL; without one, an embedded
PostgreSQL under ./.dbos/):

    uvicorn examples.fastapi_app:app

and place an order, idempotently:

    curl -X POST localhost:8000/orders -H 'Idempotency-Key: 9b2f0d7e' \\
         -H 'Content-Type: application/json' \\
         -d '{"order_id": "o-1", "customer": "acme", "items": ["book"], "total_cents": 4200}'

Sending the same request again returns the same checkout without charging twice; the same
key with another body is refused (409). A card "0000" is declined: the answer is a 402
problem, the same on every retry. Kill the server while an order is being shipped and start
it again: the order resumes where it stopped, and the retried request gets its result.
``GET /workflows``, ``/workflows/{id}`` and ``/workflows/{id}/steps`` show what ran.

Shipping calls the warehouse at WAREHOUSE_URL (``POST /shipments``) when it is set, and
makes a local label otherwise.
"""

from __future__ import annotations

import os

import httpx2
from fastapi import FastAPI
from pydantic import BaseModel

from dbos_async import DBOS, SetWorkflowAttributes
from dbos_async.fastapi import DBOSDep, install, lifespan, workflow_router

dbos = DBOS(name="fastapi-checkout")


class Order(BaseModel):
    order_id: str
    customer: str
    items: list[str]
    total_cents: int
    card: str = "4242"


class Receipt(BaseModel):
    order_id: str
    charged_cents: int
    tracking: str


class Checkout(BaseModel):
    workflow_id: str
    receipt: Receipt


class PaymentDeclined(Exception):
    """The card was refused: not worth retrying."""


@dbos.step()
async def reserve_stock(order: Order) -> list[str]:
    return [f"{item}-reserved" for item in order.items]


@dbos.step(retries=3, retry_interval=0.2, retry_on=ConnectionError)
async def charge_card(order: Order) -> int:
    if order.card == "0000":
        raise PaymentDeclined(f"card {order.card} was declined for order {order.order_id}")
    return order.total_cents


@dbos.step(retries=3, retry_interval=0.5)
async def ship(order: Order, reserved: list[str]) -> str:
    warehouse = os.environ.get("WAREHOUSE_URL")
    if not warehouse:
        return f"local-{order.order_id}"
    async with httpx2.AsyncClient(base_url=warehouse, timeout=30) as client:
        answer = await client.post("/shipments", json={"order_id": order.order_id,
                                                       "items": reserved})
        answer.raise_for_status()
        tracking: str = answer.json()["tracking"]
        return tracking


@dbos.workflow()
async def checkout(order: Order) -> Receipt:
    reserved = await reserve_stock(order)
    charged = await charge_card(order)
    tracking = await ship(order, reserved)
    return Receipt(order_id=order.order_id, charged_cents=charged, tracking=tracking)


app = FastAPI(title="checkout", lifespan=lifespan(dbos))
install(app, error_statuses={"PaymentDeclined": 402})
app.include_router(workflow_router())


@app.post("/orders")
async def place_order(order: Order, executor: DBOSDep) -> Checkout:
    # With an Idempotency-Key header, the key is this workflow's ID.
    with SetWorkflowAttributes({"customer": order.customer}):
        handle = await executor.start_workflow(checkout, order)
    return Checkout(workflow_id=handle.workflow_id, receipt=await handle.get_result())


@app.get("/orders/{workflow_id}")
async def get_order(workflow_id: str, executor: DBOSDep) -> Checkout:
    handle = await executor.retrieve_workflow(workflow_id)
    return Checkout(workflow_id=workflow_id, receipt=await handle.get_result())


@app.post("/orders/{workflow_id}/cancel")
async def cancel_order(workflow_id: str, executor: DBOSDep) -> dict[str, str]:
    await executor.cancel_workflow(workflow_id)
    status = await (await executor.retrieve_workflow(workflow_id)).get_status()
    return {"workflow_id": workflow_id, "status": status.status}
