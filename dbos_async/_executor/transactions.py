"""Transactions: steps whose SQL and checkpoint commit together, so their database effects
happen exactly once.

A transaction runs the user's ``async def`` with an asyncpg connection inside an open
transaction (reached with :func:`transaction_connection`), and records its outcome in that
same transaction:

- on the system database, the step's checkpoint itself (fenced: it lands only while this
  execution owns the workflow, the status row locked until the commit);
- on an application database, a ``datasource_outputs`` row; the system database's
  checkpoint is then recorded, fenced, in a transaction that keeps the workflow's status row
  locked *across the application database's commit*. No hand-off of the workflow (recovery,
  cancel, a takeover) commits meanwhile, so the user's writes commit only while this
  execution owns the workflow. A frozen execution cannot outrun that fence: its
  application-database session ends after ``idle_transaction_timeout`` idle in its
  transaction, counted from its last statement, which came before the fence's; the fence's
  session ends after the same time counted from later, so the user's transaction is gone
  before the lock is. (A commit already under way then, held up at commit time, may land:
  it began under the fence, and the next owner's insert of the same record waits for it and
  replays it.)

A crash between the application database's commit and the system database's leaves the
``datasource_outputs`` row: an execution that did not create the workflow looks for it first
and replays it. Serialization failures and deadlocks are retried with backoff, each time in a
new transaction; the user's other SQL errors are recorded as :class:`TransactionError`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

import asyncpg

from dbos_async._executor import steps
from dbos_async._executor.context import (
    WorkflowContext,
    current_workflow,
    running_step,
    workflow_of_step,
)
from dbos_async._executor.recorded_errors import deserialize_error
from dbos_async._executor.runtime import RuntimeSource
from dbos_async._executor.serialization import Signature
from dbos_async._executor.telemetry import logs, observe
from dbos_async._sysdb.application import (
    ISOLATION_LEVELS,
    ApplicationDatabase,
    Connection,
    IsolationLevel,
    OpenTransaction,
    StoredOutput,
)
from dbos_async._sysdb.retry import is_transient
from dbos_async._sysdb.shard_keys import WorkflowAddress
from dbos_async._sysdb.statements import Checkpoint
from dbos_async._validation import check_identifier
from dbos_async.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DBOSError,
    NondeterminismError,
    NonExistentWorkflowError,
    TransactionError,
    WorkflowCancelledError,
    WorkflowConflictError,
)

CLIENT_ERRORS = (asyncpg.InterfaceError, asyncpg.InternalClientError)
"""What asyncpg raises of its own (not the server's)."""

DRIVER_ERRORS = (asyncpg.PostgresError, *CLIENT_ERRORS, OSError)
"""What a connection that closed under a transaction raises (then retried)."""

CONFLICT_SQLSTATES = frozenset({"40001", "40P01"})
"""Serialization failure and deadlock: the transaction is retried, new each time."""

_connection: ContextVar[Connection | None] = ContextVar("dbos_transaction_connection",
                                                        default=None)

# The fence's own refusals and the workflow's end: never a transaction's recorded outcome.
_FENCE_ERRORS = (WorkflowConflictError, WorkflowCancelledError, NonExistentWorkflowError,
                 NondeterminismError)


@dataclass(frozen=True)
class TransactionOptions:
    """How a transaction runs: its ``isolation`` level, ``read_only`` or not, on the
    application database ``data_source`` names (None: the system database), retried up
    to ``max_retries`` times on a serialization failure or a deadlock, waiting
    ``retry_interval`` seconds at first, doubling up to ``max_retry_interval``."""

    name: str
    isolation: IsolationLevel = "SERIALIZABLE"
    read_only: bool = False
    data_source: str | None = None
    max_retries: int = 10
    retry_interval: float = 0.01
    max_retry_interval: float = 1.0

    def __post_init__(self) -> None:
        check_identifier(self.name, "transaction name")
        if self.isolation not in ISOLATION_LEVELS:
            raise DBOSError(f"Transaction {self.name!r}: isolation must be one of "
                            f"{', '.join(ISOLATION_LEVELS)}, got {self.isolation!r}")
        check_identifier(self.data_source, "data source name", optional=True)
        if self.max_retries < 0:
            raise DBOSError(f"Transaction {self.name!r}: max_retries must be >= 0")


@dataclass(frozen=True)
class TransactionInfo:
    fn: Callable[..., Coroutine[Any, Any, Any]]
    options: TransactionOptions
    signature: Signature


def transaction_connection() -> asyncpg.Connection:
    """The connection of the transaction running this code: run the transaction's SQL on it
    (it is inside the open transaction; do not commit or roll it back yourself).

    Returns:
        An ``asyncpg.Connection`` in the transaction.

    Raises:
        DBOSError: called outside a function decorated with ``@dbos.transaction()``.
    """
    conn = _connection.get()
    if conn is None:
        raise DBOSError("transaction_connection() is only available inside a function "
                        "decorated with @dbos.transaction()")
    return cast(asyncpg.Connection, conn)  # a pooled one, which proxies every method


@contextmanager
def _in_transaction(conn: Connection) -> Iterator[None]:
    token = _connection.set(conn)
    try:
        yield
    finally:
        _connection.reset(token)


def call(info: TransactionInfo, source: RuntimeSource, args: tuple[Any, ...],
         kwargs: dict[str, Any]) -> Coroutine[Any, Any, Any]:
    """A call of a transaction: checkpointed in a workflow body; elsewhere (outside
    workflows, inside a step) a plain transaction, retried on conflicts, recording
    nothing. ``source`` gives the running executor's runtime."""
    if _connection.get() is not None:
        raise DBOSError(f"Transaction {info.options.name!r} called inside another "
                        "transaction: transactions do not nest (call both from the workflow, "
                        "or make one a plain function taking the connection)")
    ctx = current_workflow()
    if ctx is None:
        return _run_plain(info, source, args, kwargs)
    return _run_checkpointed(ctx, ctx.allocate_step_id(), info, args, kwargs)


def _application_database(info: TransactionInfo,
                          databases: dict[str, ApplicationDatabase]) -> ApplicationDatabase:
    name = info.options.data_source
    assert name is not None
    try:
        return databases[name]
    except KeyError:
        known = ", ".join(sorted(databases)) or "none"
        raise ConfigurationError(
            f"Transaction {info.options.name!r} names the data source {name!r}, which is not "
            f"registered (registered: {known}); register it with dbos.data_source()"
        ) from None


async def _run_plain(info: TransactionInfo, source: RuntimeSource, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
    options = info.options
    outer = workflow_of_step()
    runtime = outer.runtime if outer is not None else source._current_runtime
    runtime.require_running()
    opener = (runtime.system_database.transaction if options.data_source is None
              else _application_database(info, runtime.application_databases).transaction)

    async def once(_: bool) -> Any:
        async with opener(options.isolation, options.read_only) as tx:
            value = await _user_sql(tx, info, args, kwargs)
            await _committed(info, tx)
            return value

    with running_step(None), observe.step_attempt(options.name, None, 1, "transaction"):
        return await _retrying(info, None, runtime.config.db_retry_timeout, once)


async def _run_checkpointed(ctx: WorkflowContext, step_id: int, info: TransactionInfo,
                            args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a transaction of ``ctx``'s workflow once: replay it if recorded, else run it
    with its checkpoint."""
    options = info.options
    recorded = ctx.recorded(step_id, options.name)
    if recorded is not None:
        return steps.replay(ctx, step_id, options.name, recorded, info.signature)
    started = ctx.runtime.system_database.clock.now_ms()
    run = _Attempt(ctx, step_id, info, args, kwargs, started)
    attempt: Callable[[bool], Coroutine[Any, Any, Any]] = run.on_system_database
    if options.data_source is not None:
        # Looked up before anything runs: an unknown name is the caller's error.
        attempt = functools.partial(
            run.on_application, _application_database(info, ctx.runtime.application_databases))
    try:
        with ctx.runtime.cancellation.region(ctx), running_step(step_id), \
                observe.step_attempt(options.name, step_id, 1, "transaction"):
            return await _retrying(info, step_id, ctx.runtime.config.db_retry_timeout,
                                   attempt)
    except (*_FENCE_ERRORS, DatabaseUnavailableError):
        raise
    except Exception as error:
        if ctx.cancelled:
            raise WorkflowCancelledError(ctx.workflow_id) from error
        return await steps.record_failed_step(ctx, step_id, options.name, started, error,
                                              info.signature)


async def _retrying(info: TransactionInfo, step_id: int | None, retry_timeout: float,
                    attempt: Callable[[bool], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``attempt`` (given whether an earlier one may have committed) until it is not
    refused by a serialization failure or a deadlock (up to the transaction's
    ``max_retries``, then the error is raised) or a lost connection (for up to
    ``retry_timeout`` seconds, then :class:`DatabaseUnavailableError`: an outage is never
    a transaction's outcome), with backoff, each time in a new transaction."""
    options = info.options
    delay = options.retry_interval
    maybe_committed = False
    failed = conflicts = 0
    give_up = time.monotonic() + retry_timeout
    while True:
        try:
            return await attempt(maybe_committed)
        except (_Retry, DatabaseUnavailableError) as refused:
            retry = _not_opened(refused) if isinstance(
                refused, DatabaseUnavailableError) else refused
            failed += 1
            maybe_committed = maybe_committed or retry.maybe_committed
            if retry.lost and time.monotonic() + delay > give_up:
                raise DatabaseUnavailableError(
                    f"Transaction {options.name!r} lost its connection for "
                    f"{retry_timeout:g} s (db_retry_timeout): {retry.error}") from retry.error
            if not retry.lost:
                conflicts += 1
                if conflicts > options.max_retries:
                    raise retry.error from retry.error.__cause__
            # Attempt ``failed`` failed, of those allowed so far (lost connections do not
            # use up max_retries).
            logs.step_retrying(options.name, step_id, failed,
                               options.max_retries + 1 + failed - conflicts, delay, retry.error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, options.max_retry_interval)


class _Retry(Exception):
    """An attempt to run again in a new transaction (``error``: what to raise when no
    attempts are left; ``lost``: its connection was lost; ``maybe_committed``: whether its
    commit may have landed, by default when its connection was lost)."""

    def __init__(self, error: Exception, lost: bool = False,
                 maybe_committed: bool | None = None) -> None:
        self.error = error
        self.lost = lost
        self.maybe_committed = lost if maybe_committed is None else maybe_committed


def _not_opened(error: DatabaseUnavailableError) -> _Retry:
    """A database that could not be reached (a transaction not opened, a read not made):
    retried like a lost connection when retrying may outlive it (nothing of the attempt
    committed then), else raised as it is, never recorded as the transaction's outcome."""
    if not is_transient(error):
        raise error
    return _Retry(error, lost=True, maybe_committed=False)


def _refusal(info: TransactionInfo, tx: OpenTransaction,
             error: BaseException) -> BaseException:
    """The error a driver error of the user's transaction ``tx`` becomes: a
    :class:`_Retry` for a conflict or a lost connection (``tx``'s connection closed under
    it), a :class:`TransactionError` naming its SQLSTATE for any other the server sent;
    anything else (the user's own errors) stays itself."""
    name = info.options.name
    if tx.lost() and isinstance(error, DRIVER_ERRORS):
        lost = TransactionError(name, "08006", f"connection lost: {error}")
        lost.__cause__ = error
        return _Retry(lost, lost=True)
    if isinstance(error, asyncpg.PostgresError):
        wrapped = TransactionError(name, error.sqlstate or "", str(error))
        wrapped.__cause__ = error
        return _Retry(wrapped) if error.sqlstate in CONFLICT_SQLSTATES else wrapped
    if isinstance(error, CLIENT_ERRORS):  # misuse of the connection (a closed cursor, ...)
        misused = TransactionError(name, "", f"{type(error).__name__}: {error}")
        misused.__cause__ = error
        return misused
    return error


@contextmanager
def _driver_errors(info: TransactionInfo, tx: OpenTransaction) -> Iterator[None]:
    """Raise what a driver error in the block becomes (see :func:`_refusal`)."""
    try:
        yield
    except Exception as error:
        refusal = _refusal(info, tx, error)
        if refusal is error:
            raise
        raise refusal from error


async def _user_sql(tx: OpenTransaction, info: TransactionInfo, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    """Run the user's function on the transaction's connection."""
    with _in_transaction(tx.conn), _driver_errors(info, tx):
        return await info.fn(*args, **kwargs)


async def _committed(info: TransactionInfo, tx: OpenTransaction) -> None:
    """Commit; a conflict found at the commit is retried, a lost reply leaves it unknown."""
    with _driver_errors(info, tx):
        await tx.commit()


class _Attempt:
    """One transaction of a workflow's step, run anew by each attempt."""

    def __init__(self, ctx: WorkflowContext, step_id: int, info: TransactionInfo,
                 args: tuple[Any, ...], kwargs: dict[str, Any], started: int) -> None:
        self.ctx = ctx
        self.step_id = step_id
        self.info = info
        self.args = args
        self.kwargs = kwargs
        self.started = started

    @property
    def name(self) -> str:
        return self.info.options.name

    def _checkpoint(self, output: str | None, serialization: str) -> Checkpoint:
        now = self.ctx.runtime.system_database.clock.now_ms()
        return Checkpoint(self.ctx.workflow_id, self.step_id, self.name, self.ctx.owner_xid,
                          output, None, self.started, now, serialization=serialization)

    async def on_system_database(self, _maybe_committed: bool) -> Any:
        """The user's SQL and the fenced checkpoint in one transaction on the system
        database (a read-only one records after its commit: it changed nothing). A
        checkpoint that does not land rolls the SQL back: the fence raises, or the outcome
        recorded first (by a racing or an earlier execution) is replayed."""
        options, sysdb = self.info.options, self.ctx.runtime.system_database
        async with sysdb.transaction(options.isolation, options.read_only) as tx:
            value = await _user_sql(tx, self.info, self.args, self.kwargs)
            output = self.info.signature.serialize_result(value, self.ctx.runtime.formats)
            if options.read_only:
                await _committed(self.info, tx)
                return await steps.record_step_output(self.ctx, self.step_id, self.name,
                                                      self.started, value, self.info.signature)
            checkpoint = self._checkpoint(output.text, output.serialization)
            if await self._guarded(tx, sysdb.record_step_on(tx.conn, checkpoint)):
                await _committed(self.info, tx)
                return value
        record = await sysdb.why_not_recorded(checkpoint)
        return steps.replay(self.ctx, self.step_id, self.name, record, self.info.signature)

    async def on_application(self, app: ApplicationDatabase, maybe_committed: bool) -> Any:
        """The user's SQL and its ``datasource_outputs`` row in one transaction on ``app``,
        committed inside the system database's fence (see the module's docstring)."""
        options = self.info.options
        workflow = WorkflowAddress(self.ctx.workflow_id, self.ctx.shard_key)
        async with app.transaction(options.isolation, options.read_only) as tx:
            if maybe_committed or not self.ctx.first_run:
                stored = await self._guarded(
                    tx, app.recorded_output(workflow, self.step_id, tx.conn))
                if stored is not None:
                    return await self._adopt(stored)
            value = await _user_sql(tx, self.info, self.args, self.kwargs)
            output = self.info.signature.serialize_result(value, self.ctx.runtime.formats)
            if options.read_only:
                await _committed(self.info, tx)
                return await steps.record_step_output(self.ctx, self.step_id, self.name,
                                                      self.started, value, self.info.signature)
            created_at = self.ctx.runtime.system_database.clock.now_ms()
            if await self._guarded(tx, app.record_output(tx.conn, workflow, self.step_id,
                                                         output.text, output.serialization,
                                                         created_at)):
                checkpoint = self._checkpoint(output.text, output.serialization)
                return await self._commit_fenced(tx, checkpoint, value)
        # An earlier execution committed this step: the read comes after our rollback.
        stored = await app.recorded_output(workflow, self.step_id)
        assert stored is not None, "a record that stopped an insert is there"
        return await self._adopt(stored)

    async def _commit_fenced(self, tx: OpenTransaction, checkpoint: Checkpoint,
                             value: Any) -> Any:
        """Commit the application database's transaction while the system database's
        fence holds the workflow; a fence that refuses rolls it back."""
        sysdb = self.ctx.runtime.system_database
        try:
            async with sysdb.holding_fence(checkpoint) as landed:
                if landed:
                    await _committed(self.info, tx)
        except Exception as error:
            if not tx.committed and is_transient(error):
                # The system database's side was lost before the commit: run it all again.
                raise _Retry(TransactionError(self.name, "08006",
                                              f"connection lost: {error}"), lost=True) from error
            if not (tx.committed and is_transient(error)):
                raise
            # Committed, but the fence's own commit was lost: record the checkpoint again
            # (fenced; an execution that took over replays the application's record).
            existing = await sysdb.record_step(
                checkpoint.workflow_id, checkpoint.function_id, checkpoint.function_name,
                checkpoint.owner_xid, output=checkpoint.output, error=None,
                started_at_ms=checkpoint.started_at_ms, completed_at_ms=sysdb.clock.now_ms(),
                serialization=checkpoint.serialization)
            if existing is not None:
                return steps.replay(self.ctx, self.step_id, self.name, existing,
                                    self.info.signature)
            return value
        if landed:
            return value
        # Refused: the fence raises, or the record there is replayed (either way the
        # caller's block then rolls the application's transaction back).
        record = await sysdb.why_not_recorded(checkpoint)
        return steps.replay(self.ctx, self.step_id, self.name, record, self.info.signature)

    async def _adopt(self, stored: StoredOutput) -> Any:
        """An outcome an earlier execution committed on the application database: make it
        this step's checkpoint too (or replay the one there), and return or raise it."""
        sysdb = self.ctx.runtime.system_database
        serialization = stored.serialization or self.ctx.runtime.formats.name
        existing = await sysdb.record_step(
            self.ctx.workflow_id, self.step_id, self.name, self.ctx.owner_xid,
            output=stored.output, error=stored.error, started_at_ms=self.started,
            completed_at_ms=sysdb.clock.now_ms(), serialization=serialization)
        if existing is not None:
            return steps.replay(self.ctx, self.step_id, self.name, existing,
                                self.info.signature)
        if stored.error is not None:
            raise deserialize_error(stored.error, serialization, self.ctx.runtime.formats)
        return self.info.signature.deserialize_result(stored.output, serialization,
                                                      self.ctx.runtime.formats)

    async def _guarded(self, tx: OpenTransaction, operation: Coroutine[Any, Any, Any]) -> Any:
        """One of our own statements in the user's transaction ``tx``: a conflict or a lost
        connection is retried like the user's SQL."""
        with _driver_errors(self.info, tx):
            return await operation
