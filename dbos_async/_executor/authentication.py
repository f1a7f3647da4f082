"""Who a workflow runs for, and the roles its functions require.

The identity (an authenticated user, the roles granted to them, the role they act under)
is set for a block with :class:`SetAuthentication`, recorded on every workflow started or
enqueued in it (``authenticated_user``, ``authenticated_roles`` as a JSON list,
``assumed_role``, the columns the ``dbos`` package writes), and is the identity of that
workflow's body: its steps see it and its children inherit it, also after recovery.

A workflow or step declared with ``required_roles`` runs only for an identity holding one
of them; it then runs with the first of those roles it holds as its assumed role (the
``dbos`` package's rule). Otherwise :class:`~dbos_async.NotAuthorizedError` is raised at
the call, before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace

from dbos_async.errors import DBOSError, NotAuthorizedError


def _role_list(roles: object, what: str) -> tuple[str, ...]:
    if isinstance(roles, str) or not isinstance(roles, Sequence):
        raise DBOSError(f"{what} must be a list of role names, got {roles!r}")
    if not all(isinstance(role, str) and role for role in roles):
        raise DBOSError(f"{what} must be non-empty strings, got {list(roles)!r}")
    return tuple(roles)


@dataclass(frozen=True)
class Authentication:
    """An identity: the authenticated user, their roles, and the role they act under."""

    user: str | None = None
    roles: tuple[str, ...] | None = None
    assumed_role: str | None = None

    def __post_init__(self) -> None:
        if self.user is not None and (not isinstance(self.user, str) or not self.user):
            raise DBOSError(f"An authenticated user must be a non-empty string, got "
                            f"{self.user!r}")
        if self.roles is not None:
            object.__setattr__(self, "roles", _role_list(self.roles, "Authenticated roles"))

    @classmethod
    def of(cls, user: str | None, roles: Sequence[str] | None,
           assumed_role: str | None = None) -> Authentication:
        """An identity given by a caller, its roles checked (a list of names)."""
        return cls(user, _role_list(roles, "roles") if roles is not None else None,
                   assumed_role)

    @property
    def roles_json(self) -> str | None:
        """The roles as the ``authenticated_roles`` column stores them."""
        return json.dumps(list(self.roles)) if self.roles else None

    @classmethod
    def from_columns(cls, user: str | None, roles_json: str | None,
                     assumed_role: str | None) -> Authentication:
        """The identity a workflow row records, read as every DBOS SDK writes it: DBOS's
        TypeScript client records "nobody" as an empty user and role and an empty JSON
        list of roles, the ``dbos`` package as NULLs; both read as none."""
        if not (user or roles_json or assumed_role):  # most rows: nobody
            return NO_AUTHENTICATION
        return cls(user or None, roles_from_column(roles_json), assumed_role or None)


NO_AUTHENTICATION = Authentication()


def roles_from_column(text: str | None) -> tuple[str, ...] | None:
    """The roles of an ``authenticated_roles`` column: a JSON list of names; NULL, an
    empty list or JSON null are none. Anything else raises, naming the column."""
    if not text:
        return None
    try:
        roles = json.loads(text)
    except ValueError:
        roles = text
    if roles is None or roles == []:
        return None
    return _role_list(roles, f"Column authenticated_roles ({text!r})")


_authentication: ContextVar[Authentication] = ContextVar(
    "dbos_authentication", default=NO_AUTHENTICATION)


def current_authentication() -> Authentication:
    """The identity code runs under: inside a workflow (its body and steps), the one the
    workflow was started with; elsewhere, that of the enclosing :class:`SetAuthentication`
    (none: every field None). Like the ``dbos`` package's ``DBOS.authenticated_user``,
    ``DBOS.authenticated_roles`` and ``DBOS.assumed_role``."""
    return _authentication.get()


class running_as:
    """Run the block under ``authentication`` (a workflow body, a step with required
    roles). A plain class, cheaper to enter than a generator's context manager: it wraps
    every workflow body."""

    __slots__ = ("_authentication", "_token")

    def __init__(self, authentication: Authentication) -> None:
        self._authentication = authentication

    def __enter__(self) -> None:
        # Set only when it changes: a set allocates, and a workflow usually runs under the
        # identity its starter had (most often none).
        self._token = (None if _authentication.get() is self._authentication
                       else _authentication.set(self._authentication))

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _authentication.reset(self._token)


class SetAuthentication:
    """Record ``user`` and ``roles`` (and the role assumed, one of them) on every workflow
    started or enqueued in this block, and check them against ``required_roles``; like the
    ``dbos`` package's ``DBOSContextSetAuth``. Inside a workflow it replaces, for the
    block, the identity its children inherit. ``SetAuthentication(None)`` starts without
    one."""

    def __init__(self, user: str | None, roles: Sequence[str] | None = None,
                 assumed_role: str | None = None) -> None:
        self.authentication = Authentication.of(user, roles, assumed_role)
        if assumed_role is not None and assumed_role not in (roles or ()):
            raise DBOSError(f"The assumed role {assumed_role!r} is not one of the roles "
                            f"{list(roles or ())!r}")

    def __enter__(self) -> Authentication:
        self._token = _authentication.set(self.authentication)
        return self.authentication

    def __exit__(self, *exc: object) -> None:
        _authentication.reset(self._token)


@dataclass
class RequiredRoles:
    """The roles one of which a function's caller must hold (None: anyone may call it).
    ``given``: by its decorator; otherwise its class's ``default_required_roles`` sets them
    when the class is decorated (after its methods were)."""

    roles: tuple[str, ...] | None = None
    given: bool = False

    @classmethod
    def of(cls, roles: Sequence[str] | None, what: str) -> RequiredRoles:
        return cls(required_roles_of(roles, what), roles is not None)


def required_roles_of(roles: Sequence[str] | None, what: str) -> tuple[str, ...] | None:
    """Check a decorator's ``required_roles`` (None or an empty list: no requirement)."""
    if roles is None:
        return None
    checked = _role_list(roles, f"{what}: required_roles")
    return checked or None


def authorize(kind: str, name: str, required: tuple[str, ...] | None,
              authentication: Authentication) -> Authentication:
    """The identity function ``name`` runs under: ``authentication``, acting under the
    first required role it holds; raises :class:`NotAuthorizedError` if it holds none."""
    if required is None:
        return authentication
    held = authentication.roles or ()
    for role in required:
        if role in held:
            return replace(authentication, assumed_role=role)
    raise NotAuthorizedError(kind, name, required, authentication.user, held)
