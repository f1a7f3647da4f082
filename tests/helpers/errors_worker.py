"""A process that reads recorded workflow failures, for the recorded-error tests.

usage: python errors_worker.py URL [--import-user-errors] WORKFLOW_ID...

Prints, per workflow ID, one line of JSON: :func:`describe` of the error its handle's
``get_result()`` raises, read with a :class:`~dbos_async.DBOSClient`. With
``--import-user-errors`` the process has imported the module defining the application's
exception first (as a process running that application's code has); without, it has not.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from dbos_async import DBOSClient


def describe(error: BaseException) -> dict[str, Any]:
    """What a caller can tell of an exception: its classes, its text and its fields."""
    fields: dict[str, Any] = {}
    for key, value in vars(error).items():
        if isinstance(value, list) and all(isinstance(v, BaseException) for v in value):
            fields[key] = [describe(v) for v in value]
        elif isinstance(value, str | int | float | bool | dict | None):
            fields[key] = value
    return {
        "classes": [f"{c.__module__}.{c.__qualname__}" for c in type(error).__mro__],
        "str": str(error),
        "repr": repr(error),
        "fields": fields,
    }


async def read_failures(url: str, workflow_ids: list[str]) -> None:
    async with DBOSClient(system_database_url=url, result_poll_interval=0.05) as client:
        for workflow_id in workflow_ids:
            handle = await client.retrieve_workflow(workflow_id)
            try:
                await handle.get_result()
            except Exception as error:
                print(json.dumps(describe(error)), flush=True)
            else:
                print(json.dumps(None), flush=True)


def main() -> None:
    url, *rest = sys.argv[1:]
    if "--import-user-errors" in rest:
        rest.remove("--import-user-errors")
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        import helpers.user_errors  # noqa: F401 (what matters is that it is imported)
    asyncio.run(read_failures(url, rest))


if __name__ == "__main__":
    main()
