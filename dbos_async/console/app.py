"""The console's ASGI app: pages over an executor's or client's operator API.

Every read goes through the public operations (listings, statuses, steps, events,
streams, messages, queues, schedules), so the console works on any schema the operator
does, sharded too; the actions are the operator's cancel, resume, fork and schedule
methods. Safety: :mod:`dbos_async.console.safety`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, PackageLoader
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dbos_async._executor.handles import WorkflowStatus
from dbos_async._executor.operator import Operator
from dbos_async._sysdb.clock import SYSTEM_CLOCK
from dbos_async._web.filters import listing_filters
from dbos_async.console import views
from dbos_async.console.safety import (
    CSRF_COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    TOKEN_COOKIE,
    ConsoleAuth,
    HostCheck,
    csrf_matches,
    is_loopback,
    new_csrf_token,
    same_origin,
)
from dbos_async.errors import (
    DBOSError,
    InvalidRequestError,
    NonExistentWorkflowError,
    SerializationError,
)
from dbos_async.prometheus import PrometheusMetrics
from dbos_async.statuses import WorkflowStatusString

PAGE_SIZE = 50
CHILD_DEPTH = 3
"""How many generations of children the tree shows."""
CHILDREN_SHOWN = 50
ACTIVITY_MINUTES = 60
EXECUTORS_RECENT_MINUTES = 60
"""The executors page also shows executors that started a workflow this recently."""
CHARTS_REFRESH = 10
"""How often (seconds) the metrics page reloads itself."""
LIVE_REFRESH_IDS = 200
"""At most this many workflows per status refresh (a page's worth, and then some)."""
MAX_PAGE = (2**63 - 1) // PAGE_SIZE
"""The last page number whose offset PostgreSQL takes (a bigint)."""
MAX_STEP = 2**31 - 1
"""The largest step number (an integer column)."""
_ACTIVE = (WorkflowStatusString.PENDING, WorkflowStatusString.ENQUEUED,
           WorkflowStatusString.DELAYED)
"""The statuses a workflow can be cancelled in (and resumed from, beside the final ones)."""
_DEPTH = (WorkflowStatusString.DELAYED, WorkflowStatusString.ENQUEUED,
          WorkflowStatusString.PENDING)
"""The statuses a queue's depth counts, in the order the queues page shows them."""
MAX_URL_BYTES = 8 * 1024
"""A request's path and query string at most (what browsers and proxies commonly take)."""
MAX_BODY_BYTES = 64 * 1024
"""An action's form is a few short fields: a larger body is refused unread."""

SECURITY_HEADERS = {
    # Scripts only from the console's own files: a value that slipped through escaping
    # still cannot run. Inline styles position the timeline's bars.
    "content-security-policy": ("default-src 'self'; script-src 'self'; "
                                "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                "frame-ancestors 'none'; form-action 'self'"),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

_templates = Environment(loader=PackageLoader("dbos_async.console", "templates"),
                         autoescape=True, trim_blocks=True, lstrip_blocks=True)
_templates.globals.update(when=views.when, duration=views.duration)


class ConsoleError(Exception):
    """A request the console answers with an error page (bad input, unknown workflow)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


class Console:
    """One console: its operator and settings, and its pages."""

    def __init__(self, operator: Callable[[], Operator], allow_actions: bool,
                 auth: ConsoleAuth | None, hosts: HostCheck) -> None:
        self._operator = operator
        self.allow_actions = allow_actions
        self.auth = auth
        self.hosts = hosts

    @property
    def operator(self) -> Operator:
        return self._operator()

    # ---- Rendering ----

    def page(self, request: Request, template: str, status_code: int = 200,
             **context: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")

        def url(path: str, **params: Any) -> str:
            query = urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
            return f"{base}{path}" + (f"?{query}" if query else "")

        html = _templates.get_template(template).render(
            url=url, allow_actions=self.allow_actions, csrf_field=CSRF_FIELD,
            csrf_token=request.scope["state"][CSRF_COOKIE], request_path=request.url.path,
            **context)
        return HTMLResponse(html, status_code=status_code)

    # ---- Workflows ----

    async def workflows(self, request: Request) -> Response:
        q = request.query_params
        page = _int(q.get("page") or "0", "page", minimum=0, maximum=MAX_PAGE)
        filters = workflow_filters(q)
        rows = await self.operator.list_workflows(
            **filters, limit=PAGE_SIZE + 1, offset=page * PAGE_SIZE, sort_desc=True,
            load_input=False, load_output=False)
        more = len(rows) > PAGE_SIZE
        return self.page(request, "workflows.html", workflows=rows[:PAGE_SIZE], page=page,
                         more=more, query=q, statuses=list(WorkflowStatusString),
                         chosen=set(q.getlist("status")),
                         sharded=self.operator.sharded,
                         page_params={k: q.getlist(k) for k in q if k != "page"})

    async def statuses(self, request: Request) -> Response:
        """The current status of the workflows a page shows, for its live refresh: one
        lookup by primary key (on a sharded database, of the IDs under the keys shown)."""
        ids = request.query_params.getlist("id")[:LIVE_REFRESH_IDS]
        keys = [k for k in request.query_params.getlist("key") if k] or None
        rows = (await self.operator.list_workflows(
            workflow_ids=ids, shard_key=keys if self.operator.sharded else None,
            load_input=False, load_output=False) if ids else [])
        return JSONResponse([{"id": r.workflow_id, "key": r.shard_key or "",
                              "status": r.status, "updated_at": r.updated_at} for r in rows])

    async def _status(self, request: Request) -> tuple[str, str | None, WorkflowStatus]:
        workflow_id = request.query_params.get("id") or ""
        shard_key = request.query_params.get("shard_key") or None
        if not workflow_id:
            raise ConsoleError(400, "Give the workflow's ID (?id=...)")
        status = await self.operator.get_workflow_status(workflow_id, shard_key=shard_key)
        if status is None:
            raise ConsoleError(404, f"No workflow has ID {workflow_id!r}")
        return workflow_id, shard_key, status

    async def _loaded(self, workflow_id: str, shard_key: str | None) -> tuple[
            WorkflowStatus | None, str | None]:
        """The workflow with its inputs and outcome, or the reason they cannot be read
        (a serialization this library does not read)."""
        try:
            [row] = await self.operator.list_workflows(
                workflow_ids=[workflow_id], shard_key=shard_key, load_input=True,
                load_output=True)
        except DBOSError as error:
            return None, str(error)
        except ValueError:
            return None, "The workflow was deleted while being read"
        return row, None

    async def workflow(self, request: Request) -> Response:
        workflow_id, shard_key, status = await self._status(request)
        op = self.operator
        loaded, unreadable = await self._loaded(workflow_id, shard_key)
        steps = await op.list_workflow_steps(workflow_id, shard_key=shard_key)
        unreadable_parts: dict[str, str] = {}

        async def part(name: str, read: Awaitable[Any], empty: Any) -> Any:
            # A value stored in a format this library does not read (another SDK's
            # pickle) spoils only its own section.
            try:
                return await read
            except SerializationError as error:
                unreadable_parts[name] = str(error)
                return empty

        events, history, streams, messages = await asyncio.gather(
            part("events", op.get_all_events(workflow_id, shard_key=shard_key), {}),
            part("events", op.get_event_history(workflow_id, shard_key=shard_key), []),
            part("streams", op.list_stream_values(workflow_id, shard_key=shard_key), []),
            part("messages", op.list_unconsumed_messages(workflow_id, shard_key=shard_key),
                 []))
        children = await self._children(status, CHILD_DEPTH)
        values: dict[str, views.Shown] = {}
        if loaded is not None:
            if loaded.input is not None:
                values["input"] = views.shown(views.pretty(
                    {"args": list(loaded.input.args), "kwargs": loaded.input.kwargs}))
            if loaded.status == WorkflowStatusString.SUCCESS:
                values["output"] = views.shown(views.pretty(loaded.output))
            if loaded.error is not None:
                values["error"] = views.shown(views.error_text(loaded.error) or "")
        return self.page(
            request, "workflow.html", wf=status, shard_key=shard_key, values=values,
            unreadable=unreadable, bars=views.timeline(status, steps, SYSTEM_CLOCK.now_ms()),
            transactions=op.transaction_names(),
            step_outputs={s.function_id: views.shown(views.pretty(s.output))
                          for s in steps if s.error is None and s.output is not None},
            children=children, unreadable_parts=unreadable_parts,
            events={k: views.pretty(v) for k, v in events.items()},
            history=[(h.function_id, h.key, views.pretty(h.value)) for h in history],
            streams=[(s.key, s.offset, None if s.closed else views.pretty(s.value))
                     for s in streams],
            messages=[(m, views.pretty(m.value)) for m in messages],
            can_cancel=status.status in _ACTIVE,
            can_resume=status.status in (*_ACTIVE, WorkflowStatusString.CANCELLED,
                                         WorkflowStatusString.MAX_RECOVERY_ATTEMPTS_EXCEEDED),
            last_step=max((s.function_id for s in steps), default=-1))

    async def _children(self, root: WorkflowStatus, depth: int) -> list[views.ChildNode]:
        """The workflows ``root`` started, and theirs, ``depth`` generations down: one
        listing per generation (at most ``CHILDREN_SHOWN`` workflows each)."""
        sharded = self.operator.sharded
        top: list[views.ChildNode] = []
        parents = {(root.workflow_id, root.shard_key): top}
        for _ in range(depth):
            if not parents:
                break
            rows = await self.operator.list_workflows(
                parent_workflow_id=[i for i, _ in parents],
                parent_shard_key=[k for _, k in parents if k is not None] if sharded else None,
                limit=CHILDREN_SHOWN, load_input=False, load_output=False)
            generation: dict[tuple[str, str | None], list[views.ChildNode]] = {}
            for row in rows:
                siblings = parents.get((row.parent_workflow_id or "", row.parent_shard_key))
                if siblings is None:  # the same parent ID under another key
                    continue
                node = views.ChildNode(row)
                siblings.append(node)
                generation[(row.workflow_id, row.shard_key)] = node.children
            parents = generation
        return top

    async def value(self, request: Request) -> Response:
        """One value of a workflow in full, as text (a page shows only its start)."""
        workflow_id, shard_key, _ = await self._status(request)
        part = request.query_params.get("part", "")
        if part == "step":
            step = _int(request.query_params.get("step", ""), "step", minimum=0,
                        maximum=MAX_STEP)
            for s in await self.operator.list_workflow_steps(workflow_id, shard_key=shard_key):
                if s.function_id == step:
                    return PlainTextResponse(views.pretty(s.output))
            raise ConsoleError(404, f"Workflow {workflow_id!r} has no step {step}")
        loaded, unreadable = await self._loaded(workflow_id, shard_key)
        if loaded is None:
            raise ConsoleError(422, unreadable or "Unreadable")
        if part == "input" and loaded.input is not None:
            return PlainTextResponse(views.pretty(
                {"args": list(loaded.input.args), "kwargs": loaded.input.kwargs}))
        if part == "output":
            return PlainTextResponse(views.pretty(loaded.output))
        if part == "error":
            return PlainTextResponse(views.error_text(loaded.error) or "")
        raise ConsoleError(400, "part must be input, output, error or step")

    async def fork_confirmation(self, request: Request) -> Response:
        workflow_id, shard_key, status = await self._status(request)
        start_step = _int(request.query_params.get("start_step", ""), "start_step",
                          minimum=0, maximum=MAX_STEP)
        steps = await self.operator.list_workflow_steps(workflow_id, load_output=False,
                                                        shard_key=shard_key)
        return self.page(request, "fork.html", wf=status, shard_key=shard_key,
                         start_step=start_step,
                         replayed=[s for s in steps if s.function_id < start_step],
                         rerun=[s for s in steps if s.function_id >= start_step])

    # ---- Actions ----

    async def act(self, request: Request) -> Response:
        form = await _form(request)
        action = request.path_params["action"]
        workflow_id = form.get("id") or ""
        shard_key = form.get("shard_key") or None
        if not workflow_id:
            raise ConsoleError(400, "Give the workflow's ID")
        op = self.operator
        target = workflow_id
        if action == "cancel":
            await op.cancel_workflow(workflow_id, shard_key=shard_key)
        elif action == "resume":
            await op.resume_workflow(workflow_id, shard_key=shard_key)
        elif action == "fork":
            start_step = _int(form.get("start_step", ""), "start_step", minimum=0,
                              maximum=MAX_STEP)
            handle = await op.fork_workflow(workflow_id, start_step, shard_key=shard_key)
            target = handle.workflow_id
        else:
            raise ConsoleError(404, f"Unknown action {action!r}")
        status = await op.get_workflow_status(target, shard_key=shard_key)
        if request.headers.get("accept", "").startswith("application/json"):
            return JSONResponse({"workflow_id": target,
                                 "status": status.status if status else None})
        base = request.scope.get("root_path", "").rstrip("/")
        query = urlencode({k: v for k, v in {"id": target, "shard_key": shard_key}.items()
                           if v is not None})
        return RedirectResponse(f"{base}/workflow?{query}", status_code=303)

    async def schedule_action(self, request: Request) -> Response:
        form = await _form(request)
        action = request.path_params["action"]
        name = form.get("name") or ""
        if not name:
            raise ConsoleError(400, "Give the schedule's name")
        if action == "pause":
            await self.operator.pause_schedule(name)
        elif action == "resume":
            await self.operator.resume_schedule(name)
        elif action == "trigger":
            await self.operator.trigger_schedule(name)
        else:
            raise ConsoleError(404, f"Unknown action {action!r}")
        if request.headers.get("accept", "").startswith("application/json"):
            return JSONResponse({"schedule": name, "done": action})
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/schedules", status_code=303)

    # ---- Queues and schedules ----

    async def queues(self, request: Request) -> Response:
        op = self.operator
        stored, depths, activity, oldest = await asyncio.gather(
            op.list_queues(), op.queue_depths(), op.queue_activity(ACTIVITY_MINUTES),
            op.oldest_waiting_workflows())
        by_name = {q.name: q for q in stored}
        names = sorted(set(by_name) | set(depths) | {a.queue_name for a in activity})
        now = SYSTEM_CLOCK.now_ms()  # an operator watches by the wall clock
        rows = [{"name": name, "queue": by_name.get(name), "depth": depths.get(name, {}),
                 "oldest": oldest.get(name),
                 "chart": views.queue_chart([a for a in activity if a.queue_name == name],
                                            now, ACTIVITY_MINUTES)}
                for name in names]
        return self.page(request, "queues.html", queues=rows,
                         depth_statuses=_DEPTH,
                         chart_width=views.CHART_WIDTH, chart_height=views.CHART_HEIGHT)

    async def schedules(self, request: Request) -> Response:
        rows = []
        for schedule in await self.operator.list_schedules():
            try:
                upcoming = [t.isoformat() for t in schedule.next_fire_times(3)]
            except DBOSError as error:
                upcoming = [f"unreadable: {error}"]
            rows.append((schedule, upcoming))
        return self.page(request, "schedules.html", schedules=rows)

    async def charts(self, request: Request) -> Response:
        """Throughput and failures per workflow name, run-time percentiles and each queue's
        depth, over the last hour or day (``?window=``), reloaded every few seconds."""
        window = views.WINDOWS.get(request.query_params.get("window", "hour"))
        if window is None:
            raise ConsoleError(400, f"The window is one of {', '.join(views.WINDOWS)}")
        op = self.operator
        now = SYSTEM_CLOCK.now_ms()  # an operator watches by the wall clock
        bucket_ms = window.bucket_seconds * 1000
        first = (now // bucket_ms - window.slots + 1) * bucket_ms
        activity, latency, depths = await asyncio.gather(
            op.get_workflow_activity(start_time=first, end_time=now + 1,
                                     bucket_seconds=window.bucket_seconds),
            op.get_workflow_aggregates(group_by="name", time_column="completed",
                                       start_time=first, end_time=now + 1),
            op.get_queue_depth_history(window.minutes))
        return self.page(request, "metrics.html", window=window, windows=views.WINDOWS,
                         activity=views.activity_charts(activity, now, window),
                         latency=views.latency_rows(latency),
                         depths=views.depth_charts(depths),
                         refresh_seconds=CHARTS_REFRESH,
                         chart_width=views.CHART_WIDTH, chart_height=views.CHART_HEIGHT,
                         latency_width=views.LATENCY_BAR_WIDTH)

    async def prometheus(self, request: Request) -> Response:
        """The system database's aggregates in Prometheus's text format (a console runs
        no workflows: the executors' own metrics are theirs to serve)."""
        exposition = PrometheusMetrics(aggregates=self.operator, executor=False)
        return Response(await exposition.render(), media_type=exposition.content_type)

    async def executors(self, request: Request) -> Response:
        found = await self.operator.list_executors(EXECUTORS_RECENT_MINUTES)
        latest = await self.operator.get_latest_application_version()
        latest_name = latest.version_name if latest is not None else None
        waiting = await self.operator.list_waiting_versions(other_than=latest_name)
        return self.page(request, "executors.html", executors=found,
                         recent_minutes=EXECUTORS_RECENT_MINUTES, latest=latest_name,
                         waiting=waiting)


def workflow_filters(q: QueryParams) -> dict[str, Any]:
    """The arguments of ``list_workflows`` a list page's query asks for (its filters, in
    the vocabulary of the web routes and the command line: see
    :mod:`dbos_async._web.filters`); the page number is the page's own."""
    try:
        return listing_filters((k, v) for k, v in q.multi_items() if k != "page")
    except InvalidRequestError as error:
        raise ConsoleError(400, str(error)) from None


def _int(text: str, what: str, minimum: int, maximum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConsoleError(400, f"{what} must be an integer, not {text[:40]!r}") from None
    if not minimum <= value <= maximum:
        raise ConsoleError(400, f"{what} must be from {minimum} to {maximum}, not {value}")
    return value


async def _form(request: Request) -> dict[str, str]:
    """A POST's URL-encoded form, one value per field."""
    return _fields(await request.body())


def _fields(body: bytes) -> dict[str, str]:
    text = body.decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}


async def _bounded_body(request: Request) -> bytes:
    """A POST's body, refused (413) past ``MAX_BODY_BYTES`` without reading the rest."""
    too_large = ConsoleError(413, f"The request's body is over {MAX_BODY_BYTES} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


class Guard:
    """Applied to every request before the console's routes: the size limits, the allowed
    hosts, the auth setting (or, without one, loopback peers only), the CSRF and origin
    rules of actions, the read-only default and the security headers. Errors of operations
    become error pages."""

    def __init__(self, app: ASGIApp, console: Console) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        # The CSRF token: the browser's own, from its cookie, else a new one set with this
        # response (double submit: a page of another site can neither read nor send it).
        known = request.cookies.get(CSRF_COOKIE)
        token = known or new_csrf_token()
        scope.setdefault("state", {})[CSRF_COOKIE] = token
        cookie = None if known else _csrf_cookie(token, scope.get("root_path", "") or "/")

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()
                            if k.encode() not in present]
                if cookie is not None:
                    headers.append((b"set-cookie", cookie.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            refusal = self.refusal(request)
            if refusal is None and request.method == "POST":
                body = await _bounded_body(request)
                refusal = self.forgery(request, body)
                receive = _replay(body)
        except ConsoleError as error:
            refusal = self.error(request, error.status_code, error.message)
        if refusal is not None:
            await refusal(scope, receive, secured)
            return
        try:
            await self.app(scope, receive, secured)
        except ConsoleError as error:
            await self.error(request, error.status_code, error.message)(scope, receive, secured)
        except NonExistentWorkflowError as error:
            await self.error(request, 404, str(error))(scope, receive, secured)
        except DBOSError as error:
            await self.error(request, 400, str(error))(scope, receive, secured)

    def error(self, request: Request, status_code: int, message: str) -> Response:
        if request.headers.get("accept", "").startswith("application/json"):
            return JSONResponse({"error": message}, status_code=status_code)
        return self.console.page(request, "error.html", status_code=status_code,
                                 message=message)

    def refusal(self, request: Request) -> Response | None:
        """Why a request is refused before its body is read, if it is."""
        console = self.console
        auth = console.auth
        scope = request.scope
        if len(scope.get("raw_path") or b"") + len(scope["query_string"]) > MAX_URL_BYTES:
            return PlainTextResponse(f"The URL is over {MAX_URL_BYTES} bytes",
                                     status_code=414)
        host = request.headers.get("host")
        if not console.hosts.accepts(host):
            return PlainTextResponse(console.hosts.refusal(host), status_code=400)
        if auth is None:
            peer = request.client.host if request.client else None
            if not is_loopback(peer):
                return PlainTextResponse(
                    "This console has no authentication setting, so it answers only "
                    "requests from this machine", status_code=403)
        else:
            token = request.query_params.get("token")
            if (token is not None and auth.token is not None
                    and auth.accepts(f"Bearer {token}", None)):
                return self.cookie_login(request, token)
            if not auth.accepts(request.headers.get("authorization"),
                                request.cookies.get(TOKEN_COOKIE)):
                return PlainTextResponse("Authentication required", status_code=401,
                                         headers={"www-authenticate": auth.challenge})
        if request.method in ("GET", "HEAD"):
            return None
        if request.method != "POST":
            return PlainTextResponse("Method not allowed", status_code=405)
        if not console.allow_actions:
            return self.error(request, 403, "This console is read-only: start it with "
                                            "--allow-actions (allow_actions=True) to act")
        if not same_origin(request.headers.get("origin"), request.headers.get("host"),
                           request.headers.get("sec-fetch-site"), console.hosts):
            return self.error(request, 403, "Refused: the action comes from another site")
        return None

    def forgery(self, request: Request, body: bytes) -> Response | None:
        """The refusal of an action without this browser's CSRF token, in its header or
        in its form ``body``."""
        given = request.headers.get(CSRF_HEADER)
        if given is None:
            given = _fields(body).get(CSRF_FIELD)
        if not csrf_matches(given, request.cookies.get(CSRF_COOKIE)):
            return self.error(request, 403, "Refused: missing or wrong CSRF token (reload "
                                            "the page and try again)")
        return None

    def cookie_login(self, request: Request, token: str) -> Response:
        """A ``?token=`` visit: keep the token in a cookie, and go to the same page
        without it in the address."""
        params = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        path = request.url.path + (f"?{urlencode(params)}" if params else "")
        response = RedirectResponse(path, status_code=303)
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict",
                            path=request.scope.get("root_path", "") or "/")
        return response


def _csrf_cookie(token: str, path: str) -> str:
    """The ``Set-Cookie`` value keeping a browser's CSRF token (read by no script: pages
    carry the token themselves)."""
    response = Response()
    response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path=path)
    return response.headers["set-cookie"]


def _replay(body: bytes) -> Receive:
    """A ``receive`` giving the app a body the guard already read."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def build_console(operator: Callable[[], Operator], *, allow_actions: bool,
                  auth: ConsoleAuth | None, allowed_hosts: Sequence[str] | None = None,
                  lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]]
                  | None = None) -> Starlette:
    """The console app over the operator ``operator()`` returns at each request."""
    console = Console(operator, allow_actions, auth, HostCheck.of(allowed_hosts, auth))

    routes = [
        Route("/", lambda request: RedirectResponse(
            request.scope.get("root_path", "").rstrip("/") + "/workflows", status_code=303)),
        Route("/workflows", console.workflows),
        Route("/workflow", console.workflow),
        Route("/workflow/value", console.value),
        Route("/workflow/fork", console.fork_confirmation),
        Route("/workflow/{action}", console.act, methods=["POST"]),
        Route("/api/statuses", console.statuses),
        Route("/queues", console.queues),
        Route("/schedules", console.schedules),
        Route("/schedules/{action}", console.schedule_action, methods=["POST"]),
        Route("/executors", console.executors),
        Route("/metrics", console.prometheus),
        Route("/metrics/charts", console.charts),
        Mount("/static", StaticFiles(directory=Path(__file__).parent / "static"),
              name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(Guard, console=console)
    return app


def console_app(dbos_or_client: Operator, allow_actions: bool = False,
                auth: ConsoleAuth | None = None,
                allowed_hosts: Sequence[str] | None = None) -> Starlette:
    """The workflow console as an ASGI app, to mount into a FastAPI or Starlette service
    (``app.mount("/dbos", console_app(dbos))``) over a running :class:`~dbos_async.DBOS`
    or a connected :class:`~dbos_async.DBOSClient`.

    Args:
        dbos_or_client: What the console reads and acts through.
        allow_actions: Offer and accept cancel, resume, fork and the schedules' actions
            (read-only without).
        auth: What every request must carry (a :class:`ConsoleAuth`; see
            :meth:`ConsoleAuth.from_environment`). Without it the console answers only
            requests from loopback addresses.
        allowed_hosts: The host names the console is reached by besides the loopback ones
            (``console.example.com``, ``*.example.com``, or ``*`` for any): a request whose
            ``Host`` is none of them is refused, against DNS rebinding. Checked without
            ``auth`` (loopback names only when not given) and, with it, when given.

    Returns:
        The console's Starlette app.

    Raises:
        DBOSError: ``dbos_or_client`` is neither an executor nor a client.
        ConfigurationError: an allowed host is not a host name.
    """
    if not isinstance(dbos_or_client, Operator):
        raise DBOSError("console_app needs a DBOS executor or a DBOSClient")
    return build_console(lambda: dbos_or_client, allow_actions=allow_actions, auth=auth,
                         allowed_hosts=allowed_hosts)
