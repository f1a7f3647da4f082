"""Statements of executor IDs held by live processes.

An executor that was given no ``executor_id`` claims one (``local``, ``local-2``, ...) by
holding a session-level advisory lock named by the schema, the application and the ID, on
a connection of its own: two live processes never hold the same ID, and PostgreSQL frees
it when the holder's session ends (the process exited or died).
"""

from __future__ import annotations

import json

from dbos_async._sysdb.statements.base import Params, Query, StatementBase
from dbos_async._sysdb.statements.management.control import advisory_lock_key

# Server-side keepalives of the lock's session: a holder whose machine vanished without
# closing its connection releases the ID after about idle + interval * count seconds
# (10 + 5 * 3 = 25), rather than after the operating system's default of two hours; the
# user timeout bounds the same way a send the peer never acknowledges. Failover takes over
# the ID's workflows once the lock is free (see dbos_async/_executor/failover.py).
HALF_OPEN_BOUND_SECONDS = 25
LOCK_SESSION_SETTINGS = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": str(HALF_OPEN_BOUND_SECONDS * 1000),
    # An idle-session timeout set for the server would end the session, and free the ID,
    # while its holder lives.
    "idle_session_timeout": "0",
}


class ExecutorIdStatements(StatementBase):
    def executor_lock_key(self, executor_id: str, application_name: str | None = None) -> int:
        """The advisory lock key of ``executor_id`` in this schema and application (this
        handle's, unless another is named)."""
        app = application_name if application_name is not None else self.app_name
        return advisory_lock_key(json.dumps(["dbos_async.executor_id", self.schema, app,
                                             executor_id]))

    def held_advisory_keys(self) -> Query:
        """Every bigint advisory lock some session of this database holds, as the unsigned
        key (classid is its high half, objid its low): who is alive, read from the lock
        table without taking a lock."""
        return Query(
            """SELECT (l.classid::bigint << 32) | l.objid::bigint AS key
               FROM pg_catalog.pg_locks l
               WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                 AND l.database = (SELECT oid FROM pg_catalog.pg_database
                                   WHERE datname = current_database())""")

    def try_executor_lock(self, executor_id: str) -> Query:
        """Take ``executor_id`` for this session if no other session holds it (true/false,
        at once). Session-level, not transaction-level: the ID is held for as long as the
        connection lives, with no transaction left open; the same statement makes the
        session one that no server timeout ends while it idles."""
        p = Params()
        settings = ", ".join(f"set_config({p(name)}, {p(value)}, false) s{i}"
                             for i, (name, value) in enumerate(LOCK_SESSION_SETTINGS.items()))
        return Query(
            f"""SELECT pg_try_advisory_lock({p(self.executor_lock_key(executor_id), 'bigint')})
                  AS acquired,
                  (SELECT backend_start FROM pg_catalog.pg_stat_activity
                   WHERE pid = pg_backend_pid()) AS session_start
                FROM {settings}""",
            p.values,
        )

    def executor_lock_holder(self, executor_id: str) -> Query:
        """The other session holding ``executor_id``, if any (pid, session_start,
        application_name): a re-acquire that fails tells its own half-open old session
        (which it may end) from another process by the pid and the session's start."""
        unsigned = self.executor_lock_key(executor_id) & 0xFFFF_FFFF_FFFF_FFFF
        p = Params()
        # A bigint advisory key is stored as classid (high half) and objid (low half).
        return Query(
            f"""SELECT l.pid, a.backend_start AS session_start, a.application_name
                FROM pg_catalog.pg_locks l
                LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
                WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                  AND l.database = (SELECT oid FROM pg_catalog.pg_database
                                    WHERE datname = current_database())
                  AND l.classid::bigint = {p(unsigned >> 32, 'bigint')}
                  AND l.objid::bigint = {p(unsigned & 0xFFFF_FFFF, 'bigint')}
                  AND l.pid <> pg_backend_pid()
                LIMIT 1""",
            p.values,
        )

    def end_session(self, pid: int) -> Query:
        """End this role's old session ``pid`` (left half-open by a lost connection), so
        the ID it still holds for this process is freed."""
        p = Params()
        return Query(f"SELECT pg_terminate_backend({p(pid, 'integer')})", p.values)

    def try_other_executor_lock(self, executor_id: str) -> Query:
        """Take another executor's ID lock if its holder is gone (true/false, at once): held
        while failover claims that executor's workflows, so it cannot come back meanwhile."""
        p = Params()
        return Query(f"SELECT pg_try_advisory_lock("
                     f"{p(self.executor_lock_key(executor_id), 'bigint')}) AS acquired",
                     p.values)

    def release_other_executor_lock(self, executor_id: str) -> Query:
        """Let go of another executor's ID lock taken by :meth:`try_other_executor_lock`."""
        p = Params()
        return Query(f"SELECT pg_advisory_unlock("
                     f"{p(self.executor_lock_key(executor_id), 'bigint')}) AS released",
                     p.values)
