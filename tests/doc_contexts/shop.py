"""The shop the guides' pieces of code run in (tests/test_docs.py): a block marked
``{test="in:shop"}`` takes the place of the last line, after these definitions."""

# Imported for the blocks, which use them without importing them.
import json  # noqa: F401
from decimal import Decimal  # noqa: F401
from typing import Any  # noqa: F401

from pydantic import BaseModel

from dbos_async import DBOS, SetEnqueueOptions, StepRetriesExceededError  # noqa: F401

dbos = DBOS(name="shop")
emails = dbos.queue("emails", concurrency=10)
reports = dbos.queue("reports")


class Order(BaseModel):
    order_id: str
    total_cents: int


class Payments:
    """Stands in for a payment API."""

    async def charge(self, cents: int, idempotency_key: str) -> int:
        return cents


payments = Payments()
order = Order(order_id="o-1", total_cents=4200)
order_ids = ["o-1", "o-2"]
batch_id = "b-1"
addresses = ["a@example.com", "b@example.com"]
request_id = "bad\x00id"


@dbos.step()
async def charge(order: Order) -> int:
    return order.total_cents


@dbos.step()
async def ship(order: Order) -> str:
    return f"shipment-{order.order_id}"


@dbos.workflow()
async def checkout(order: Order) -> str:
    await charge(order)
    return await ship(order)


@dbos.workflow()
async def process(order: Order) -> str:
    return order.order_id


@dbos.workflow()
async def send_email(to: str) -> str:
    return to


@dbos.workflow()
async def send_invoice(number: int) -> int:
    return number


@dbos.workflow()
async def report() -> str:
    return "report"


@dbos.workflow()
async def job(tenant: str) -> str:
    return tenant


...  # the block
