"""aiohttp integration: the executor's lifecycle, application keys, errors as problem
details, idempotent requests and read-only workflow routes.

``setup(app, dbos)`` stores the executor (or a ``DBOSClient``) under :data:`DBOS_KEY` (or
:data:`CLIENT_KEY`), enters it through ``app.cleanup_ctx`` for as long as the application
runs, and adds :func:`dbos_middleware`: dbos_async's errors become problem responses and
requests carrying an ``Idempotency-Key`` header are idempotent (see
:mod:`dbos_async._web.idempotency`). ``app.add_routes(workflow_routes())`` adds
``GET /workflows``, ``/workflows/{id}`` and ``/workflows/{id}/steps``;
``metrics_handler(prometheus)`` serves a :class:`~dbos_async.prometheus.PrometheusMetrics`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from dbos_async._extras import needs_extra

with needs_extra("aiohttp", __name__):
    from aiohttp import web
    from aiohttp.typedefs import Handler, Middleware

from dbos_async._executor.dbos import DBOS
from dbos_async._executor.operator import Operator
from dbos_async._web import views
from dbos_async._web.idempotency import (
    DEFAULT_HEADER,
    current_idempotent_request,
    idempotent_request,
)
from dbos_async.client import DBOSClient
from dbos_async.errors import DBOSError

if TYPE_CHECKING:
    from dbos_async.prometheus import PrometheusMetrics

from dbos_async._web.problems import (
    PROBLEM_CONTENT_TYPE,
    Problem,
    checked_statuses,
    problem,
    problem_for,
)

__all__ = [
    "CLIENT_KEY",
    "DBOS_KEY",
    "current_idempotent_request",
    "dbos_context",
    "dbos_middleware",
    "executor_of",
    "metrics_handler",
    "problem_response",
    "setup",
    "workflow_routes",
]

DBOS_KEY = web.AppKey("dbos_async.dbos", DBOS)
"""``request.app[DBOS_KEY]``: the executor :func:`setup` was given."""

CLIENT_KEY = web.AppKey("dbos_async.client", DBOSClient)
"""``request.app[CLIENT_KEY]``: the client :func:`setup` was given."""

def setup(app: web.Application, executor: DBOS | DBOSClient, *,
          idempotency_header: str | None = DEFAULT_HEADER,
          error_statuses: Mapping[str, int] | None = None,
          shard_key_header: str | None = None) -> None:
    """Store ``executor`` in ``app`` (under :data:`DBOS_KEY` or :data:`CLIENT_KEY`), enter it
    while the application runs (a ``cleanup_ctx``, so cleanup contexts added after this one
    can use it), and add :func:`dbos_middleware`. Call it before the application starts."""
    middleware = dbos_middleware(idempotency_header=idempotency_header,
                                 shard_key_header=shard_key_header,
                                 error_statuses=error_statuses)
    if isinstance(executor, DBOS):
        app[DBOS_KEY] = executor
    else:
        app[CLIENT_KEY] = executor
    app.cleanup_ctx.append(dbos_context(executor))
    app.middlewares.append(middleware)


def dbos_context(
    executor: DBOS | DBOSClient,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry: enters ``executor`` on startup and leaves it on cleanup."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        async with executor:
            yield

    return context


def executor_of(request: web.Request) -> DBOS | DBOSClient:
    """The executor or client :func:`setup` stored in this application (or an enclosing one,
    for a sub-application)."""
    found = request.config_dict.get(DBOS_KEY) or request.config_dict.get(CLIENT_KEY)
    if found is None:
        raise DBOSError("No DBOS executor or client is set up for this application: call "
                        "dbos_async.aiohttp.setup(app, dbos) before it starts")
    return found


def problem_response(error: BaseException,
                     statuses: Mapping[str, int] | None = None) -> web.Response:
    """The ``application/problem+json`` response answering ``error``."""
    return _problem_json(problem_for(error, statuses))


def _problem_json(answer: Problem, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response(answer.body, status=answer.status, headers=headers,
                             content_type=PROBLEM_CONTENT_TYPE)


def _refused(error: web.HTTPException) -> web.Response:
    """An ``HTTPException`` of aiohttp's (a 404 route, a 405 method, one a handler raised)
    as a problem, keeping its status, its text when the handler gave one, and its headers
    (``Allow``, ``WWW-Authenticate``, ...)."""
    default_text = f"{error.status}: {error.reason}"
    detail = error.text if error.text and error.text != default_text else None
    headers = {name: value for name, value in error.headers.items()
               if name.lower() not in ("content-type", "content-length")}
    return _problem_json(problem(error.status, detail), headers)


def dbos_middleware(*, idempotency_header: str | None = DEFAULT_HEADER,
                    shard_key_header: str | None = None,
                    error_statuses: Mapping[str, int] | None = None) -> Middleware:
    """Middleware mapping every ``DBOSError`` a handler raises (a failed workflow's
    ``RecordedError`` among them) to a problem response, and aiohttp's own error responses
    (an ``HTTPException`` of status 400 or more: a 404 route, a 405 method) to problems of
    their status; and, unless ``idempotency_header`` is None, making requests that carry
    the header idempotent: the handler's first workflow starts under the key as ID, and a
    key that names a workflow another request (method, path, query, body) started is
    answered with a 409 problem, checked before the handler
    and again after it (a response the handler already streamed is sent as it is).
    ``error_statuses`` maps error type names (``{"PaymentDeclined": 402}``) to statuses
    over the built-in table. On a sharded system database, ``shard_key_header`` names the
    header giving the shard key an idempotent request's workflows run under."""
    statuses = checked_statuses(error_statuses)

    async def run(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except DBOSError as error:
            return problem_response(error, statuses)
        except web.HTTPException as error:
            if error.status < 400:
                raise  # a redirect, say: not an error
            return _refused(error)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        value = request.headers.get(idempotency_header) if idempotency_header else None
        if value is None or idempotency_header is None:
            return await run(request, handler)
        try:
            keyed = idempotent_request(
                idempotency_header, value, request.method, request.path, request.query_string,
                await request.read(), shard_key_header,
                request.headers.get(shard_key_header) if shard_key_header else None)
            if keyed is None:
                return await run(request, handler)
            operator = executor_of(request)
            await keyed.check(operator)
            with keyed.starting():
                response = await run(request, handler)
            if not response.prepared:
                await keyed.check(operator)
            return response
        except DBOSError as error:
            return problem_response(error, statuses)

    return middleware


def workflow_routes(prefix: str = "/workflows") -> web.RouteTableDef:
    """``GET {prefix}`` (the filters of ``list_workflows`` as query parameters, repeated for
    lists, with ``limit`` and ``offset``), ``GET {prefix}/{id}`` and
    ``GET {prefix}/{id}/steps``, as JSON; errors as problem responses."""
    routes = web.RouteTableDef()

    @routes.get(prefix or "/")
    async def list_workflows(request: web.Request) -> web.Response:
        query = list(request.query.items())
        return await _answer(request, lambda operator: views.workflow_page(operator, query))

    # Before the workflow's own route: IDs may contain slashes.
    @routes.get(prefix + "/{workflow_id:.+}/steps")
    async def workflow_steps(request: web.Request) -> web.Response:
        query = list(request.query.items())
        workflow_id = request.match_info["workflow_id"]
        return await _answer(
            request, lambda operator: views.workflow_steps(operator, workflow_id, query))

    @routes.get(prefix + "/{workflow_id:.+}")
    async def workflow(request: web.Request) -> web.Response:
        query = list(request.query.items())
        workflow_id = request.match_info["workflow_id"]
        return await _answer(
            request, lambda operator: views.workflow_detail(operator, workflow_id, query))

    return routes


def metrics_handler(metrics: PrometheusMetrics) -> Handler:
    """A handler serving ``metrics`` in Prometheus's text format
    (``app.router.add_get("/metrics", metrics_handler(prometheus))``).

    Args:
        metrics: what to serve.

    Returns:
        The aiohttp handler; a failed aggregate read answers as a problem response.
    """

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            body = await metrics.render()
        except DBOSError as error:
            return problem_response(error)
        return web.Response(body=body, headers={"Content-Type": metrics.content_type})

    return handler


async def _answer(request: web.Request,
                  view: Callable[[Operator], Awaitable[Any]]) -> web.Response:
    try:
        return web.json_response(await view(executor_of(request)))
    except DBOSError as error:
        return problem_response(error)
