"""Workflows enqueued by other DBOS SDKs, their rows written exactly as those SDKs write
them, run by this executor.

DBOS's TypeScript client (``@dbos-inc/dbos-sdk`` 5.x, ``DBOSClient.enqueuePortable``)
records "nobody" as ``authenticated_user = ''``, ``assumed_role = ''`` and
``authenticated_roles = '[]'``, ``executor_id = ''`` and ``application_id = ''``, NULL
class and instance names, the inputs in ``workflow_input`` only and without ``namedArgs``
when none are given (its ``insertWorkflowStatus``, reproduced below column for column; on
a sharded schema with the shard key first, as its sharded version writes). The ``dbos``
package's client (run in a subprocess) writes NULLs instead. Both read as "none" here; a
row this executor cannot run (a format it does not read, a malformed column) ends in a
recorded error naming the column, and the claim loop goes on with the next row.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import uuid
from typing import Any

import asyncpg
import pytest
from helpers import new_dbos

from dbos_async import DBOS, DBOSError, current_authentication

PATIENCE = 60.0
QUEUE = "foreign"

TS_COLUMNS = (
    "workflow_uuid", "status", "name", "class_name", "config_name", "queue_name",
    "authenticated_user", "assumed_role", "authenticated_roles", "executor_id",
    "application_version", "application_id", "recovery_attempts", "workflow_timeout_ms",
    "workflow_deadline_epoch_ms", "inputs", "deduplication_id", "priority",
    "queue_partition_key", "forked_from", "parent_workflow_id", "serialization",
    "creator_xid", "delay_until_epoch_ms", "attributes", "schedule_name",
    "debounce_deadline_epoch_ms", "is_debounced", "application_name", "owner_xid",
)


async def ts_enqueue(conn: asyncpg.Connection, workflow_id: str, name: str,
                     positional: list[Any], *, sharded: bool, **options: Any) -> None:
    """What ``DBOSClient.enqueuePortable({workflowName, queueName, workflowID, ...},
    positional)`` writes: ``buildEnqueueStatus``'s row through ``insertWorkflowStatus``,
    then the inputs into ``workflow_input``. ``options`` override a column or the inputs'
    text (``inputs``)."""
    inputs = options.pop("inputs", json.dumps({"positionalArgs": positional}))
    row: dict[str, Any] = {
        "workflow_uuid": workflow_id, "status": "ENQUEUED", "name": name,
        "class_name": None, "config_name": None, "queue_name": QUEUE,
        "authenticated_user": "", "assumed_role": "", "authenticated_roles": "[]",
        "executor_id": "", "application_version": None, "application_id": "",
        "recovery_attempts": 0, "workflow_timeout_ms": None,
        "workflow_deadline_epoch_ms": None, "inputs": None, "deduplication_id": None,
        "priority": 0, "queue_partition_key": None, "forked_from": None,
        "parent_workflow_id": None, "serialization": "portable_json",
        "creator_xid": str(uuid.uuid4()), "delay_until_epoch_ms": None, "attributes": None,
        "schedule_name": None, "debounce_deadline_epoch_ms": None, "is_debounced": False,
        "application_name": None, "owner_xid": None, **options,
    }
    key = ["acme"] if sharded else []
    key_column = "shard_key, " if sharded else ""
    values = [row[c] for c in TS_COLUMNS]
    params = ", ".join(f"${i}" for i in range(1, len(key) + len(values) + 1))
    async with conn.transaction():
        await conn.execute(
            f"INSERT INTO dbos.workflow_status ({key_column}{', '.join(TS_COLUMNS)}) "
            f"VALUES ({params}) ON CONFLICT DO NOTHING", *key, *values)
        await conn.execute(
            f"INSERT INTO dbos.workflow_input ({key_column}workflow_uuid, inputs) "
            f"VALUES ({', '.join(f'${i}' for i in range(1, len(key) + 3))}) "
            "ON CONFLICT DO NOTHING", *key, workflow_id, inputs)


@pytest.fixture(params=["unsharded", "sharded",
                        pytest.param("citus", marks=pytest.mark.citus)])
def schema(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """(URL of a fresh database, whether its system schema is sharded)."""
    if request.param == "citus":
        return request.getfixturevalue("citus_url"), True
    return request.getfixturevalue("plain_database_url"), request.param == "sharded"


class App:
    """An executor with a greeting workflow that notes who it runs for, and one that only
    an admin may run."""

    def __init__(self, url: str, sharded: bool) -> None:
        self.dbos: DBOS = new_dbos(url, sharding=sharded)
        self.dbos.queue(QUEUE, polling_interval=0.1)
        self.key = "acme" if sharded else None
        self.identities: dict[str, list[Any]] = {}

        @self.dbos.workflow(name="greet")
        async def greet(who: str, punctuation: str = "!") -> str:
            identity = current_authentication()
            self.identities[who] = [identity.user, identity.roles, identity.assumed_role]
            return f"hello {who}{punctuation}"

        @self.dbos.workflow(name="guarded", required_roles=["admin"])
        async def guarded(who: str) -> str:
            return f"{who} as {current_authentication().assumed_role}"

    async def result(self, workflow_id: str) -> Any:
        handle = await self.dbos.retrieve_workflow(workflow_id, shard_key=self.key)
        return await asyncio.wait_for(handle.get_result(), PATIENCE)


async def test_typescript_rows_run_here(schema: tuple[str, bool]) -> None:
    url, sharded = schema
    app = App(url, sharded)
    async with app.dbos as dbos:
        conn = await asyncpg.connect(url)
        try:
            await ts_enqueue(conn, "ts-nobody", "greet", ["nobody"], sharded=sharded)
            await ts_enqueue(conn, "ts-named", "greet", [], sharded=sharded,
                             inputs=json.dumps({"positionalArgs": ["named"],
                                                "namedArgs": {"punctuation": "?"}}))
            await ts_enqueue(conn, "ts-admin", "guarded", ["alice"], sharded=sharded,
                             authenticated_user="alice",
                             authenticated_roles=json.dumps(["reader", "admin"]))
            await ts_enqueue(conn, "ts-anonymous", "guarded", ["mallory"], sharded=sharded)
        finally:
            await conn.close()
        assert await app.result("ts-nobody") == "hello nobody!"
        assert await app.result("ts-named") == "hello named?"
        assert await app.result("ts-admin") == "alice as admin"
        # Nobody is nobody, not an invalid user: refused for lacking the role.
        with pytest.raises(DBOSError, match=r"requires one of the roles \['admin'\], but was "
                           "called by a caller without authentication"):
            await app.result("ts-anonymous")
        assert app.identities["nobody"] == [None, None, None]
        status = await dbos.get_workflow_status("ts-nobody", shard_key=app.key)
        assert status is not None and status.status == "SUCCESS"
        assert (status.authenticated_user, status.authenticated_roles, status.assumed_role,
                status.class_name, status.config_name) == (None, None, None, None, None)
        assert status.executor_id == app.dbos.executor_id
        refused = await dbos.get_workflow_status("ts-anonymous", shard_key=app.key)
        assert refused is not None and refused.status == "ERROR"
        assert refused.authenticated_user is None


async def test_rows_this_executor_cannot_run_end_in_an_error_naming_the_column(
        schema: tuple[str, bool]) -> None:
    url, sharded = schema
    app = App(url, sharded)
    conn = await asyncpg.connect(url)
    try:
        async with app.dbos:
            # Its default client format (enqueue, not enqueuePortable): SuperJSON.
            await ts_enqueue(conn, "ts-superjson", "greet", [], sharded=sharded,
                             serialization="js_superjson",
                             inputs=json.dumps({"json": ["x"],
                                                "__dbos_serializer": "superjson"}))
            await ts_enqueue(conn, "ts-bad-roles", "greet", ["x"], sharded=sharded,
                             authenticated_roles="admin")
            await ts_enqueue(conn, "ts-no-inputs", "greet", [], sharded=sharded,
                             inputs=None)
            await ts_enqueue(conn, "ts-after", "greet", ["after"], sharded=sharded)
            with pytest.raises(DBOSError, match="serialization 'js_superjson'"):
                await app.result("ts-superjson")
            with pytest.raises(DBOSError, match=r"Column authenticated_roles \('admin'\)"):
                await app.result("ts-bad-roles")
            with pytest.raises(DBOSError, match="inputs"):
                await app.result("ts-no-inputs")
            # The claim loop went on.
            assert await app.result("ts-after") == "hello after!"
        statuses = dict(await conn.fetch(
            "SELECT workflow_uuid, status FROM dbos.workflow_status ORDER BY 1"))
    finally:
        await conn.close()
    assert statuses == {"ts-after": "SUCCESS", "ts-bad-roles": "ERROR",
                        "ts-no-inputs": "ERROR", "ts-superjson": "ERROR"}


_DBOS_CLIENT_SCRIPT = textwrap.dedent(
    """
    import sys
    from dbos import DBOSClient, WorkflowSerializationFormat

    PORTABLE = WorkflowSerializationFormat.PORTABLE
    client = DBOSClient(system_database_url=sys.argv[1])
    try:
        for workflow_id, name, who, user, roles in [
                ("py-admin", "guarded", "alice", "alice", ["admin"]),
                ("py-nobody", "greet", "nobody", None, None),
                ("py-empty", "greet", "empty", "", [])]:
            options = {"workflow_name": name, "queue_name": "foreign",
                       "workflow_id": workflow_id, "serialization_type": PORTABLE}
            if user is not None:
                options["authenticated_user"] = user
            if roles is not None:
                options["authenticated_roles"] = roles
            client.enqueue(options, who)
    finally:
        client.destroy()
    """
)


async def test_rows_of_the_dbos_packages_client_run_here(database_url: str) -> None:
    app = App(database_url, False)
    async with app.dbos:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _DBOS_CLIENT_SCRIPT, database_url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
        assert proc.returncode == 0, f"{out.decode()}\n{err.decode()}"
        assert await app.result("py-admin") == "alice as admin"
        assert await app.result("py-nobody") == "hello nobody!"
        assert await app.result("py-empty") == "hello empty!"
    assert app.identities == {"nobody": [None, None, None], "empty": [None, None, None]}
