"""Statements of application versions: registration, listing and the latest version.

Version names are unique across the applications sharing a system database; a named
application owns the versions it registers, and unclaimed (pre-upgrade) ones belong to every
application until one claims them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from dbos_async._sysdb.statements.base import Params, Query, StatementBase


@dataclass(frozen=True)
class VersionRecord:
    """A row of ``application_versions``."""

    version_id: str
    version_name: str
    version_timestamp: int
    created_at: int
    application_name: str | None = None


class VersionStatements(StatementBase):
    def _new_id(self, p: Params) -> str:
        return p(str(uuid.uuid4()))

    def _insert_version(self, version_id: str, name: str, stamp: str, created: str, app: str,
                        unless: str) -> str:
        """Insert a version (``version_id``, ``name``, ``stamp``, ``created`` and ``app`` are
        parameters: the ID is drawn in Python, as Citus runs no volatile function in a write)
        unless the CTE ``unless`` already updated it. Targetless DO NOTHING: absorbs a
        concurrent registrar under either the global or the per-application uniqueness of
        version names."""
        return f"""INSERT INTO {self.table('application_versions')}
                  (version_id, version_name, version_timestamp, created_at, application_name)
                SELECT {version_id}, {name}, {stamp}, {created}, {app}
                WHERE NOT EXISTS (SELECT 1 FROM {unless})
                ON CONFLICT DO NOTHING"""

    def register_version(self, version_name: str, now_ms: int) -> Query:
        """Record this application version; an existing one keeps its original timestamp.

        A named application claims an unclaimed (pre-upgrade) row in place; a row another
        application owns is left alone, and :meth:`version_owner` read afterwards reports
        the collision. A nameless registrar leaves the owner untouched."""
        p = Params()
        name, app, now = p(version_name), p(self.app_name, "text"), p(now_ms, "bigint")
        return Query(
            f"""WITH claimed AS (
                  UPDATE {self.table('application_versions')} SET application_name = {app}
                  WHERE {self.global_(None, p)} AND version_name = {name}
                    AND application_name IS NULL AND {app} IS NOT NULL
                  RETURNING 1
                )
                {self._insert_version(self._new_id(p), name, now, now, app, 'claimed')}""",
            p.values,
        )

    def set_latest_version(self, version_name: str, now_ms: int) -> Query:
        """Bump ``version_name`` above every other version (registering it if unknown)."""
        p = Params()
        table = self.table("application_versions")
        now = p(now_ms, "bigint")
        # Strictly later than the newest, even if the clock is behind a peer's.
        stamp = (f"GREATEST({now}, (SELECT COALESCE(max(version_timestamp), 0) + 1"
                 f" FROM {table} WHERE {self.global_(None, p)}))")
        name, app = p(version_name), p(self.app_name, "text")
        # Only this application's own or an unclaimed version is bumped (and claimed); one
        # owned by another application is left alone (the caller then reports it).
        return Query(
            f"""WITH bumped AS (
                  UPDATE {table} SET version_timestamp = {stamp},
                    application_name = COALESCE(application_name, {app})
                  WHERE {self.global_(None, p)} AND version_name = {name}
                    AND {self.own_scope(None, p)}
                  RETURNING 1
                )
                {self._insert_version(self._new_id(p), name, stamp, now, app, 'bumped')}""",
            p.values,
        )

    def version_owner(self, version_name: str) -> Query:
        """The application owning a version name (no row, or NULL: unclaimed)."""
        p = Params()
        return Query(
            f"""SELECT application_name FROM {self.table('application_versions')}
                WHERE {self.global_(None, p)} AND version_name = {p(version_name)}
                ORDER BY application_name NULLS LAST LIMIT 1""",
            p.values,
        )

    def list_versions(self) -> Query:
        """This application's versions and unclaimed ones (all, when it has no name)."""
        p = Params()
        return Query(
            f"""SELECT {self.VERSION_COLUMNS} FROM {self.table('application_versions')}
                WHERE {self.global_(None, p)} AND {self.own_scope(None, p)}
                ORDER BY version_timestamp DESC, version_name""",
            p.values,
        )

    def latest_version(self) -> Query:
        """The newest of this application's own and unclaimed versions."""
        p = Params()
        return Query(self.latest_version_sql(p), p.values)
