"""Messages, events, a queue and a durable sleep in one workflow.

The `fulfil` workflow publishes its status as an event, waits for an approval message, pays
through a rate-limited queue and sleeps durably before shipping. Run it twice: the second run
finds order-7 finished and prints the same result without charging again (the approval is
sent with an idempotency key, so it is delivered once).
"""

from __future__ import annotations

import logging

import dbos_async
from dbos_async import DBOS, SetWorkflowID

dbos = DBOS(name="order_pipeline")
payments = dbos.queue("payments", concurrency=2, limiter=(10, 1.0))


@dbos.step()
async def charge(order_id: str, cents: int) -> str:
    print(f"  charging {cents} cents for {order_id}")
    return f"receipt-{order_id}"


@dbos.workflow()
async def pay(order_id: str, cents: int) -> str:
    return await charge(order_id, cents)


@dbos.workflow()
async def fulfil(order_id: str) -> str:
    await dbos.set_event("status", "waiting for approval")
    approval = await dbos.recv("approval", timeout=30)
    if approval != "approved":
        await dbos.set_event("status", "rejected")
        return f"{order_id} rejected"
    payment = await payments.enqueue(pay, order_id, 4200)
    receipt = await payment.get_result()
    await dbos.set_event("status", "paid")
    await dbos.sleep(0.2)  # durable: a restart sleeps only what is left
    return f"{order_id} shipped with {receipt}"


async def main() -> None:
    async with dbos:
        with SetWorkflowID("order-7"):
            handle = await dbos.start_workflow(fulfil, "order-7")
        status = await dbos.get_event("order-7", "status", timeout=10)
        print(f"status of order-7: {status}")
        await dbos.send("order-7", "approved", topic="approval", idempotency_key="approve-7")
        print(await handle.get_result())


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    dbos_async.run(main())  # uvloop when installed; DBOS_UVLOOP=0 turns it off
