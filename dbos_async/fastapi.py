"""FastAPI (and Starlette) integration: the executor's lifecycle, a dependency, errors as
problem details, idempotent requests and read-only workflow routes.

``FastAPI(lifespan=lifespan(dbos))`` enters the executor (or a ``DBOSClient``) for as long as
the application runs; ``install(app)`` maps dbos_async's errors to HTTP problem responses
and makes requests carrying an ``Idempotency-Key`` header idempotent (see
:mod:`dbos_async._web.idempotency`); ``app.include_router(workflow_router())`` adds
``GET /workflows``, ``/workflows/{id}`` and ``/workflows/{id}/steps``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any, TypeVar, overload

from dbos_async._extras import needs_extra

with needs_extra("fastapi", __name__):
    from fastapi import APIRouter, Depends, Request
    from fastapi.encoders import jsonable_encoder
    from fastapi.exception_handlers import http_exception_handler
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.applications import Starlette
    from starlette.datastructures import Headers
    from starlette.exceptions import HTTPException
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dbos_async._executor.dbos import DBOS
from dbos_async._executor.operator import Operator
from dbos_async._web import views
from dbos_async._web.idempotency import (
    DEFAULT_HEADER,
    current_idempotent_request,
    idempotent_request,
)
from dbos_async._web.problems import (
    PROBLEM_CONTENT_TYPE,
    Problem,
    checked_statuses,
    problem,
    problem_for,
    validation_problem,
)
from dbos_async.client import DBOSClient
from dbos_async.errors import DBOSError

__all__ = [
    "DBOSClientDep",
    "DBOSDep",
    "IdempotencyMiddleware",
    "current_idempotent_request",
    "get_client",
    "get_dbos",
    "install",
    "lifespan",
    "problem_response",
    "workflow_router",
]

AppT = TypeVar("AppT", bound=Starlette)

# Where the lifespan keeps the entered executor or client: app.state.<this>.
STATE_ATTRIBUTE = "dbos_async"


# ---- Lifespan and dependencies ----

@overload
def lifespan(
    executor: DBOS | DBOSClient, app_lifespan: None = None
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]: ...


@overload
def lifespan(
    executor: DBOS | DBOSClient,
    app_lifespan: Callable[[AppT], AbstractAsyncContextManager[Mapping[str, Any]]],
) -> Callable[[AppT], AbstractAsyncContextManager[Mapping[str, Any]]]: ...


@overload
def lifespan(
    executor: DBOS | DBOSClient,
    app_lifespan: Callable[[AppT], AbstractAsyncContextManager[None]],
) -> Callable[[AppT], AbstractAsyncContextManager[None]]: ...


def lifespan(
    executor: DBOS | DBOSClient,
    app_lifespan: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None,
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """A lifespan for ``FastAPI(lifespan=...)`` that enters ``executor`` (a ``DBOS`` or a
    ``DBOSClient``) before the application serves and leaves it after, around the
    application's own ``app_lifespan`` (whose state, if it yields one, is passed on): so
    that lifespan and every request can use the executor."""

    @asynccontextmanager
    async def run(app: Starlette) -> AsyncIterator[Any]:
        async with executor:
            setattr(app.state, STATE_ATTRIBUTE, executor)
            try:
                if app_lifespan is None:
                    yield None
                else:
                    async with app_lifespan(app) as state:
                        yield state
            finally:
                delattr(app.state, STATE_ATTRIBUTE)

    return run


def executor_of(app: Starlette) -> DBOS | DBOSClient:
    """The executor or client the application's lifespan entered."""
    executor: DBOS | DBOSClient | None = getattr(app.state, STATE_ATTRIBUTE, None)
    if executor is None:
        raise DBOSError("No DBOS executor or client is running for this application: create "
                        "it with FastAPI(lifespan=dbos_async.fastapi.lifespan(dbos))")
    return executor


def get_dbos(request: Request) -> DBOS:
    """Dependency: the ``DBOS`` executor the application's lifespan entered."""
    executor = executor_of(request.app)
    if not isinstance(executor, DBOS):
        raise DBOSError("This application's lifespan entered a DBOSClient, not a DBOS "
                        "executor: depend on get_client (DBOSClientDep) instead")
    return executor


def get_client(request: Request) -> DBOSClient:
    """Dependency: the ``DBOSClient`` the application's lifespan entered."""
    executor = executor_of(request.app)
    if not isinstance(executor, DBOSClient):
        raise DBOSError("This application's lifespan entered a DBOS executor, not a "
                        "DBOSClient: depend on get_dbos (DBOSDep) instead")
    return executor


DBOSDep = Annotated[DBOS, Depends(get_dbos)]
DBOSClientDep = Annotated[DBOSClient, Depends(get_client)]


# ---- Errors ----

def problem_response(error: BaseException,
                     statuses: Mapping[str, int] | None = None) -> JSONResponse:
    """The ``application/problem+json`` response answering ``error``."""
    return _problem_json(problem_for(error, statuses))


def _problem_json(answer: Problem, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(answer.body, status_code=answer.status, headers=headers,
                        media_type=PROBLEM_CONTENT_TYPE)


def install(app: Starlette, *, idempotency_header: str | None = DEFAULT_HEADER,
            error_statuses: Mapping[str, int] | None = None,
            shard_key_header: str | None = None) -> None:
    """Answer errors with problem responses and make keyed requests idempotent.

    Every ``DBOSError`` an endpoint raises (a failed workflow's ``RecordedError`` among
    them) is answered by the status table, and so are the framework's own errors: a request
    failing validation is a 422 listing the errors under ``errors``, an ``HTTPException``
    (a 404 route among them) keeps its status, detail and headers. Handlers added after
    this call take precedence.

    Args:
        app: the FastAPI or Starlette application.
        idempotency_header: the header whose value makes a request idempotent (None:
            no idempotency middleware).
        error_statuses: error type names (``{"PaymentDeclined": 402}``) to statuses, over
            the built-in table.
        shard_key_header: on a sharded system database, the header (``X-Tenant``, say)
            giving the shard key an idempotent request's workflows run under.

    Raises:
        ConfigurationError: ``error_statuses`` names something that is not an error status.
    """
    statuses = checked_statuses(error_statuses)

    async def handle(request: Request, error: Exception) -> JSONResponse:
        return problem_response(error, statuses)

    async def invalid(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return _problem_json(validation_problem(jsonable_encoder(error.errors())))

    async def refused(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        if error.status_code < 400:  # not an error (a 304, say): the framework's answer
            return await http_exception_handler(request, error)
        return _problem_json(problem(error.status_code, error.detail), error.headers)

    app.add_exception_handler(DBOSError, handle)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, refused)
    if idempotency_header is not None:
        app.add_middleware(IdempotencyMiddleware, header=idempotency_header,
                           error_statuses=statuses, shard_key_header=shard_key_header)


# ---- Idempotent requests ----

class IdempotencyMiddleware:
    """ASGI middleware: a request with the idempotency header starts its first workflow
    under the key as workflow ID, and is answered with a 409 problem when the key names a
    workflow another request (method, path, query, body) started: checked before the
    endpoint runs and again when its response starts, so that the loser of two concurrent
    requests with one key and different bodies does not answer with the winner's result.
    The body is read in full before the endpoint runs."""

    def __init__(self, app: ASGIApp, header: str = DEFAULT_HEADER,
                 error_statuses: Mapping[str, int] | None = None,
                 shard_key_header: str | None = None) -> None:
        self.app = app
        self.header = header
        self.shard_key_header = shard_key_header
        self.statuses = checked_statuses(error_statuses)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI request: an HTTP request carrying the header runs keyed."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        value = headers.get(self.header)
        if value is None:
            await self.app(scope, receive, send)
            return
        body, receive = await _buffered(receive)
        try:
            request = idempotent_request(
                self.header, value, scope["method"], scope["path"],
                scope.get("query_string", b"").decode("latin-1"), body,
                self.shard_key_header,
                headers.get(self.shard_key_header) if self.shard_key_header else None)
            if request is None:
                await self.app(scope, receive, send)
                return
            operator = executor_of(scope["app"])
            await request.check(operator)
        except DBOSError as error:
            await problem_response(error, self.statuses)(scope, receive, send)
            return
        replaced = False

        async def checked_send(message: Message) -> None:
            # The endpoint's response goes out unless the check when it starts finds a
            # conflict: then the problem goes out instead and the endpoint's is dropped.
            nonlocal replaced
            if replaced:
                return
            if message["type"] == "http.response.start":
                try:
                    await request.check(operator)
                except DBOSError as error:
                    replaced = True
                    await problem_response(error, self.statuses)(scope, receive, send)
                    return
            await send(message)

        with request.starting():
            await self.app(scope, receive, checked_send)


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """Read the request body in full; return it and a ``receive`` that hands it to the
    application again, then passes on what the server sends next (a disconnect)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            # The client went away mid-body: the application hears of it from the server.
            return b"".join(chunks), receive
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return body, replay


# ---- Read-only routes ----

def workflow_router(prefix: str = "/workflows") -> APIRouter:
    """``GET {prefix}`` (the filters of ``list_workflows`` as query parameters, repeated for
    lists, with ``limit`` and ``offset``), ``GET {prefix}/{id}`` and
    ``GET {prefix}/{id}/steps``, as JSON; errors as problem responses."""
    router = APIRouter()

    @router.get(prefix or "/")
    async def list_workflows(request: Request) -> JSONResponse:
        query = request.query_params.multi_items()
        return await _answer(request, lambda operator: views.workflow_page(operator, query))

    # Before the workflow's own route: IDs may contain slashes.
    @router.get(prefix + "/{workflow_id:path}/steps")
    async def workflow_steps(request: Request, workflow_id: str) -> JSONResponse:
        query = request.query_params.multi_items()
        return await _answer(
            request, lambda operator: views.workflow_steps(operator, workflow_id, query))

    @router.get(prefix + "/{workflow_id:path}")
    async def workflow(request: Request, workflow_id: str) -> JSONResponse:
        query = request.query_params.multi_items()
        return await _answer(
            request, lambda operator: views.workflow_detail(operator, workflow_id, query))

    return router


async def _answer(request: Request, view: Callable[[Operator], Awaitable[Any]]) -> JSONResponse:
    try:
        return JSONResponse(await view(executor_of(request.app)))
    except DBOSError as error:
        return problem_response(error)
