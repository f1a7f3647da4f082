"""A checkout service on aiohttp: every order is a durable workflow.

Run it (the system database from DBOS_SYSTEM_DATABASE_URL; without one, an embedded
PostgreSQL under ./.dbos/):

    python examples/aiohttp_app.py            # --host, --port (8080), or --fd N

and place an order, idempotently:

    curl -X POST localhost:8080/orders -H 'Idempotency-Key: 9b2f0d7e' \\
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

import argparse
import os
import socket

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ValidationError

from dbos_async import DBOS, SetWorkflowAttributes
from dbos_async.aiohttp import DBOS_KEY, problem_response, setup, workflow_routes

dbos = DBOS(name="aiohttp-checkout")


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
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(base_url=warehouse, timeout=timeout) as session:
        body = {"order_id": order.order_id, "items": reserved}
        async with session.post("/shipments", json=body, raise_for_status=True) as answer:
            tracking: str = (await answer.json())["tracking"]
            return tracking


@dbos.workflow()
async def checkout(order: Order) -> Receipt:
    reserved = await reserve_stock(order)
    charged = await charge_card(order)
    tracking = await ship(order, reserved)
    return Receipt(order_id=order.order_id, charged_cents=charged, tracking=tracking)


routes = web.RouteTableDef()


def checkout_json(workflow_id: str, receipt: Receipt) -> web.Response:
    return web.json_response({"workflow_id": workflow_id, "receipt": receipt.model_dump()})


@routes.post("/orders")
async def place_order(request: web.Request) -> web.Response:
    try:
        order = Order.model_validate_json(await request.read())
    except ValidationError as error:
        return problem_response(error)  # 422, as every error: application/problem+json
    # With an Idempotency-Key header, the key is this workflow's ID.
    with SetWorkflowAttributes({"customer": order.customer}):
        handle = await request.app[DBOS_KEY].start_workflow(checkout, order)
    return checkout_json(handle.workflow_id, await handle.get_result())


@routes.get("/orders/{workflow_id}")
async def get_order(request: web.Request) -> web.Response:
    workflow_id = request.match_info["workflow_id"]
    handle = await request.app[DBOS_KEY].retrieve_workflow(workflow_id)
    return checkout_json(workflow_id, await handle.get_result())


@routes.post("/orders/{workflow_id}/cancel")
async def cancel_order(request: web.Request) -> web.Response:
    executor = request.app[DBOS_KEY]
    workflow_id = request.match_info["workflow_id"]
    await executor.cancel_workflow(workflow_id)
    status = await (await executor.retrieve_workflow(workflow_id)).get_status()
    return web.json_response({"workflow_id": workflow_id, "status": status.status})


def create_app() -> web.Application:
    app = web.Application()
    setup(app, dbos, error_statuses={"PaymentDeclined": 402})
    app.add_routes(routes)
    app.add_routes(workflow_routes())
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--fd", type=int, help="serve on this listening socket instead")
    options = parser.parse_args()
    if options.fd is not None:
        web.run_app(create_app(), sock=socket.socket(fileno=options.fd))
    else:
        web.run_app(create_app(), host=options.host, port=options.port)


if __name__ == "__main__":
    main()
