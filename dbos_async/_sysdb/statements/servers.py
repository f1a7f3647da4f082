"""What a connection learns about the server it reached, for fencing (see
dbos_async/_sysdb/fencing.py)."""

from __future__ import annotations

SERVER_STATE = """SELECT pg_is_in_recovery() AS in_recovery,
       CASE WHEN NOT pg_is_in_recovery()
                 AND to_regclass('pg_catalog.pg_dist_local_group') IS NULL
            THEN substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END AS timeline,
       pg_postmaster_start_time() AS started"""
"""Whether the server is a standby; a primary's current timeline (the first 8 hex digits
of the name of the WAL file it writes; a standby's is NULL: ``pg_walfile_name`` refuses to
run in recovery); and when its postmaster started, which tells two servers apart. Every
function here may be called by any role.

A node of a Citus cluster has no timeline here: each node is a server of its own, writable
beside the others, with its own timeline, so comparing them says nothing (a URL may list
several nodes); fencing a failed node is the cluster's HA manager's job."""

CITUS_INSTALLED = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
"""Whether the database is a Citus one (the other CITUS_ statements read its tables)."""

CITUS_NODE = """SELECT l.groupid AS group_id,
       EXISTS (SELECT 1 FROM pg_dist_node) AS knows_nodes,
       c.nodename AS coordinator_host, c.nodeport AS coordinator_port
FROM pg_dist_local_group l
LEFT JOIN LATERAL (SELECT nodename, nodeport FROM pg_dist_node
                   WHERE groupid = 0 AND noderole = 'primary'
                   ORDER BY isactive DESC LIMIT 1) c ON true"""
"""Which node of its Citus cluster the server is (group 0: the coordinator, or a node that
knows no cluster), whether it knows its cluster's nodes (metadata synced to it), and the
coordinator's address as it knows it. Both tables may be read by any role."""

CITUS_SHARDS_WITHOUT_TABLE = """SELECT NOT EXISTS (
           SELECT 1 FROM pg_catalog.pg_class c
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = $1 AND c.relname = 'workflow_status')
       AND EXISTS (
           SELECT 1 FROM pg_catalog.pg_class c
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = $1 AND c.relname ~ '^workflow_status_[0-9]+$')"""
"""Whether schema $1 holds shards of workflow_status but not the table itself: a worker
node of a cluster that did not sync its metadata to it."""

CITUS_OTHER_NODES = """SELECT nodename, nodeport FROM pg_dist_node
WHERE noderole = 'primary' AND isactive
  AND groupid <> (SELECT groupid FROM pg_dist_local_group)
ORDER BY groupid"""
"""The cluster's other nodes a writer may be connected to, as this node knows them: the
active primary of every group but this node's own (the coordinator's is group 0). Both
tables may be read by any role."""
