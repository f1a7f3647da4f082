"""PostgreSQL connection URLs: the one reader of a system database URL, for every place
that checks, rewrites or prints one.

A URL may name several servers, tried in order, in either of libpq's forms:
``postgresql://user@h1:5432,h2:5433/db``, or ``postgresql://user@/db?host=h1,h2&port=5432,5433``.
A host is a name, an IPv4 address, an IPv6 address in brackets (``[::1]:5432``) or, in the
query form, the directory of a Unix socket (``host=/var/run/postgresql``). The other query
options (``target_session_attrs``, ``sslmode``, server settings such as ``statement_timeout``)
are kept as given.

asyncpg is handed the URL itself. This reads it the way asyncpg does, so what a message
says is what the driver does; what asyncpg would fail on with a raw error, or read
differently than it looks, is refused here with a message naming the problem.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote, urlsplit

DEFAULT_PORT = 5432

SCHEMES = ("postgresql", "postgres")

TARGET_SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write",
                        "read-only")
"""The values of ``target_session_attrs`` asyncpg knows (which server of several to use)."""

# Query options that name the target; every other option is kept in DatabaseUrl.options.
_TARGET_OPTIONS = ("host", "port", "user", "password", "dbname", "database")
_MASK = "***"


@dataclass(frozen=True)
class Host:
    """One server of a URL: a host name or IP address and its port, or a socket directory."""

    address: str
    port: int

    @property
    def is_socket(self) -> bool:
        return self.address.startswith("/")

    def __str__(self) -> str:
        if self.is_socket:
            return f"{self.address.rstrip('/')}/.s.PGSQL.{self.port}"
        if ":" in self.address:
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed PostgreSQL URL (see the module docstring); :func:`parse_database_url`
    makes one."""

    text: str
    """The URL as asyncpg gets it (a SQLAlchemy ``+driver`` suffix dropped)."""
    user: str | None
    password: str | None
    hosts: tuple[Host, ...]
    database: str | None
    options: dict[str, str]
    """The query options other than the target's (host, port, user, password, dbname)."""

    @property
    def database_name(self) -> str:
        """The database a connection opens: the URL's, else ``PGDATABASE``, else the user's
        name (as asyncpg and libpq choose it)."""
        return (self.database or os.environ.get("PGDATABASE")
                or self.user or os.environ.get("PGUSER") or getpass.getuser())

    def describe(self) -> str:
        """Database, servers and user, for messages (never the password):
        ``'db' at h1:5432, h2:5433 as user 'app'``."""
        servers = ", ".join(str(host) for host in self.hosts)
        user = f" as user {self.user!r}" if self.user else ""
        return f"{self.database_name!r} at {servers}{user}"

    def redacted(self) -> str:
        """The URL with its password, in the user part or the query, masked."""
        return self._rebuilt(password=_MASK if self.password else None)

    def with_database(self, database: str) -> str:
        """The URL of another database on the same servers, as the same user."""
        return self._rebuilt(database=database)

    def with_server(self, server: Host) -> str:
        """The URL of the same database, user, password and options on one other server
        (in place of every server it lists, in whichever form it lists them)."""
        return self._rebuilt(server=server)

    def _rebuilt(self, *, password: str | None = None, database: str | None = None,
                 server: Host | None = None) -> str:
        parts = urlsplit(self.text)
        netloc = parts.netloc
        auth, at, servers = netloc.partition("@")
        if not at:
            auth, servers = "", netloc
        if password is not None and at and ":" in auth:
            auth = f"{auth.partition(':')[0]}:{password}"
        if server is not None and servers:
            servers = quote(str(server), safe="[]:")
        netloc = f"{auth}@{servers}" if at else servers
        path = parts.path if database is None else "/" + quote(database, safe="")
        fields = []
        for field in parts.query.split("&") if parts.query else ():
            name = unquote(field.partition("=")[0])
            if database is not None and name in ("dbname", "database"):
                continue
            if password is not None and name == "password":
                field = f"password={password}"
            if server is not None and name in ("host", "port"):
                continue
            fields.append(field)
        if server is not None and not servers:
            address = f"[{server.address}]" if ":" in server.address else server.address
            fields += [f"host={quote(address, safe='/[]:')}", f"port={server.port}"]
        query = "?" + "&".join(fields) if fields else ""
        fragment = "#" + parts.fragment if parts.fragment else ""
        return f"{parts.scheme}://{netloc}{path}{query}{fragment}"


def parse_database_url(text: str) -> DatabaseUrl:
    """Read a PostgreSQL URL.

    Args:
        text: ``postgresql://`` (or ``postgres://``, with or without a ``+driver`` suffix)
            URL naming one server or several (see the module docstring).

    Returns:
        The URL's parts.

    Raises:
        ValueError: the URL is malformed, names no host, or gives a port, a host or an
            option asyncpg cannot use; the message says which.
    """
    text = text.strip()
    scheme, sep, rest = text.partition("://")
    driverless = scheme.split("+", 1)[0]
    if not sep or driverless not in SCHEMES:
        raise ValueError(f"must be a postgresql:// URL, got scheme {scheme if sep else ''!r}")
    text = driverless + sep + rest
    try:
        parts = urlsplit(text)
    except ValueError as error:
        raise ValueError(
            f"is not a valid URL ({error}); a list of hosts mixing names and bracketed IPv6 "
            "addresses must go in the query: ?host=h1,[::1]&port=5432,5433") from None
    # asyncpg splits the user part off at the first "@".
    auth, at, server_list = parts.netloc.partition("@")
    if not at:
        auth, server_list = "", parts.netloc
    if "@" in server_list:
        raise ValueError("has an '@' in its user name or password: percent-encode it as %40")
    query = _query(parts.query)
    user_text, _, password_text = auth.partition(":")
    user = unquote(user_text) or query.get("user") or None
    password = unquote(password_text) or query.get("password") or None
    database = unquote(parts.path[1:]) if parts.path else query.get(
        "dbname", query.get("database"))
    return DatabaseUrl(
        text=text, user=user, password=password, hosts=_hosts(server_list, query),
        database=database or None,
        options={k: v for k, v in query.items() if k not in _TARGET_OPTIONS},
    )


def redact(text: str) -> str:
    """``text`` without its password, for messages; a URL that cannot be read is not shown."""
    try:
        return parse_database_url(text).redacted()
    except ValueError:
        return "(a database URL that cannot be read)"


def with_database(text: str, database: str) -> str:
    """The URL ``text`` with database ``database`` instead of its own."""
    return parse_database_url(text).with_database(database)


def _query(query: str) -> dict[str, str]:
    """The query's options, the last of a repeated one winning (as asyncpg reads them)."""
    if not query:
        return {}
    try:
        fields = parse_qs(query, strict_parsing=True)
    except ValueError as error:
        raise ValueError(f"has a malformed query ({error}): write name=value&name=value") \
            from None
    options = {name: values[-1] for name, values in fields.items()}
    attrs = options.get("target_session_attrs")
    if attrs is not None and attrs not in TARGET_SESSION_ATTRS:
        raise ValueError(f"has target_session_attrs={attrs!r}; it must be one of "
                         f"{', '.join(TARGET_SESSION_ATTRS)}")
    return options


def _hosts(server_list: str, query: dict[str, str]) -> tuple[Host, ...]:
    """The servers, from the URL's host part or else its ``host``/``port`` options."""
    in_query = query.get("host")
    if server_list and (in_query is not None or "port" in query):
        raise ValueError("names its hosts both before the path and in the query (host= or "
                         "port=); use one form")
    if not server_list and not in_query:
        raise ValueError("names no host")
    if server_list:
        entries = [_entry(spec, quoted=True) for spec in server_list.split(",")]
        return tuple(Host(address, port or DEFAULT_PORT) for address, port in entries)
    assert in_query is not None
    entries = [_entry(spec, quoted=False) for spec in in_query.split(",")]
    ports = [_port(p) for p in query["port"].split(",")] if "port" in query else []
    if ports and any(port is not None for _, port in entries):
        raise ValueError("gives ports both in host= and in port=; use one")
    if len(ports) == 1:
        ports *= len(entries)
    if ports and len(ports) != len(entries):
        raise ValueError(f"has {len(ports)} ports for {len(entries)} hosts")
    return tuple(Host(address, (ports[i] if ports else port) or DEFAULT_PORT)
                 for i, (address, port) in enumerate(entries))


def _entry(spec: str, *, quoted: bool) -> tuple[str, int | None]:
    """One host of a list: (address, port if it gives one). ``quoted``: from the part
    before the path, whose characters are percent-encoded (a socket directory as %2F...)."""
    if not spec:
        raise ValueError("has an empty host in its host list")
    if spec.startswith("/") and not quoted:
        return spec, None
    if spec.startswith("["):
        address, bracket, port = spec[1:].partition("]")
        if not bracket or not address or (port and not port.startswith(":")):
            raise ValueError(f"has a malformed IPv6 host {spec!r}: write [address]:port")
        return address, _port(port[1:])
    if spec.count(":") > 1:
        raise ValueError(f"has the IPv6 address {spec!r} without brackets: write [{spec}]")
    address, _, port = spec.partition(":")
    if not address:
        raise ValueError(f"has a port without a host ({spec!r})")
    return (unquote(address) if quoted else address), _port(unquote(port) if quoted else port)


def _port(text: str) -> int | None:
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise ValueError(f"has an invalid port {text!r}: a port is a number from 1 to 65535")
    if int(text) == 0:
        raise ValueError("has port 0: a port is a number from 1 to 65535")
    return int(text)
