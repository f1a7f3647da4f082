"""What routing by shard key reads of a Citus cluster's metadata: which node holds each hash
interval of the per-workflow tables (see dbos_async/_sysdb/citus_shards.py).

Both statements read Citus's metadata tables, which any role may read, on the coordinator or
on a worker node with metadata synced to it. They take no lock: each is one statement, so it
reads one snapshot of the metadata, and Citus changes a shard's placement (a move, a split)
in one transaction, so a snapshot holds either the old placement or the new one, never both
or neither.
"""

from __future__ import annotations

WORKFLOW_STATUS = "format('%I.%I', $1::text, 'workflow_status')"
"""The name of ``workflow_status`` in schema ``$1``, quoted by the server itself (``%I`` is
``quote_ident``), for ``to_regclass``: every schema name PostgreSQL accepts, in any case or
with any character, names its own table, and none can be read as SQL."""

SHARD_PLACEMENTS = f"""SELECT s.shardid AS shard_id,
       s.shardminvalue::integer AS min_hash,
       s.shardmaxvalue::integer AS max_hash,
       placed.nodename AS node_host,
       placed.nodeport AS node_port,
       colocated.tables,
       colocated.shards
FROM pg_catalog.pg_dist_partition t
JOIN pg_catalog.pg_dist_shard s ON s.logicalrelid = t.logicalrelid
LEFT JOIN LATERAL (
    SELECT n.nodename, n.nodeport
    FROM pg_catalog.pg_dist_placement p
    JOIN pg_catalog.pg_dist_node n ON n.groupid = p.groupid
    WHERE p.shardid = s.shardid
      AND p.shardstate = 1
      AND n.isactive AND n.noderole = 'primary'
    ORDER BY n.groupid
    LIMIT 1) placed ON true
CROSS JOIN LATERAL (
    SELECT array_agg(c.relname::text ORDER BY c.relname) AS tables,
           array_agg(cs.shardid::text ORDER BY c.relname) AS shards
    FROM pg_catalog.pg_dist_partition cp
    JOIN pg_catalog.pg_class c ON c.oid = cp.logicalrelid
    JOIN pg_catalog.pg_dist_shard cs ON cs.logicalrelid = cp.logicalrelid
    WHERE cp.colocationid = t.colocationid
      AND c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class
                            WHERE oid = t.logicalrelid)
      AND cs.shardminvalue = s.shardminvalue) colocated
WHERE t.logicalrelid = to_regclass({WORKFLOW_STATUS})
  AND t.partmethod = 'h'
ORDER BY min_hash"""
"""The hash-distributed shards of ``$1.workflow_status`` (every per-workflow table is
co-located with it, so its placements are theirs): each shard's hash interval and the node of
its active placement (shard state 1; a placement left to be deleted, or on a disabled or
secondary node, is not one). With a replication factor above 1 a shard has several such
placements; the one of the lowest group is taken, any of them reaching the shard. A shard with
none has NULL for its node. With each shard, the shards of the same interval of every table of
the schema co-located with it (``tables``, ``shards``: its own among them), whose names
``<table>_<shard>`` its statements can name on that node; the shard IDs as texts (asyncpg
reads a ``bigint[]`` only after asking the server about its type, a catalogue query that
takes a Citus node seconds). No rows: the table is missing or not hash-distributed (see
:data:`SHARDED_TABLE`)."""

SHARDED_TABLE = f"""SELECT to_regclass({WORKFLOW_STATUS}) IS NOT NULL AS table_exists,
       (SELECT t.partmethod::text FROM pg_catalog.pg_dist_partition t
        WHERE t.logicalrelid = to_regclass({WORKFLOW_STATUS})) AS partition_method"""
"""Why :data:`SHARD_PLACEMENTS` found no shards: whether ``$1.workflow_status`` exists on
this node, and how Citus distributes it (``h``: by hash, ``n``: a reference or local table
kept by Citus, NULL: a plain table Citus does not know)."""
