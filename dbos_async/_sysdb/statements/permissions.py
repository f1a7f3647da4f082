"""Statements granting an application's database role what it needs on the system schema
(DBOS Transact's grant list), so executors and clients can run as a least-privilege role
while migrations run as the schema's owner."""

from __future__ import annotations

from dbos_async._sysdb.statements.base import Params, Query, StatementBase


def quote_role(role: str) -> str:
    """A role name as a double-quoted SQL identifier (validated by the caller)."""
    return '"' + role.replace('"', '""') + '"'


class PermissionStatements(StatementBase):
    def role_exists(self, role: str) -> Query:
        p = Params()
        return Query(f"SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {p(role)})",
                     p.values)

    def grant_schema_permissions(self, role: str) -> list[Query]:
        """Usage of the schema; reading and writing its tables and sequences (not
        altering or dropping them: that stays the owner's); executing its functions; and
        the same on what later migrations create there. Identifiers cannot be parameters:
        the schema is quoted once at construction, the role by :func:`quote_role`."""
        schema, grantee = self.schema, quote_role(role)
        return [Query(sql) for sql in (
            f"GRANT USAGE ON SCHEMA {schema} TO {grantee}",
            f"GRANT ALL PRIVILEGES ON ALL TABLES IN SCHEMA {schema} TO {grantee}",
            f"GRANT ALL PRIVILEGES ON ALL SEQUENCES IN SCHEMA {schema} TO {grantee}",
            f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {grantee}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT ALL ON TABLES TO {grantee}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT ALL ON SEQUENCES TO {grantee}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT EXECUTE ON FUNCTIONS "
            f"TO {grantee}",
        )]
