"""The replay check before a deploy: the recorded workflows of a database or an export
file, replayed against the application's code as it is now (see
:meth:`dbos_async.DBOS.replay_workflows`), for a test or for ``dbos-async replay``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dbos_async._executor.dbos import DBOS
from dbos_async._executor.replay import ReplayResult
from dbos_async._executor.transfer import ExportedWorkflow
from dbos_async.client import DBOSClient
from dbos_async.errors import DBOSError


async def replay_check(dbos: DBOS, *, client: DBOSClient | None = None,
                       path: str | Path | None = None, time_limit: float = 10.0,
                       **filters: Any) -> list[ReplayResult]:
    """Replay recorded workflows against ``dbos``'s registered code, writing nothing.

    Args:
        dbos: the application as it is now (it need not be entered).
        client: read the workflows from this client's system database, those the
            ``list_workflows`` ``filters`` select (all of them without any), in one
            read-only snapshot; the outcomes of their children come from there too.
        path: or read them from a file of JSON lines written by ``export_workflows`` /
            ``dbos-async export`` (every workflow in it; no filters).
        time_limit: seconds each workflow body gets.
        filters: ``list_workflows`` filters (``status``, ``name``, ``workflow_ids``, ...).

    Returns:
        One :class:`~dbos_async._executor.replay.ReplayResult` per workflow; a check
        passes when every one has ``passed``.

    Raises:
        DBOSError: not exactly one of ``client`` and ``path``, or filters with a file.
        WorkflowImportError: a line of the file is not an exported workflow.
    """
    if (client is None) == (path is None):
        raise DBOSError("replay_check reads workflows from a client or a file: give one")
    if path is not None:
        if filters:
            raise DBOSError("replay_check takes no filters with a file: export the "
                            "workflows to check instead")
        workflows = read_export(path)
        return await dbos.replay_workflows(workflows, time_limit=time_limit)
    assert client is not None
    workflows = [w async for w in client.export_workflows(**filters)]
    return await dbos.replay_workflows(workflows, children=await _children(client, workflows),
                                       time_limit=time_limit)


def read_export(path: str | Path) -> list[ExportedWorkflow]:
    """The workflows of an export file (blank lines skipped)."""
    with open(path, encoding="utf-8") as lines:
        return [ExportedWorkflow.from_json(line, number)
                for number, line in enumerate(lines, start=1) if line.strip()]


async def _children(client: DBOSClient,
                    workflows: Iterable[ExportedWorkflow]) -> list[ExportedWorkflow]:
    """The recorded children of ``workflows`` not among them, for their outcomes."""
    listed = {w.workflow_id for w in workflows}
    wanted = sorted({row["child_workflow_id"] for w in workflows
                     for row in w.tables["operation_outputs"]
                     if row["child_workflow_id"] is not None} - listed)
    if not wanted:
        return []
    return [w async for w in client.export_workflows(workflow_ids=wanted)]
