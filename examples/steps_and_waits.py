"""An undecorated function as a step, a durable race between two workflows, one stream
value read by its offset, and a message that also reaches a workflow's forks.

`best_offer` asks two suppliers (child workflows) for a quote and takes whichever answers
first: `wait_first` is a checkpoint, so a replay takes the same one. Run it twice: the
second run finds offers-1 finished and prints the same line without asking again.
"""

from __future__ import annotations

import logging

import dbos_async
from dbos_async import DBOS, SetWorkflowID, StepOptions

dbos = DBOS(name="steps_and_waits")


def fee_cents(cents: int) -> int:
    """A plain function, run as a step by `run_step` below."""
    return cents // 10


@dbos.workflow()
async def quote(supplier: str, cents: int) -> str:
    await dbos.write_stream("log", f"{supplier} asked")
    await dbos.recv("go", timeout=30)
    return f"{supplier}:{cents}"


@dbos.workflow()
async def best_offer() -> str:
    acme = await dbos.start_workflow(quote, "acme", 120)
    globex = await dbos.start_workflow(quote, "globex", 95)
    await dbos.set_event("suppliers", [acme.workflow_id, globex.workflow_id])
    first = await dbos.wait_first([acme, globex])  # the same one on every replay
    other = acme if first is globex else globex
    fee = await dbos.run_step(StepOptions(name="fee"), fee_cents, 95)
    asked = await dbos.read_stream_offset(first.workflow_id, "log", 0)
    # Release the slower supplier, and any fork an operator made of it.
    await dbos.send(other.workflow_id, "go", "go", send_to_forks=True)
    return f"{await first.get_result()} came first ({asked}), fee {fee}"


async def main() -> None:
    async with dbos:
        with SetWorkflowID("offers-1"):
            handle = await dbos.start_workflow(best_offer)
        suppliers = await dbos.get_event("offers-1", "suppliers", timeout=10)
        await dbos.send(suppliers[1], "go", "go")  # globex answers
        print(await handle.get_result())


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    dbos_async.run(main())
