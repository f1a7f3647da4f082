"""``dbos-async workflow ...``: list, inspect and operate workflows, through the client."""

from __future__ import annotations

import functools
import json
from typing import Any

import click

from dbos_async._executor.handles import WorkflowStatus
from dbos_async._executor.management.control import StartPoint, StartStep, StepNamed
from dbos_async._web.filters import listing_filters
from dbos_async.cli import render
from dbos_async.cli.target import Target, run, target_options
from dbos_async.client import DBOSClient
from dbos_async.errors import DBOSError, InvalidRequestError, NonExistentWorkflowError
from dbos_async.statuses import WorkflowStatusString


@click.group("workflow")
def workflow() -> None:
    """List, inspect and operate workflows."""


def _shard_key_option(command: Any) -> Any:
    return click.option("--shard-key", metavar="KEY",
                        help="The workflow's shard key (sharded schemas).")(command)


def _json_option(command: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON instead of a table.")(command)


def time_bound(value: str | None) -> str | int | None:
    """An ISO 8601 time, or epoch milliseconds when it is all digits."""
    return int(value) if value is not None and value.isdigit() else value


def _attributes(pairs: tuple[str, ...]) -> str | None:
    """``KEY=VALUE`` pairs as the JSON object the attributes filter takes; a VALUE that
    parses as JSON is that value, else the text."""
    if not pairs:
        return None
    attributes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--attribute")
        try:
            attributes[key] = json.loads(text)
        except ValueError:
            attributes[key] = text
    return json.dumps(attributes)


def _text(value: bool | None) -> str | None:
    """A yes-or-no option as the filter's text; None when not given."""
    return None if value is None else str(value).lower()


def filter_options(command: Any) -> Any:
    """The filters of ``list_workflows`` as options (``workflow list``, ``export``); the
    command receives them as ``filters``, the keyword arguments of ``list_workflows`` read
    by the one parser of filters (:mod:`dbos_async._web.filters`)."""
    options = [
        click.option("--status", "statuses", multiple=True, metavar="STATUS",
                     type=click.Choice(list(WorkflowStatusString), case_sensitive=False),
                     help="Keep workflows in this status (repeatable)."),
        click.option("--name", "names", multiple=True,
                     help="Workflow function name (repeatable)."),
        click.option("--queue", "queues", multiple=True, help="Queue name (repeatable)."),
        click.option("--queued", is_flag=True,
                     help="Only workflows on a queue that have not finished."),
        click.option("--start-time", metavar="TIME",
                     help="Created at or after TIME (ISO 8601, or epoch milliseconds)."),
        click.option("--end-time", metavar="TIME",
                     help="Created at or before TIME (ISO 8601, or epoch milliseconds)."),
        click.option("--completed-after", metavar="TIME",
                     help="Completed at or after TIME (ISO 8601, or epoch milliseconds)."),
        click.option("--completed-before", metavar="TIME",
                     help="Completed at or before TIME (ISO 8601, or epoch milliseconds)."),
        click.option("--dequeued-after", metavar="TIME",
                     help="Taken from its queue at or after TIME (ISO 8601, or epoch ms)."),
        click.option("--dequeued-before", metavar="TIME",
                     help="Taken from its queue at or before TIME (ISO 8601, or epoch ms)."),
        click.option("--prefix", "prefixes", multiple=True, metavar="PREFIX",
                     help="Workflow ID prefix (repeatable)."),
        click.option("--application-version", "versions", multiple=True, metavar="VERSION",
                     help="Application version (repeatable)."),
        click.option("--executor-id", "executors", multiple=True, metavar="ID",
                     help="Executor ID (repeatable)."),
        click.option("--parent", "parents", multiple=True, metavar="ID",
                     help="Parent workflow ID (repeatable)."),
        click.option("--forked-from", "forks", multiple=True, metavar="ID",
                     help="The workflow it was forked from (repeatable)."),
        click.option("--was-forked-from/--no-was-forked-from", default=None,
                     help="Only workflows that were (or were never) forked."),
        click.option("--is-fork/--no-is-fork", default=None,
                     help="Only forks (or only workflows that are not forks)."),
        click.option("--has-parent/--no-has-parent", default=None,
                     help="Only child workflows (or only top-level ones)."),
        click.option("--schedule", "schedules", multiple=True, metavar="NAME",
                     help="The schedule that started it (repeatable)."),
        click.option("--user", "users", multiple=True,
                     help="Authenticated user (repeatable)."),
        click.option("--attribute", "attributes", multiple=True, metavar="KEY=VALUE",
                     help="An attribute it carries; VALUE is JSON or text (repeatable)."),
        click.option("--shard-key", "shard_keys", multiple=True, metavar="KEY",
                     help="Shard key (repeatable; sharded schemas)."),
    ]

    @functools.wraps(command)
    def with_filters(*args: Any, statuses: tuple[str, ...], names: tuple[str, ...],
                     queues: tuple[str, ...], queued: bool, start_time: str | None,
                     end_time: str | None, completed_after: str | None,
                     completed_before: str | None, dequeued_after: str | None,
                     dequeued_before: str | None, prefixes: tuple[str, ...],
                     versions: tuple[str, ...], executors: tuple[str, ...],
                     parents: tuple[str, ...], forks: tuple[str, ...],
                     was_forked_from: bool | None, is_fork: bool | None,
                     has_parent: bool | None, schedules: tuple[str, ...],
                     users: tuple[str, ...], attributes: tuple[str, ...],
                     shard_keys: tuple[str, ...], **kwargs: Any) -> Any:
        lists = {"status": statuses, "name": names, "queue_name": queues,
                 "workflow_id_prefix": prefixes, "application_version": versions,
                 "executor_id": executors, "parent_workflow_id": parents,
                 "forked_from": forks, "schedule_name": schedules,
                 "authenticated_user": users, "shard_key": shard_keys}
        singles = {"start_time": start_time, "end_time": end_time,
                   "completed_after": completed_after, "completed_before": completed_before,
                   "dequeued_after": dequeued_after, "dequeued_before": dequeued_before,
                   "was_forked_from": _text(was_forked_from), "is_fork": _text(is_fork),
                   "has_parent": _text(has_parent), "queues_only": _text(queued or None),
                   "attributes": _attributes(attributes)}
        pairs = [(name, value) for name, values in lists.items() for value in values]
        pairs += [(name, value) for name, value in singles.items() if value is not None]
        try:
            filters = listing_filters(pairs)
        except InvalidRequestError as error:
            raise click.UsageError(str(error)) from None
        return command(*args, filters=filters, **kwargs)

    for option in reversed(options):
        with_filters = option(with_filters)
    return with_filters


@workflow.command("list")
@filter_options
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True,
              help="At most this many workflows.")
@click.option("--offset", type=click.IntRange(min=0), default=0,
              help="Skip this many first.")
@click.option("--sort", type=click.Choice(("asc", "desc")), default="desc",
              show_default=True, help="By creation time: oldest (asc) or newest first.")
@_json_option
@target_options
def list_workflows(target: Target, filters: dict[str, Any], limit: int, offset: int,
                   sort: str, as_json: bool) -> None:
    """List workflows, newest first.

    Every filter given must match; a repeated one matches any of its values. Statuses:
    PENDING, ENQUEUED, DELAYED, SUCCESS, ERROR, CANCELLED, MAX_RECOVERY_ATTEMPTS_EXCEEDED."""
    filters.update(limit=limit, offset=offset, sort_desc=sort == "desc",
                   load_input=as_json, load_output=as_json)

    async def listing() -> tuple[list[WorkflowStatus], bool]:
        async with target.client() as client:
            found = await client.list_workflows(**filters)
            return found, client.config.sharding

    found, sharded = run(listing())
    if as_json:
        render.print_json([render.status_json(s) for s in found])
        return
    headers = ["WORKFLOW ID", "STATUS", "NAME", "QUEUE", "CREATED (UTC)"]
    if sharded:
        headers.insert(1, "SHARD KEY")
    rows = []
    for s in found:
        row = [s.workflow_id, s.status, s.name, s.queue_name or "",
               render.timestamp(s.created_at)]
        if sharded:
            row.insert(1, s.shard_key or "")
        rows.append(row)
    render.table(headers, rows)


async def _one_status(client: DBOSClient, workflow_id: str,
                      shard_key: str | None) -> WorkflowStatus:
    """The workflow's status with its input and outcome; on a sharded schema an ID found
    under several keys needs ``--shard-key``."""
    found = await client.list_workflows(
        workflow_ids=[workflow_id], shard_key=[shard_key] if shard_key is not None else None,
        load_input=True, load_output=True)
    if not found:
        raise NonExistentWorkflowError(workflow_id)
    if len(found) > 1:
        keys = ", ".join(sorted(repr(s.shard_key) for s in found))
        raise DBOSError(f"Workflow {workflow_id!r} exists under several shard keys ({keys}): "
                        "choose one with --shard-key")
    return found[0]


@workflow.command("get")
@click.argument("workflow_id")
@_shard_key_option
@_json_option
@target_options
def get_workflow(target: Target, workflow_id: str, shard_key: str | None,
                 as_json: bool) -> None:
    """Show a workflow: its status, input and result or error."""

    async def get() -> WorkflowStatus:
        async with target.client() as client:
            return await _one_status(client, workflow_id, shard_key)

    status = run(get())
    if as_json:
        render.print_json(render.status_json(status))
        return
    data = render.status_json(status)
    render.fields([
        ("Workflow ID", status.workflow_id), ("Status", status.status),
        ("Name", status.name), ("Shard key", status.shard_key),
        ("Class", status.class_name), ("Instance", status.config_name),
        ("Queue", status.queue_name), ("Executor", status.executor_id),
        ("Application version", status.application_version),
        ("Application", status.application_name),
        ("Created (UTC)", render.timestamp(status.created_at)),
        ("Started (UTC)", render.timestamp(status.started_at)),
        ("Updated (UTC)", render.timestamp(status.updated_at)),
        ("Completed (UTC)", render.timestamp(status.completed_at)),
        ("Recovery attempts", str(status.recovery_attempts)),
        ("Parent", status.parent_workflow_id), ("Forked from", status.forked_from),
        ("Deduplication ID", status.deduplication_id),
        ("Authenticated user", status.authenticated_user),
        ("Attributes", status.attributes or None),
        ("Input", data["input"]),
        ("Output", status.output if status.status == WorkflowStatusString.SUCCESS else None),
        ("Error", f"{data['error']['name']}: {data['error']['message']}"
         if data["error"] else None),
    ])


@workflow.command("steps")
@click.argument("workflow_id")
@click.option("--limit", type=click.IntRange(min=0), help="At most N steps.")
@click.option("--offset", type=click.IntRange(min=0), help="Skip the first N steps.")
@click.option("--no-output", "load_output", is_flag=True, flag_value=False, default=True,
              help="Leave outputs and errors unread.")
@_shard_key_option
@_json_option
@target_options
def list_steps(target: Target, workflow_id: str, limit: int | None, offset: int | None,
               load_output: bool, shard_key: str | None, as_json: bool) -> None:
    """List a workflow's recorded steps.

    Every checkpoint in order: steps, sleeps, messages received, child workflows."""

    async def steps() -> list[Any]:
        async with target.client() as client:
            return await client.list_workflow_steps(workflow_id, limit=limit, offset=offset,
                                                    load_output=load_output,
                                                    shard_key=shard_key)

    found = run(steps())
    if as_json:
        render.print_json([render.step_json(s) for s in found])
        return
    rows = []
    for s in found:
        error = render.error_json(s.error)
        outcome = (f"error {error['name']}: {error['message']}" if error is not None
                   else s.output)
        took = ("" if s.started_at_epoch_ms is None or s.completed_at_epoch_ms is None
                else str(s.completed_at_epoch_ms - s.started_at_epoch_ms))
        rows.append([str(s.function_id), s.name, render.cell(outcome),
                     s.child_workflow_id or "", took])
    render.table(["STEP", "NAME", "OUTPUT", "CHILD WORKFLOW", "MS"], rows)


@workflow.command("cancel")
@click.argument("workflow_ids", nargs=-1, required=True, metavar="WORKFLOW_ID...")
@click.option("--children", is_flag=True,
              help="Also cancel every workflow they started, recursively.")
@_shard_key_option
@target_options
def cancel_workflows(target: Target, workflow_ids: tuple[str, ...], children: bool,
                     shard_key: str | None) -> None:
    """Cancel workflows.

    All of them, or none if one does not exist; finished ones keep their outcome. Running
    ones stop at once."""

    async def cancel() -> list[str]:
        async with target.client() as client:
            return await client.cancel_workflows(workflow_ids, cancel_children=children,
                                                 shard_key=shard_key)

    changed = set(run(cancel()))
    for workflow_id in workflow_ids:
        click.echo(f"Cancelled {workflow_id}" if workflow_id in changed
                   else f"Unchanged {workflow_id} (already finished or cancelled)")
    for workflow_id in sorted(changed - set(workflow_ids)):
        click.echo(f"Cancelled {workflow_id} (a child)")


@workflow.command("resume")
@click.argument("workflow_ids", nargs=-1, required=True, metavar="WORKFLOW_ID...")
@click.option("--queue", help="Queue to run them on (default: the internal queue every "
                              "executor serves).")
@click.option("--application-version", metavar="VERSION",
              help="Run them under this version (default: the one each has).")
@_shard_key_option
@target_options
def resume_workflows(target: Target, workflow_ids: tuple[str, ...], queue: str | None,
                     shard_key: str | None, application_version: str | None) -> None:
    """Resume workflows from their last checkpoint.

    For cancelled, dead-lettered or stuck workflows: they are enqueued again and continue
    where they stopped. Only executors of their application version run them: to move
    an old version's waiting workflows to the current one, run `dbos-async replay` first
    (its --move does both)."""

    async def resume() -> None:
        async with target.client() as client:
            await client.resume_workflows(workflow_ids, queue, shard_key=shard_key,
                                          application_version=application_version)

    run(resume())
    for workflow_id in workflow_ids:
        click.echo(f"Resumed {workflow_id}")


def _start_options(command: Any) -> Any:
    """``--step N``, ``--step-name NAME``, ``--last-failure`` or ``--last-step`` (at most
    one; none: the first step): the command receives them as ``start_step``, what
    ``fork_workflow`` and ``rewind_workflow`` take."""
    options = [
        click.option("--step", "position", type=click.IntRange(min=0),
                     help="First step to run again, by position (default: 0, all of it)."),
        click.option("--step-name", metavar="NAME",
                     help="First step to run again: the first checkpoint named NAME."),
        click.option("--last-failure", is_flag=True,
                     help="First step to run again: the last one that failed."),
        click.option("--last-step", is_flag=True,
                     help="First step to run again: the last one recorded."),
    ]

    @functools.wraps(command)
    def with_start(*args: Any, position: int | None, step_name: str | None,
                   last_failure: bool, last_step: bool, **kwargs: Any) -> Any:
        chosen: list[StartStep] = []
        if position is not None:
            chosen.append(position)
        if step_name is not None:
            chosen.append(StepNamed(step_name))
        if last_failure:
            chosen.append(StartPoint.LAST_FAILURE)
        if last_step:
            chosen.append(StartPoint.LAST_STEP)
        if len(chosen) > 1:
            raise click.UsageError("Give at most one of --step, --step-name, --last-failure "
                                   "and --last-step")
        return command(*args, start_step=chosen[0] if chosen else 0, **kwargs)

    for option in reversed(options):
        with_start = option(with_start)
    return with_start


@workflow.command("fork")
@click.argument("workflow_id")
@_start_options
@click.option("--new-id", help="ID of the new workflow (default: random).")
@click.option("--application-version", help="Version of the executors that may run it.")
@click.option("--queue", help="Queue to run it on (default: the internal queue).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True),
              help="Its start-to-close timeout, in seconds.")
@click.option("--replace-child", "replacements", multiple=True, metavar="OLD=NEW",
              help="Use workflow NEW where the copied steps recorded child OLD "
                   "(repeatable).")
@_shard_key_option
@target_options
def fork_workflow(target: Target, workflow_id: str, start_step: StartStep, new_id: str | None,
                  application_version: str | None, queue: str | None, timeout: float | None,
                  replacements: tuple[str, ...], shard_key: str | None) -> None:
    """Fork a workflow from a step; prints the new ID.

    The new workflow has the original's inputs; its steps before the chosen one replay
    the original's recorded results, the others run again."""
    children = {}
    for pair in replacements:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise click.BadParameter(f"{pair!r} is not OLD=NEW", param_hint="--replace-child")
        children[old] = new

    async def fork() -> str:
        async with target.client() as client:
            handle = await client.fork_workflow(
                workflow_id, start_step, application_version=application_version, queue=queue,
                replacement_children=children or None, new_workflow_id=new_id,
                workflow_timeout=timeout, shard_key=shard_key)
            return handle.workflow_id

    click.echo(run(fork()))


@workflow.command("rewind")
@click.argument("workflow_id")
@_start_options
@click.option("--application-version", help="Version of the executors that may run it.")
@click.option("--queue", help="Queue to run it on (default: the internal queue).")
@_shard_key_option
@target_options
def rewind_workflow(target: Target, workflow_id: str, start_step: StartStep,
                    application_version: str | None, queue: str | None,
                    shard_key: str | None) -> None:
    """Run a finished workflow again from a step, under its own ID; the chosen step's
    checkpoint and later ones are discarded."""

    async def rewind() -> None:
        async with target.client() as client:
            await client.rewind_workflow(workflow_id, start_step,
                                         application_version=application_version,
                                         queue=queue, shard_key=shard_key)

    run(rewind())
    at = f" to step {start_step}" if isinstance(start_step, int) else ""
    click.echo(f"Rewound {workflow_id}{at}")


@workflow.command("delete")
@click.argument("workflow_ids", nargs=-1, required=True, metavar="WORKFLOW_ID...")
@click.option("--children", is_flag=True,
              help="Also delete every workflow they started, recursively.")
@_shard_key_option
@target_options
def delete_workflows(target: Target, workflow_ids: tuple[str, ...], children: bool,
                     shard_key: str | None) -> None:
    """Delete workflows and all their records.

    None is deleted if one does not exist."""

    async def delete() -> None:
        async with target.client() as client:
            found = await client.list_workflows(
                workflow_ids=workflow_ids, load_input=False, load_output=False,
                shard_key=[shard_key] if shard_key is not None else None)
            missing = sorted(set(workflow_ids) - {s.workflow_id for s in found})
            if missing:
                raise NonExistentWorkflowError(missing[0])
            await client.delete_workflows(workflow_ids, delete_children=children,
                                          shard_key=shard_key)

    run(delete())
    for workflow_id in workflow_ids:
        click.echo(f"Deleted {workflow_id}")


@workflow.command("set-priority")
@click.argument("workflow_id")
@click.argument("priority", type=int)
@_shard_key_option
@target_options
def set_priority(target: Target, workflow_id: str, priority: int,
                 shard_key: str | None) -> None:
    """Give a workflow waiting on its queue a new priority (lower runs first)."""

    async def change() -> None:
        async with target.client() as client:
            await client.set_workflow_priority(workflow_id, priority, shard_key=shard_key)

    run(change())
    click.echo(f"{workflow_id} now has priority {priority}")


@workflow.command("set-delay")
@click.argument("workflow_id")
@click.option("--seconds", type=float, help="Wait this many seconds from now.")
@click.option("--until", "until_ms", type=int, metavar="EPOCH_MS",
              help="Wait until this time (epoch milliseconds).")
@_shard_key_option
@target_options
def set_delay(target: Target, workflow_id: str, seconds: float | None, until_ms: int | None,
              shard_key: str | None) -> None:
    """Make a workflow waiting on its queue wait until a new time (exactly one of --seconds
    and --until); it starts when due."""

    async def change() -> None:
        async with target.client() as client:
            await client.set_workflow_delay(workflow_id, delay_seconds=seconds,
                                            delay_until_epoch_ms=until_ms,
                                            shard_key=shard_key)

    run(change())
    click.echo(f"{workflow_id} is delayed")


@workflow.command("set-attributes")
@click.argument("workflow_id")
@click.argument("attributes", metavar="JSON")
@click.option("--merge", is_flag=True,
              help="Add these keys to the workflow's attributes instead of replacing them.")
@_shard_key_option
@target_options
def set_attributes(target: Target, workflow_id: str, attributes: str, merge: bool,
                   shard_key: str | None) -> None:
    """Replace a workflow's attributes with the JSON object given (null clears them), or
    merge its keys in with --merge."""
    try:
        value = json.loads(attributes)
    except ValueError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="JSON") from None

    async def change() -> None:
        async with target.client() as client:
            await client.update_workflow_attributes(workflow_id, value, merge=merge,
                                                    shard_key=shard_key)

    run(change())
    click.echo(f"Updated the attributes of {workflow_id}")
