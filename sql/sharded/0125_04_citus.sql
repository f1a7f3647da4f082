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
--   * dbos_migrations stays a local table of the coordinator: only the runner reads it.
-- The schema is found through a table's row type rather than written into a string literal,
-- so no schema name, whatever it contains, can end a literal early.
DO $dbos_fn$
DECLARE
    target_schema text;
    anchor        text;
    tbl           text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    SELECT n.nspname INTO target_schema
    FROM pg_catalog.pg_type t
    JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
    WHERE t.oid = pg_catalog.pg_typeof(NULL::{{schema}}.workflow_status);

    anchor := format('%I.workflow_status', target_schema);
    PERFORM create_distributed_table(anchor::regclass, 'shard_key');
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
