-- DBOS system schema, version 125, sharded track, part 4 of 4: distribution on Citus.
--
-- Runs only where the citus extension is installed in this database; on plain PostgreSQL the
-- tables stay local and this file does nothing. It runs in the step's transaction, after the
-- tables, indexes and foreign keys exist (Citus copies them onto each shard):
--   * the per-workflow tables are hash-distributed by shard_key, all in workflow_status's
--     co-location group, so one key's rows share a node and the foreign keys hold per shard;
--     workflow_status goes first, as a foreign key may only reference a table already
--     distributed;
--   * the global tables become reference tables, copied whole to every node, so statements
--     joining them with one key's rows still run on that key's node;
--   * dbos_migrations stays a local table of the coordinator: only the runner reads it;
--   * the tables get citus.shard_count shards where the operator set it (in the server's
--     configuration, the database's or role's settings, or the session), else one shard per
--     worker node (one at least): a group-commit batch costs a node about the same for each
--     shard of its own that it writes, so fewer shards per node keep batches cheap; adding a
--     worker node later means splitting shards onto it (see docs/operations/citus.md).
-- The schema is found through a table's row type rather than written into a string literal,
-- so no schema name, whatever it contains, can end a literal early.
DO $dbos_fn$
DECLARE
    target_schema text;
    anchor        text;
    tbl           text;
    shards        integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    SELECT n.nspname INTO target_schema
    FROM pg_catalog.pg_type t
    JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
    WHERE t.oid = pg_catalog.pg_typeof(NULL::{{schema}}.workflow_status);

    anchor := format('%I.workflow_status', target_schema);
    IF (SELECT source FROM pg_catalog.pg_settings WHERE name = 'citus.shard_count') = 'default'
    THEN
        SELECT greatest(count(*), 1)::integer INTO shards
        FROM pg_catalog.pg_dist_node
        WHERE groupid <> 0 AND isactive AND noderole = 'primary';
    ELSE
        shards := current_setting('citus.shard_count')::integer;
    END IF;
    PERFORM create_distributed_table(anchor::regclass, 'shard_key', shard_count => shards);
    FOREACH tbl IN ARRAY ARRAY['workflow_input', 'workflow_output', 'operation_outputs',
                               'notifications', 'workflow_events', 'workflow_events_history',
                               'streams'] LOOP
        PERFORM create_distributed_table(format('%I.%I', target_schema, tbl)::regclass,
                                         'shard_key', colocate_with => anchor);
    END LOOP;
    FOREACH tbl IN ARRAY ARRAY['queues', 'application_versions', 'workflow_schedules',
                               'event_dispatch_kv'] LOOP
        PERFORM create_reference_table(format('%I.%I', target_schema, tbl)::regclass);
    END LOOP;
END;
$dbos_fn$;
