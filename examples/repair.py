"""Repairing a failed workflow: find it, fork it from its last failure, list the forks.

`checkout` reserves stock, then charges a card; the card is declined, so order-9 fails in
its "charge" step. Once the card is fixed, a fork from the last failure runs "charge" (and
what follows) again while "reserve" replays from order-9's checkpoint: stock is reserved
once. Run it twice: the second run finds both workflows recorded and prints the same.
"""

from __future__ import annotations

import logging

import dbos_async
from dbos_async import DBOS, SetWorkflowID, StartPoint

dbos = DBOS(name="repair")
card_fixed = False


@dbos.step()
async def reserve(order_id: str) -> str:
    print(f"  reserving stock for {order_id}")
    return f"reserved {order_id}"


@dbos.step()
async def charge(order_id: str) -> str:
    if not card_fixed:
        raise RuntimeError("card declined")
    print(f"  charging {order_id}")
    return f"charged {order_id}"


@dbos.workflow()
async def checkout(order_id: str) -> str:
    reserved = await reserve(order_id)
    return f"{reserved}, {await charge(order_id)}"


async def main() -> None:
    global card_fixed
    async with dbos:
        with SetWorkflowID("order-9"):
            handle = await dbos.start_workflow(checkout, "order-9")
        try:
            await handle.get_result()
        except RuntimeError as error:
            print(f"order-9 failed: {error}")
        # The failed workflows that are not forks, and have not been forked yet.
        failed = await dbos.list_workflows(status="ERROR", is_fork=False,
                                           was_forked_from=False, load_output=False)
        card_fixed = True
        for status in failed:
            with SetWorkflowID(f"{status.workflow_id}-retry"):
                await dbos.fork_workflow(status.workflow_id, StartPoint.LAST_FAILURE)
        for fork in await dbos.list_workflows(is_fork=True):
            result = await (await dbos.retrieve_workflow(fork.workflow_id)).get_result()
            print(f"{fork.workflow_id} (forked from {fork.forked_from}): {result}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    dbos_async.run(main())  # uvloop when installed; DBOS_UVLOOP=0 turns it off
