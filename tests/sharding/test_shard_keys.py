"""Shard-key bindings are refused by the unsharded system database, never silently ignored."""

from __future__ import annotations

import pytest

from dbos_async import DBOSError, SetWorkflowID
from dbos_async._sysdb.shard_keys import bind_shard_keys, shard_key_scope
from tests.helpers import new_dbos


async def test_unsharded_database_refuses_shard_keys(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.workflow()
    async def hello(name: str) -> str:
        return f"hello {name}"

    async with dbos:
        with bind_shard_keys({"tenant-wf": "tenant-a"}), SetWorkflowID("tenant-wf"), \
                pytest.raises(DBOSError, match="not sharded"):
            await hello("a")
        with shard_key_scope("tenant-a"), pytest.raises(DBOSError, match="not sharded"):
            await dbos.list_workflows()
        # Outside those blocks the same calls work, and nothing was written by the refused one.
        assert await dbos.get_workflow_status("tenant-wf") is None
        with SetWorkflowID("tenant-wf"):
            assert await hello("b") == "hello b"
        assert [w.workflow_id for w in await dbos.list_workflows()] == ["tenant-wf"]
