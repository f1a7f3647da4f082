"""The console's safety rules: who may see it, and which requests may change anything.

- Without an auth setting it answers only loopback peers, and ``dbos-async console``
  refuses to bind another address (:func:`check_bind`).
- Against DNS rebinding (a site whose name is made to point at 127.0.0.1, so that a
  browser on this machine sends its pages' requests to the console): the ``Host`` of every
  request must be a loopback name or one of the allowed hosts (:class:`HostCheck`), checked
  without an auth setting, and with one when allowed hosts are given.
- With one, every request must carry it: the token as ``Authorization: Bearer``, as the
  cookie a ``?token=`` visit sets, or a user and password by HTTP basic auth.
- Actions are POSTs carrying the browser's CSRF token twice: in its SameSite=Strict cookie
  and in the form (or ``X-CSRF-Token`` header) of the page it was given, from the
  console's own origin (any process serving the console accepts it); read-only unless
  ``allow_actions``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from dbos_async.errors import ConfigurationError

TOKEN_ENV = "DBOS_CONSOLE_TOKEN"
BASIC_AUTH_ENV = "DBOS_CONSOLE_BASIC_AUTH"
TOKEN_COOKIE = "dbos_console_token"
CSRF_COOKIE = "dbos_console_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True)
class ConsoleAuth:
    """What a request must present: a bearer ``token``, or ``username`` and ``password``
    by HTTP basic auth (either one satisfies it when both are set)."""

    token: str | None = None
    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if self.token is None and (self.username is None or self.password is None):
            raise ConfigurationError("ConsoleAuth needs a token, or a username and a password")
        if self.token is not None and len(self.token) < 16:
            raise ConfigurationError("The console token must be at least 16 characters long")

    @classmethod
    def from_environment(cls) -> ConsoleAuth | None:
        """The auth setting of ``DBOS_CONSOLE_TOKEN`` or ``DBOS_CONSOLE_BASIC_AUTH``
        (``user:password``); None when neither is set."""
        token = os.environ.get(TOKEN_ENV) or None
        basic = os.environ.get(BASIC_AUTH_ENV) or None
        username = password = None
        if basic is not None:
            username, colon, password = basic.partition(":")
            if not colon or not username or not password:
                raise ConfigurationError(f"{BASIC_AUTH_ENV} must be 'user:password'")
        if token is None and basic is None:
            return None
        return cls(token=token, username=username, password=password)

    def accepts(self, authorization: str | None, cookie_token: str | None) -> bool:
        """Whether a request with this ``Authorization`` header and token cookie may pass."""
        if self.token is not None:
            if cookie_token is not None and _same(cookie_token, self.token):
                return True
            scheme, _, value = (authorization or "").partition(" ")
            if scheme.lower() == "bearer" and _same(value.strip(), self.token):
                return True
        if self.username is not None and self.password is not None:
            return _basic_matches(authorization, self.username, self.password)
        return False

    @property
    def challenge(self) -> str:
        """The ``WWW-Authenticate`` header of a refusal."""
        return ('Basic realm="dbos_async console"' if self.username is not None
                else 'Bearer realm="dbos_async console"')


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _basic_matches(authorization: str | None, username: str, password: str) -> bool:
    scheme, _, encoded = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, colon, given = base64.b64decode(encoded.strip()).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    # Both compared, whatever the first says: the time taken tells nothing.
    user_ok = _same(user, username)
    password_ok = _same(given, password)
    return bool(colon) and user_ok and password_ok


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or ``localhost``) is on this machine only."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


_AUTHORITY = re.compile(r"(?:\[(?P<ipv6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::[0-9]{1,5})?")


def host_name(authority: str | None) -> str | None:
    """The host name of a ``Host`` header or of an origin's ``host[:port]``: lower case,
    an IPv6 address without its brackets; None when it is not one."""
    match = _AUTHORITY.fullmatch((authority or "").lower())
    if match is None:
        return None
    return match["ipv6"] or match["name"]


@dataclass(frozen=True)
class HostCheck:
    """The host names a console answers to: loopback names (``localhost``, ``127.0.0.1``,
    ``[::1]``, any port) and the ``allowed`` ones, each a name (``console.example.com``),
    a ``*.`` wildcard for the names under a domain, or ``*`` for any. ``allowed`` None
    means any host: only for a console with an auth setting (see :meth:`of`)."""

    allowed: tuple[str, ...] | None

    @classmethod
    def of(cls, allowed_hosts: Sequence[str] | None, auth: ConsoleAuth | None) -> HostCheck:
        """The check of a console's settings: without ``auth`` the loopback names and
        ``allowed_hosts``; with it, any host unless ``allowed_hosts`` are given.

        Raises:
            ConfigurationError: an allowed host that is not a host name (a URL, a port).
        """
        if isinstance(allowed_hosts, str):
            allowed_hosts = [allowed_hosts]
        if allowed_hosts is None:
            return cls(None if auth is not None else ())
        names = []
        for entry in allowed_hosts:
            given = entry.strip().lower()
            wildcard = "*." if given.startswith("*.") else ""
            bare = given.removeprefix(wildcard)
            name = host_name(bare)
            if given != "*" and (name is None or name != bare.strip("[]")):
                raise ConfigurationError(
                    f"Allowed host {entry!r} must be a host name without scheme or port "
                    "(console.example.com), '*.' and a domain, or '*'")
            names.append(given if given == "*" else wildcard + str(name))
        return cls(tuple(names))

    def accepts(self, authority: str | None) -> bool:
        """Whether a request whose ``Host`` is ``authority`` may be answered."""
        name = host_name(authority)
        if self.allowed is None or "*" in self.allowed:
            return True
        if name is None:
            return False
        return is_loopback(name) or any(
            name == entry or (entry.startswith("*.") and name.endswith(entry[1:]))
            for entry in self.allowed)

    def refusal(self, authority: str | None) -> str:
        """Why a request to ``authority`` is refused, and the setting that would let it in."""
        return (f"Refused: this console does not answer to the host {authority!r}. It "
                "answers to loopback names (localhost, 127.0.0.1, [::1]) and its allowed "
                "hosts: to reach it by another name, add that name to allowed_hosts "
                "(dbos-async console --allowed-host NAME).")


def same_origin(origin: str | None, host: str | None, fetch_site: str | None,
                hosts: HostCheck) -> bool:
    """Whether a POST comes from a page of the console itself: its ``Origin`` (browsers
    send it with every POST) names the host the request went to, and that host is one the
    console answers to, so a page of a rebound name is refused even where ``Host`` alone
    would agree. A request without ``Origin`` (a script's) is judged by its CSRF token."""
    if fetch_site == "cross-site":
        return False
    if origin is None:
        return True
    authority = origin.split("://", 1)[-1] if "://" in origin else None
    return authority is not None and authority == host and hosts.accepts(authority)


def check_bind(host: str, auth: ConsoleAuth | None) -> None:
    """Refuse to serve on a non-loopback address without an auth setting."""
    if auth is None and not is_loopback(host):
        raise ConfigurationError(
            f"Refusing to serve the console on {host!r} without authentication: set "
            f"{TOKEN_ENV} (a token of 16 characters or more) or {BASIC_AUTH_ENV} "
            "(user:password), or bind to a loopback address such as 127.0.0.1")


def new_csrf_token() -> str:
    """A random token for one browser: its cookie holds it and pages embed it; an action
    must send both (a page of another origin can read neither)."""
    return secrets.token_urlsafe(32)


def csrf_matches(given: str | None, expected: str | None) -> bool:
    return given is not None and expected is not None and _same(given, expected)
