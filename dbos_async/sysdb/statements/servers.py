"""What a connection learns about the server it reached, for fencing (see
dbos_async/sysdb/fencing.py)."""

from __future__ import annotations

SERVER_STATE = """SELECT pg_is_in_recovery() AS in_recovery,
       CASE WHEN NOT pg_is_in_recovery()
            THEN substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END AS timeline,
       pg_postmaster_start_time() AS started"""
"""Whether the server is a standby; a primary's current timeline (the first 8 hex digits
of the name of the WAL file it writes; a standby's is NULL: ``pg_walfile_name`` refuses to
run in recovery); and when its postmaster started, which tells two servers apart. Every
function here may be called by any role."""
