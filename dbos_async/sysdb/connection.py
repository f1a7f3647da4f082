"""Opening connections to the system database, and creating it when it is missing."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import asyncpg

from dbos_async.errors import (
    ConfigurationError,
    DatabaseAuthenticationError,
    DatabaseUnavailableError,
    DBOSError,
)
from dbos_async.sysdb.fencing import TimelineFence


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/") or "postgres"


def with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + database))


def describe_target(url: str) -> str:
    """Database, server and user of ``url``, for messages (never the password)."""
    parts = urlsplit(url)
    host = parts.hostname or "the default host"
    user = f" as user {parts.username!r}" if parts.username else ""
    return f"{database_name(url)!r} at {host}:{parts.port or 5432}{user}"


def connection_failure(url: str, error: BaseException, what: str) -> DBOSError:
    """The error a failed connection attempt raises: naming the database, the server and
    the cause; a refused login is a :class:`DatabaseAuthenticationError`, a malformed
    connection option a :class:`ConfigurationError`."""
    cause = f"{type(error).__name__}: {error}"
    # 28000 and its 28P01 (a wrong password).
    if isinstance(error, asyncpg.InvalidAuthorizationSpecificationError):
        return DatabaseAuthenticationError(
            f"{what} {describe_target(url)}: the server refused the login ({cause}); check "
            "the user and password of the system database URL")
    if isinstance(error, asyncpg.ClientConfigurationError):
        return ConfigurationError(f"{what} {describe_target(url)}: {cause}")
    return DatabaseUnavailableError(f"{what} {describe_target(url)}: {cause}")


async def connect(url: str, connect_timeout: float, name: str,
                  fence: TimelineFence | None = None) -> asyncpg.Connection:
    """One connection (to a server ``fence`` admits), failing with a message that names the
    server instead of a socket error."""
    try:
        return await _connect_or_missing(url, connect_timeout, name, fence)
    except asyncpg.InvalidCatalogNameError as error:
        raise DatabaseUnavailableError(
            f"The system database {database_name(url)!r} does not exist at {redact(url)} "
            "(`dbos-async migrate` creates it, as an executor does on entering)"
        ) from error


async def _connect_or_missing(url: str, connect_timeout: float, name: str,
                              fence: TimelineFence | None) -> asyncpg.Connection:
    """:func:`connect`, but a missing database raises asyncpg's InvalidCatalogNameError,
    for :func:`ensure_database` to create it."""
    try:
        return await (fence.connect if fence else asyncpg.connect)(
            url, timeout=connect_timeout, server_settings={"application_name": name}
        )
    except asyncpg.InvalidCatalogNameError:
        raise
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise connection_failure(url, error, "Cannot connect to the system database") from error


async def ensure_database(url: str, connect_timeout: float,
                          fence: TimelineFence | None = None) -> None:
    """Create the URL's database if it does not exist and we may create databases."""
    try:
        conn = await _connect_or_missing(url, connect_timeout, "dbos_async", fence)
    except asyncpg.InvalidCatalogNameError:
        pass
    else:
        await conn.close()
        return
    name = database_name(url)
    admin = await connect(with_database(url, "postgres"), connect_timeout, "dbos_async", fence)
    try:
        quoted = '"' + name.replace('"', '""') + '"'
        await admin.execute(f"CREATE DATABASE {quoted}")
    except asyncpg.DuplicateDatabaseError:
        pass  # Another starter created it first.
    except asyncpg.InsufficientPrivilegeError as error:
        raise DatabaseUnavailableError(
            f"The system database {name!r} does not exist and this user may not create it: "
            f"{error}"
        ) from error
    finally:
        await admin.close()


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query on release.

    The default reset (UNLISTEN, RESET ALL, advisory unlock, CLOSE ALL) is a round trip per
    statement, doubling the cost of a checkpoint. Pool connections here carry no session state:
    LISTEN uses its own connection, locks are transaction-scoped, and nothing SETs a session
    variable. asyncpg still rolls back a transaction left open on release.
    """


async def create_pool(url: str, size: int, connect_timeout: float, name: str,
                      fence: TimelineFence | None = None) -> asyncpg.Pool:
    try:
        pool = await asyncpg.create_pool(
            url,
            connect=fence.connect if fence else None,
            min_size=1,
            max_size=size,
            timeout=connect_timeout,
            reset=_keep_session,
            server_settings={"application_name": name},
        )
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise connection_failure(url, error,
                                 "Cannot open a connection pool to the system database") from error
    return pool
