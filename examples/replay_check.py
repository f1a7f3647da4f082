"""The replay check before a deploy: workflows recorded by one version of the code, checked
against the next one, as a CI job would before deploying it.

Version 1 ships an order with ``ship``; version 2 changes that to ``ship_fast``, first
without a patch (the check reports where it diverges), then behind ``dbos.patch`` (it
passes). Run it with DBOS_SYSTEM_DATABASE_URL set (without one, an embedded PostgreSQL under
./.dbos/); a second run checks the same recorded workflows again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from dbos_async import DBOS, DBOSClient, SetWorkflowID
from dbos_async.testing import replay_check


def application(version: str) -> tuple[DBOS, Callable[[str], Awaitable[str]]]:
    """The order application as ``version`` of its code has it, and its workflow."""
    dbos = DBOS(name="orders", application_version=version)

    @dbos.step(name="charge")
    async def charge(order_id: str) -> str:
        return f"receipt-{order_id}"

    @dbos.step(name="ship")
    async def ship(order_id: str) -> str:
        return f"parcel-{order_id}"

    @dbos.step(name="ship_fast")
    async def ship_fast(order_id: str) -> str:
        return f"express-{order_id}"

    @dbos.workflow(name="checkout")
    async def checkout(order_id: str) -> str:
        await charge(order_id)
        if version == "2-unpatched":
            return await ship_fast(order_id)
        if version == "2" and await dbos.patch("fast-shipping"):
            return await ship_fast(order_id)
        return await ship(order_id)

    return dbos, checkout


async def main() -> None:
    production, checkout = application("1")
    async with production:  # version 1 records two checkouts
        for order_id in ("order-1", "order-2"):
            with SetWorkflowID(order_id):
                await checkout(order_id)

        # CI, before deploying version 2: replay what production recorded (read-only).
        async with DBOSClient(production.system_database_url) as client:
            for version in ("2-unpatched", "2"):
                candidate, _ = application(version)
                results = await replay_check(candidate, client=client, name=["checkout"])
                for result in results:
                    print(version, result.summary())
                passed = sum(r.passed for r in results)
                print(f"version {version}: {passed} of {len(results)} workflows replay")


if __name__ == "__main__":
    asyncio.run(main())
