"""Statements that set up a connection's session (see dbos_async/sysdb/connection.py)."""

from __future__ import annotations

from dbos_async.sysdb.statements.base import Params, Query


def session_setting(name: str, value: str) -> Query:
    """Set ``name`` to ``value`` for the rest of the session: for a setting the server may
    not know, which cannot go in the startup packet (an unknown name there is an error)."""
    p = Params()
    return Query(f"SELECT set_config({p(name)}, {p(value)}, false)", p.values)
