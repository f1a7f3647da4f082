"""The read-only workflow routes, as JSON: a page of workflows, one workflow, its steps.

Each framework's routes only hand their query parameters (name and value pairs, repeated
names for lists) and path to these functions and send back what they return. A listing's
parameters are read by :mod:`dbos_async._web.filters`, the parser the command line and the
console use too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from pydantic_core import to_jsonable_python

from dbos_async._executor.handles import WorkflowStatus
from dbos_async._executor.management.control import WorkflowStepInfo
from dbos_async._executor.operator import Operator
from dbos_async._web.filters import listing_filters
from dbos_async._web.problems import error_type_and_message
from dbos_async.errors import InvalidRequestError, NonExistentWorkflowError

DEFAULT_LIMIT = 100

ONE_PARAMETERS = frozenset({"shard_key"})

Query = Iterable[tuple[str, str]]


def jsonable(value: Any) -> Any:
    """A recorded value (a model, a datetime, ...) as plain JSON."""
    return to_jsonable_python(value, fallback=repr)


def error_json(error: BaseException | None) -> dict[str, str] | None:
    if error is None:
        return None
    name, message = error_type_and_message(error)
    return {"type": name, "message": message}


def status_json(status: WorkflowStatus) -> dict[str, Any]:
    """A workflow's status as JSON: its row's fields, with input, output and error (when
    loaded) as plain JSON."""
    body = {f.name: getattr(status, f.name) for f in dataclasses.fields(status)}
    inputs = status.input
    body["input"] = (None if inputs is None else
                     {"args": jsonable(inputs.args), "kwargs": jsonable(inputs.kwargs)})
    body["output"] = jsonable(status.output)
    body["error"] = error_json(status.error)
    return body


def step_json(step: WorkflowStepInfo) -> dict[str, Any]:
    body = {f.name: getattr(step, f.name) for f in dataclasses.fields(step)}
    body["output"] = jsonable(step.output)
    body["error"] = error_json(step.error)
    return body


async def workflow_page(operator: Operator, query: Query) -> dict[str, Any]:
    """``GET /workflows``: a page of ``list_workflows`` for these query parameters, with
    the offset of the next page (None once a page comes back short)."""
    filters = listing_filters(query, paging=True)
    filters.setdefault("limit", DEFAULT_LIMIT)
    filters.setdefault("offset", 0)
    filters.setdefault("load_input", False)
    filters.setdefault("load_output", False)
    workflows = await operator.list_workflows(**filters)
    full = len(workflows) == filters["limit"]
    return {
        "workflows": [status_json(w) for w in workflows],
        "offset": filters["offset"],
        "limit": filters["limit"],
        "next_offset": filters["offset"] + len(workflows) if full else None,
    }


async def workflow_detail(operator: Operator, workflow_id: str, query: Query) -> dict[str, Any]:
    """``GET /workflows/{id}``: its status with input, output and error."""
    shard_key = _single_key(query)
    found = await operator.list_workflows(
        workflow_ids=[workflow_id], shard_key=shard_key)
    if not found:
        raise NonExistentWorkflowError(workflow_id)
    return status_json(found[0])


async def workflow_steps(operator: Operator, workflow_id: str,
                         query: Query) -> list[dict[str, Any]]:
    """``GET /workflows/{id}/steps``: its recorded steps, by position."""
    steps = await operator.list_workflow_steps(workflow_id, shard_key=_single_key(query))
    return [step_json(s) for s in steps]


def _single_key(query: Query) -> str | None:
    values = _collect(query, ONE_PARAMETERS)
    keys = values.get("shard_key", [])
    if len(keys) > 1:
        raise InvalidRequestError("Query parameter 'shard_key' may be given once")
    return keys[0] if keys else None


def _collect(query: Query, known: frozenset[str]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for name, value in query:
        if name not in known:
            raise InvalidRequestError(
                f"Unknown query parameter {name!r}; known: {', '.join(sorted(known))}")
        values.setdefault(name, []).append(value)
    return values
