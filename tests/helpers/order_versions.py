"""One ``order`` workflow as successive versions of an application's code have it, for the
replay check's tests (in process, and as the application a ``dbos-async replay`` loads:
``python -c`` / the console script import this module with ``ORDER_URL``,
``ORDER_VARIANT`` and ``ORDER_VERSION`` set, see :data:`dbos`)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dbos_async import DBOS

from . import new_dbos

VARIANTS = ("recorded", "same", "reordered", "renamed", "patched", "unpatched",
            "added_after_last", "fewer_calls")


@dataclass
class App:
    dbos: DBOS
    order: Callable[[int, bool], Awaitable[int]]
    ran: Counter[str]  # step bodies run, by name


def app(url: str, variant: str, **settings: Any) -> App:
    """The order workflow as the version ``variant`` of the code has it: reserve, charge,
    an event, a child, a durable sleep, (when asked) a message, ship."""
    assert variant in VARIANTS, variant
    dbos = new_dbos(url, shutdown_grace_period=0.0, **settings)
    ran: Counter[str] = Counter()

    def step(name: str) -> Callable[[int], Awaitable[int]]:
        @dbos.step(name=name)
        async def body(x: int) -> int:
            ran[name] += 1
            return x + 1

        return body

    reserve, charge, ship, ship_v2, audit = (
        step(n) for n in ("reserve", "charge", "ship", "ship_v2", "audit"))

    @dbos.workflow(name="child")
    async def child(x: int) -> int:
        return x * 2

    @dbos.workflow(name="order")
    async def order(x: int, wait: bool) -> int:
        if variant == "reordered":
            x = await reserve(await charge(x))
        else:
            x = await reserve(x)
            x = await charge(x)
        await dbos.set_event("charged", x)
        x = await child(x)
        await dbos.sleep(0.01)
        if variant == "added_after_last":
            x = await audit(x)
        if wait:
            reply = await dbos.recv("go", timeout=None)
            x += int(reply)
        if variant in ("renamed", "unpatched"):
            x = await ship_v2(x)
        elif variant == "patched":
            x = await (ship_v2(x) if await dbos.patch("new-shipper") else ship(x))
        elif variant != "fewer_calls":
            x = await ship(x)
        return x

    return App(dbos, order, ran)


if "ORDER_VARIANT" in os.environ:
    dbos = app(os.environ["ORDER_URL"], os.environ["ORDER_VARIANT"],
               application_version=os.environ["ORDER_VERSION"]).dbos
