"""Errors as HTTP problem details (RFC 9457, ``application/problem+json``).

One table says which status each of our errors answers with; the body names the error's
type and message the same way whether the error was raised now or read back from the
system database (a ``RecordedError`` carries the type name it was recorded under), so a
retried request gets the body its first attempt got. The errors of the web framework itself
(a request that fails validation, a ``404`` route, an ``HTTPException``) are answered in
the same format, so that an application answers every error one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pydantic import ValidationError

from dbos_async.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    IdempotencyKeyConflictError,
    InvalidArgumentError,
    InvalidRequestError,
    NonExistentWorkflowError,
    NotAuthorizedError,
    QueueDeduplicatedError,
    RecordedError,
    WorkflowCancelledError,
    WorkflowStateError,
)

PROBLEM_CONTENT_TYPE = "application/problem+json"

# Checked in order, by isinstance: a recorded error that is also one of these (a replayed
# deduplication, say) answers as it did when it was raised.
STATUS_BY_TYPE: tuple[tuple[type[BaseException], HTTPStatus], ...] = (
    (NonExistentWorkflowError, HTTPStatus.NOT_FOUND),
    (WorkflowCancelledError, HTTPStatus.NOT_FOUND),
    (QueueDeduplicatedError, HTTPStatus.CONFLICT),
    (WorkflowStateError, HTTPStatus.CONFLICT),
    (NotAuthorizedError, HTTPStatus.FORBIDDEN),
    (IdempotencyKeyConflictError, HTTPStatus.CONFLICT),
    (InvalidRequestError, HTTPStatus.BAD_REQUEST),
    (InvalidArgumentError, HTTPStatus.BAD_REQUEST),
    (DatabaseUnavailableError, HTTPStatus.SERVICE_UNAVAILABLE),
)


@dataclass(frozen=True)
class Problem:
    """An HTTP status and its problem-details body."""

    status: int
    body: dict[str, Any]


def checked_statuses(statuses: Mapping[str, int] | None) -> dict[str, int]:
    """Check an ``error_statuses`` mapping once, where an integration is set up: error type
    names to HTTP error statuses (400 to 599)."""
    checked: dict[str, int] = {}
    for name, status in (statuses or {}).items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"error_statuses keys must be error type names, got {name!r}")
        if (isinstance(status, bool) or not isinstance(status, int)
                or status not in HTTPStatus._value2member_map_ or not 400 <= status <= 599):
            raise ConfigurationError(
                f"error_statuses[{name!r}] must be an HTTP error status (400 to 599), "
                f"got {status!r}")
        checked[name] = status
    return checked


def error_type_and_message(error: BaseException) -> tuple[str, str]:
    """The error's type name and message: the recorded ones for a ``RecordedError``."""
    if isinstance(error, RecordedError):
        return error.name, error.message
    return type(error).__name__, str(error)


def problem_for(error: BaseException, statuses: Mapping[str, int] | None = None) -> Problem:
    """The problem answering ``error``. ``statuses`` (checked by :func:`checked_statuses`)
    maps error type names, as recorded (``"PaymentDeclined"``), to statuses over the
    built-in table; anything else is 500. A pydantic ``ValidationError`` (a handler
    validating its request) is a 422 listing the errors, as the framework's own validation
    answers."""
    if isinstance(error, ValidationError):
        return validation_problem(error.errors(include_url=False, include_context=False,
                                               include_input=False))
    name, message = error_type_and_message(error)
    status = (statuses or {}).get(name)
    if status is None:
        status = next((code for kind, code in STATUS_BY_TYPE if isinstance(error, kind)),
                      HTTPStatus.INTERNAL_SERVER_ERROR)
    extensions: dict[str, Any] = {"error_type": name}
    workflow_id = getattr(error, "workflow_id", None)
    if isinstance(workflow_id, str):
        extensions["workflow_id"] = workflow_id
    if isinstance(error, RecordedError) and error.code is not None:
        extensions["error_code"] = error.code
    return problem(status, message, **extensions)


def problem(status: int, detail: Any = None, **extensions: Any) -> Problem:
    """The problem of ``status``: ``detail`` is its text (the status phrase when None); a
    detail that is not text (a framework's list of validation errors) goes under
    ``errors``."""
    known = HTTPStatus._value2member_map_.get(status)
    phrase = known.phrase if isinstance(known, HTTPStatus) else "Error"
    body: dict[str, Any] = {"type": "about:blank", "title": phrase, "status": int(status),
                            "detail": detail if isinstance(detail, str) else phrase}
    if detail is not None and not isinstance(detail, str):
        body["errors"] = detail
    body.update(extensions)
    return Problem(int(status), body)


def validation_problem(errors: Any) -> Problem:
    """A request that failed the framework's validation: 422, each error under ``errors``."""
    return problem(HTTPStatus.UNPROCESSABLE_ENTITY, "The request failed validation",
                   errors=errors)
