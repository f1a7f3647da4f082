"""Transactions: a step whose SQL commits together with its checkpoint, exactly once.

The order row and the stock update commit in the same transaction as the record of the
step, so a crash before the commit leaves neither and a crash after it leaves both: the
recovered workflow finds the record and never inserts the order twice. Run it twice: the
second run returns the recorded result and runs no SQL.

The application database is ``DBOS_APPLICATION_DATABASE_URL``, or else the system
database itself (the tables live in the schema ``shop``).
"""

from __future__ import annotations

import logging
import os

import asyncpg

import dbos_async
from dbos_async import DBOS, SetWorkflowID, transaction_connection

dbos = DBOS(name="transactions")
APP_URL = os.environ.get("DBOS_APPLICATION_DATABASE_URL") \
    or os.environ["DBOS_SYSTEM_DATABASE_URL"]
dbos.data_source("shop", APP_URL, schema="shop")


@dbos.transaction(data_source="shop", isolation="SERIALIZABLE")
async def place_order(order_id: str, item: str) -> int:
    """Insert the order and take one item from stock; returns the stock left."""
    print(f"  transaction: inserting {order_id}")
    conn = transaction_connection()
    await conn.execute("INSERT INTO shop.orders (id, item) VALUES ($1, $2)", order_id, item)
    left = await conn.fetchval(
        "UPDATE shop.stock SET count = count - 1 WHERE item = $1 RETURNING count", item)
    return int(left)


@dbos.transaction(data_source="shop", read_only=True)
async def count_orders() -> int:
    return int(await transaction_connection().fetchval("SELECT count(*) FROM shop.orders"))


@dbos.step()
async def confirm(order_id: str, left: int) -> str:
    print(f"  step: confirming {order_id} ({left} left)")
    return f"{order_id} confirmed"


@dbos.workflow()
async def order(order_id: str, item: str) -> str:
    left = await place_order(order_id, item)
    orders = await count_orders()
    return f"{await confirm(order_id, left)}, {orders} order(s) in all"


async def create_tables() -> None:
    conn = await asyncpg.connect(APP_URL)
    try:
        await conn.execute("""
            CREATE SCHEMA IF NOT EXISTS shop;
            CREATE TABLE IF NOT EXISTS shop.orders (id text PRIMARY KEY, item text NOT NULL);
            CREATE TABLE IF NOT EXISTS shop.stock (item text PRIMARY KEY, count int NOT NULL);
            INSERT INTO shop.stock VALUES ('lamp', 10) ON CONFLICT DO NOTHING""")
    finally:
        await conn.close()


async def main() -> None:
    await create_tables()
    async with dbos:
        with SetWorkflowID("transactions-order-1"):
            print(await order("order-1", "lamp"))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    dbos_async.run(main())
