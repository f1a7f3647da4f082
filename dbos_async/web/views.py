"""The read-only workflow routes, as JSON: a page of workflows, one workflow, its steps.

Each framework's routes only hand their query parameters (name and value pairs, repeated
names for lists) and path to these functions and send back what they return.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any

from pydantic_core import to_jsonable_python

from dbos_async.errors import DBOSError, InvalidRequestError, NonExistentWorkflowError
from dbos_async.executor.handles import WorkflowStatus
from dbos_async.executor.management.control import WorkflowStepInfo, epoch_ms
from dbos_async.executor.operator import Operator
from dbos_async.statuses import WorkflowStatusString
from dbos_async.web.problems import error_type_and_message

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000

# list_workflows filters that take one value or several (the parameter repeated).
LIST_FILTERS = frozenset({
    "workflow_ids", "status", "name", "queue_name", "parent_workflow_id", "forked_from",
    "executor_id", "application_version", "authenticated_user", "workflow_id_prefix",
    "application_name", "shard_key", "parent_shard_key", "schedule_name",
})
FLAGS = frozenset({"sort_desc", "load_input", "load_output", "was_forked_from", "is_fork",
                   "has_parent"})
TIME_BOUNDS = frozenset({"start_time", "end_time", "completed_after", "completed_before",
                         "dequeued_after", "dequeued_before"})
SINGLE = TIME_BOUNDS | {"attributes", "limit", "offset"}
LIST_PARAMETERS = LIST_FILTERS | FLAGS | SINGLE
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
    filters = listing_filters(query)
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


def listing_filters(query: Query) -> dict[str, Any]:
    """The keyword arguments of ``list_workflows`` these query parameters ask for; an
    unknown or malformed parameter raises :class:`InvalidRequestError` naming it."""
    filters: dict[str, Any] = {}
    for name, values in _collect(query, LIST_PARAMETERS).items():
        if name in LIST_FILTERS:
            filters[name] = query_statuses(values) if name == "status" else values
            continue
        if len(values) > 1:
            raise InvalidRequestError(f"Query parameter {name!r} may be given once")
        filters[name] = _PARSERS[name](name, values[0])
    return filters


def query_statuses(values: Iterable[str]) -> list[str]:
    """Workflow statuses named in a query (any case; empty values skipped); one that is not
    a :class:`~dbos_async.WorkflowStatusString` raises :class:`InvalidRequestError` naming it
    and the choices. What the web routes and the console filter listings by."""
    chosen = [value.upper() for value in values if value]
    for status in chosen:
        if status not in WorkflowStatusString.__members__:
            raise InvalidRequestError(f"Unknown status {status!r}: choose from "
                                      f"{', '.join(WorkflowStatusString)}")
    return chosen


def query_flag(name: str, value: str) -> bool:
    """A yes-or-no query parameter; anything but true or false raises
    :class:`InvalidRequestError` naming it."""
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise InvalidRequestError(f"Query parameter {name!r} must be true or false, got {value!r}")


def _count(name: str, value: str, low: int, high: int | None) -> int:
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if number < low or (high is not None and number > high):
        upper = f" to {high}" if high is not None else " or more"
        raise InvalidRequestError(
            f"Query parameter {name!r} must be an integer from {low}{upper}, got {value!r}")
    return number


def _limit(name: str, value: str) -> int:
    return _count(name, value, 1, MAX_LIMIT)


def _offset(name: str, value: str) -> int:
    return _count(name, value, 0, None)


def _bound(name: str, value: str) -> int:
    """A time bound, in epoch milliseconds: given as such, or as ISO 8601."""
    try:
        bound = epoch_ms(int(value) if value.isdigit() else value, f"Query parameter {name!r}")
    except DBOSError as error:
        raise InvalidRequestError(str(error)) from None
    assert bound is not None
    return bound


def _attributes(name: str, value: str) -> dict[str, Any]:
    try:
        attributes = json.loads(value)
    except ValueError:
        attributes = None
    if not isinstance(attributes, dict):
        raise InvalidRequestError(
            f"Query parameter {name!r} must be a JSON object, got {value!r}")
    return attributes


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    **dict.fromkeys(FLAGS, query_flag), **dict.fromkeys(TIME_BOUNDS, _bound),
    "limit": _limit, "offset": _offset, "attributes": _attributes,
}
