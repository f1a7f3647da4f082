"""A first durable workflow.

Run it twice. The first run executes the three steps and records each result; the second run
starts the same workflow ID, finds it finished, and returns the recorded result without
running a step again. Kill it mid-way (Ctrl-C or kill -9) and run it again: it resumes after
the last completed step.

With no DBOS_SYSTEM_DATABASE_URL set, it uses an embedded PostgreSQL kept under ./.dbos/.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel

import dbos_async
from dbos_async import DBOS, SetWorkflowID

dbos = DBOS(name="quickstart")


class Order(BaseModel):
    order_id: str
    items: list[str]
    total_cents: int


class Receipt(BaseModel):
    order_id: str
    charged_cents: int
    shipment: str


@dbos.step()
async def reserve_stock(order: Order) -> list[str]:
    print(f"  step 1: reserving {', '.join(order.items)}")
    return [f"{item}-reserved" for item in order.items]


@dbos.step(retries=3, retry_interval=0.1)
async def charge_card(order: Order) -> int:
    print(f"  step 2: charging {order.total_cents} cents")
    return order.total_cents


@dbos.step()
async def ship(order: Order, reserved: list[str]) -> str:
    print(f"  step 3: shipping {len(reserved)} items")
    return f"shipment-for-{order.order_id}"


@dbos.workflow()
async def checkout(order: Order) -> Receipt:
    reserved = await reserve_stock(order)
    charged = await charge_card(order)
    shipment = await ship(order, reserved)
    return Receipt(order_id=order.order_id, charged_cents=charged, shipment=shipment)


async def main() -> None:
    order = Order(order_id="order-1", items=["book", "lamp"], total_cents=4200)
    async with dbos:
        with SetWorkflowID("quickstart-order-1"):
            handle = await dbos.start_workflow(checkout, order)
        receipt = await handle.get_result()
        status = await handle.get_status()
        print(f"workflow {handle.workflow_id} is {status.status}: {receipt!r}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("dbos_async").setLevel(logging.INFO)
    dbos_async.run(main())  # uvloop when installed; DBOS_UVLOOP=0 turns it off
