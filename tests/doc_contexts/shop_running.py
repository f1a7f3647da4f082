"""The shop of shop.py, entered: a block marked ``{test="in:shop_running"}`` runs inside
``async with dbos:``, with a waiting workflow "report-42" on the reports queue and the
workflows of the orders in ``order_ids``."""

import asyncio

from shop import *  # noqa: F403

import dbos_async


async def main() -> None:
    async with dbos:  # noqa: F405
        with dbos_async.SetWorkflowID("report-42"), dbos_async.SetEnqueueOptions(delay=3600):
            await reports.enqueue(report)  # noqa: F405
        for order_id in order_ids:  # noqa: F405
            with dbos_async.SetWorkflowID(order_id):
                await process(Order(order_id=order_id, total_cents=100))  # noqa: F405
        ...  # the block

asyncio.run(main())
