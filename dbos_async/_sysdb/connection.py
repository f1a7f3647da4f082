"""Opening connections to the system database, with the session settings every one of
them runs under, and creating the database when it is missing.

Every connection this package opens (the pool, the LISTEN connection, the executor-ID
lock, set-up and migrations, the sharded-schema probe) runs under :data:`SESSION_SETTINGS`,
sent in the startup packet. Those take precedence over what ``ALTER ROLE ... SET`` or
``ALTER DATABASE ... SET`` give an application's role or database, so a role's 5 ms
``statement_timeout`` does not fail checkpoints. A URL that names one of these settings
itself (``?statement_timeout=30s``) keeps its own value: that is the way to choose others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from dbos_async._database_url import DatabaseUrl, parse_database_url
from dbos_async._sysdb.fencing import TimelineFence
from dbos_async._sysdb.retry import is_canceled
from dbos_async.errors import (
    ConfigurationError,
    DatabaseAuthenticationError,
    DatabaseUnavailableError,
    DBOSError,
    StatementCanceledError,
)

T = TypeVar("T")

DEFAULT_CONNECTION_NAME = "dbos_async"

TRANSACTION_END_LIMIT = 5.0
"""Seconds a cancelled task still waits for the COMMIT or ROLLBACK it had sent."""

SESSION_SETTINGS = {
    # Off: the statements here are short, but a migration or an import on a large database
    # may take minutes, and the bounds that matter are set per transaction where they
    # apply (observability_query_timeout with SET LOCAL on listings and exports).
    "statement_timeout": "0",
    # Off: claims take their row locks with NOWAIT or SKIP LOCKED; other waits for a row
    # lock end when its holder commits, or when idle_transaction_timeout ends a holder
    # that stalled.
    "lock_timeout": "0",
    # Off for the session: idle_transaction_timeout bounds the transactions that take row
    # locks (SET LOCAL), while an export's snapshot may rightly wait on its reader.
    "idle_in_transaction_session_timeout": "0",
    # Off: the LISTEN connection and the executor-ID lock idle for as long as the
    # executor lives, and the pool keeps idle connections on purpose.
    "idle_session_timeout": "0",
}
"""The server's limits on each session, as this package runs them (PostgreSQL's own
defaults), whatever the role or database sets."""

LATER_SESSION_SETTINGS = {"transaction_timeout": ("0", 17)}
"""Limits only newer servers know, by name: (value, first major version); off: an import or
an export is one long transaction. An unknown name in the startup packet fails the
connection, so they are sent only to a server known to have them (see :func:`_open`)."""

_server_versions: dict[str, int] = {}
"""By URL, the major version of the server its last connection reached: which
:data:`LATER_SESSION_SETTINGS` the next one sends."""


def parsed_url(url: str) -> DatabaseUrl:
    """``url`` parsed; a malformed one is a :class:`ConfigurationError`."""
    try:
        return parse_database_url(url)
    except ValueError as error:
        raise ConfigurationError(f"The system database URL {error}") from None


def session_settings(url: DatabaseUrl, name: str) -> dict[str, str]:
    """The startup settings of a connection to ``url``: ``name`` as its application_name,
    and :data:`SESSION_SETTINGS` but those the URL sets itself."""
    ours = {k: v for k, v in SESSION_SETTINGS.items() if k not in url.options}
    return {**ours, "application_name": name}


def _later_settings(url: DatabaseUrl, major: int) -> dict[str, str]:
    """The :data:`LATER_SESSION_SETTINGS` for a server of version ``major`` (but those the
    URL sets itself)."""
    return {name: value for name, (value, since) in LATER_SESSION_SETTINGS.items()
            if major >= since and name not in url.options}


MAX_CACHED_STATEMENT = 256 * 1024
"""The longest statement text (bytes) a connection keeps prepared (asyncpg's default keeps
none over 15 KiB): a Citus node's group-commit statement names every shard's tables of the
node (see routed writes), some 1.5 KiB a shard, and is prepared once per connection only
if it is kept."""


async def _open(url: DatabaseUrl, connect_timeout: float, name: str,
                fence: TimelineFence | None = None,
                settings: Mapping[str, str] | None = None) -> asyncpg.Connection:
    """A connection with every session setting in its startup packet, where they take
    precedence over the role's and the database's.

    Which server a URL leads to, and so which settings it knows, shows only once
    connected: the first connection to a newer server (or to an older one, after a
    failover) is made again with the settings that server takes. That costs one more
    connection per process and URL, and needs no SET afterwards, which a role's own tiny
    ``transaction_timeout`` could end."""
    for _attempt in range(2):
        expected = _server_versions.get(url.text, 0)
        later = _later_settings(url, expected)
        try:
            conn = await (fence.connect if fence else asyncpg.connect)(
                url.text, timeout=connect_timeout,
                server_settings={**session_settings(url, name), **later, **(settings or {})},
                max_cacheable_statement_size=MAX_CACHED_STATEMENT)
        except asyncpg.UndefinedObjectError as error:
            if not any(setting in str(error) for setting in later):
                raise
            _server_versions[url.text] = 0  # an older server than the last one
            continue
        major = conn.get_server_version().major
        _server_versions[url.text] = major
        if _later_settings(url, major) == later:
            return conn
        await conn.close()
    raise DatabaseUnavailableError(
        f"The servers of {url.describe()} changed version while connecting; try again")


def canceled_statement(error: BaseException, what: str) -> StatementCanceledError | None:
    """The error a statement the server canceled raises instead of asyncpg's (None: it was
    not canceled): a statement or lock timeout, or ``pg_cancel_backend``."""
    return StatementCanceledError(what, str(error)) if is_canceled(error) else None


def connection_failure(url: str, error: BaseException, what: str) -> DBOSError:
    """The error a failed connection attempt raises: naming the database, every server and
    the cause; a refused login is a :class:`DatabaseAuthenticationError`, a malformed
    connection option or a session setting the server refuses a :class:`ConfigurationError`."""
    target = parsed_url(url).describe()
    cause = f"{type(error).__name__}: {error}"
    # 28000 and its 28P01 (a wrong password).
    if isinstance(error, asyncpg.InvalidAuthorizationSpecificationError):
        return DatabaseAuthenticationError(
            f"{what} {target}: the server refused the login ({cause}); check "
            "the user and password of the system database URL")
    # An unknown setting, a bad value, or one that cannot be set per session, in the URL.
    if isinstance(error, asyncpg.UndefinedObjectError | asyncpg.InvalidParameterValueError
                  | asyncpg.CantChangeRuntimeParamError):
        return ConfigurationError(
            f"{what} {target}: the server refused a setting of the system database URL "
            f"({cause})")
    if isinstance(error, asyncpg.ClientConfigurationError):
        return ConfigurationError(f"{what} {target}: {cause}")
    return DatabaseUnavailableError(f"{what} {target}: {cause}")


async def connect(url: str, connect_timeout: float, name: str,
                  fence: TimelineFence | None = None) -> asyncpg.Connection:
    """One connection (to a server ``fence`` admits), failing with a message that names
    the servers instead of a socket error."""
    try:
        return await _connect_or_missing(url, connect_timeout, name, fence)
    except asyncpg.InvalidCatalogNameError as error:
        raise DatabaseUnavailableError(
            f"The system database {parsed_url(url).describe()} does not exist "
            "(`dbos-async migrate` creates it, as an executor does on entering)"
        ) from error


async def _connect_or_missing(url: str, connect_timeout: float, name: str,
                              fence: TimelineFence | None) -> asyncpg.Connection:
    """:func:`connect`, but a missing database raises asyncpg's InvalidCatalogNameError,
    for :func:`ensure_database` to create it."""
    try:
        return await _open(parsed_url(url), connect_timeout, name, fence)
    except asyncpg.InvalidCatalogNameError:
        raise
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise connection_failure(url, error, "Cannot connect to the system database") from error


async def ensure_database(url: str, connect_timeout: float, name: str,
                          fence: TimelineFence | None = None) -> None:
    """Create the URL's database if it does not exist and we may create databases (from
    the server's ``postgres`` database)."""
    try:
        conn = await _connect_or_missing(url, connect_timeout, name, fence)
    except asyncpg.InvalidCatalogNameError:
        pass
    else:
        await conn.close()
        return
    parsed = parsed_url(url)
    database = parsed.database_name
    admin = await connect(parsed.with_database("postgres"), connect_timeout, name, fence)
    try:
        quoted = '"' + database.replace('"', '""') + '"'
        await admin.execute(f"CREATE DATABASE {quoted}")
    except asyncpg.DuplicateDatabaseError:
        pass  # Another starter created it first.
    except asyncpg.InsufficientPrivilegeError as error:
        raise DatabaseUnavailableError(
            f"The system database {parsed.describe()} does not exist and this user may not "
            f"create it: {error}"
        ) from error
    finally:
        await admin.close()


async def keep_session(connection: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query on release.

    The default reset (UNLISTEN, RESET ALL, advisory unlock, CLOSE ALL) is a round trip per
    statement, doubling the cost of a checkpoint. Pool connections here carry no session
    state but their settings (which must stay): LISTEN uses its own connection, locks are
    transaction-scoped, and nothing else SETs a session variable. asyncpg still rolls back
    a transaction left open on release.
    """


async def create_pool(url: str, size: int, connect_timeout: float, name: str,
                      fence: TimelineFence | None = None,
                      settings: Mapping[str, str] | None = None) -> asyncpg.Pool:
    """A pool of connections to ``url``, each opened with the session settings and, over
    them, ``settings``."""
    parsed = parsed_url(url)

    async def open_one(*_pool_arguments: object, **_pool_options: object) -> asyncpg.Connection:
        return await _open(parsed, connect_timeout, name, fence, settings)

    try:
        pool = await asyncpg.create_pool(
            min_size=1,
            max_size=size,
            connect=open_one,
            reset=keep_session,
        )
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise connection_failure(url, error,
                                 "Cannot open a connection pool to the system database") from error
    return pool


@contextlib.asynccontextmanager
async def pooled_transaction(pool: asyncpg.Pool, **options: Any
                             ) -> AsyncIterator[PoolConnectionProxy]:
    """A pooled connection in a transaction (``options`` as for asyncpg's
    ``Connection.transaction``) whose end, COMMIT or ROLLBACK, runs to completion even when
    the task is cancelled meanwhile (an executor closing, a timeout): asyncpg's own would
    stop at the cancellation and hand the pool a connection still in its transaction, which
    the pool rolls back with a "Resetting connection with an active transaction" warning."""
    async with pool.acquire() as conn:
        # Entered as asyncpg's context manager, so that a start cut by a cancellation is
        # still its own to roll back on release (not an unmanaged one the pool warns of).
        transaction = conn.transaction(**options)
        await transaction.__aenter__()
        try:
            yield conn
        except BaseException as error:
            # A dead connection cannot roll back: the error that ended the block says more.
            with contextlib.suppress(Exception):
                await uninterrupted(transaction.__aexit__(type(error), error,
                                                          error.__traceback__))
            raise
        await uninterrupted(transaction.__aexit__(None, None, None))


async def uninterrupted(step: Awaitable[T]) -> T:
    """Await ``step`` to its end even if this task is cancelled meanwhile (for up to
    :data:`TRANSACTION_END_LIMIT` seconds more: a server that stopped answering does not
    hold the canceller forever); the cancellation is raised once it has ended."""
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if task.cancelled():
            raise
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TRANSACTION_END_LIMIT
        while not task.done():
            if loop.time() >= deadline:
                task.cancel()
            # A level-triggered canceller (an anyio scope) cancels every wait here again.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task}, timeout=max(deadline - loop.time(), 0.01))
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what the caller gets
        raise
