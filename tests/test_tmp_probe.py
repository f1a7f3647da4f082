import asyncio
from helpers import new_dbos, execute, fetch, step_rows
from dbos_async import SetWorkflowID, transaction_connection

async def test_probe(database_url, create_database):
    app_url = await create_database()
    name = app_url.rsplit("/", 1)[1]
    await execute(app_url, "CREATE TABLE orders (id text PRIMARY KEY, amount int)")
    dbos = new_dbos(database_url, db_retry_timeout=2.0)
    dbos.data_source("shop", app_url)
    @dbos.transaction(data_source="shop", name="ins")
    async def ins(label: str) -> str:
        await transaction_connection().execute("INSERT INTO orders VALUES ($1, 1)", label)
        return label
    @dbos.workflow(name="w")
    async def w(label: str) -> str:
        return await ins(label)
    async with dbos:
        await execute(database_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        await execute(database_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
        try:
            with SetWorkflowID("x"):
                await w("a")
        except BaseException as e:
            print("RAISED", type(e).__module__, type(e).__name__, str(e)[:300])
        print("STEPS", await step_rows(database_url, "x"))
        await execute(database_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
