-- DBOS system schema, version 125, sharded track, part 3 of 4: the SQL interface.
--
-- enqueue_workflow and send_message take the parameters of the unsharded functions
-- (../0125_03_functions.sql) plus a trailing shard_key, which is required here: a row without
-- a key cannot be placed. Functions pin search_path to pg_catalog and qualify every table.
--
-- There is no trigger on notifications. On Citus a trigger on a distributed table fires on the
-- worker holding the shard, and its NOTIFY never reaches listeners on the coordinator, which is
-- where clients connect. So the functions notify themselves, in the caller's session: the
-- notification is delivered where the caller is connected, at commit. For the same reason these
-- functions are not distributed with create_distributed_function: delegated to a worker, their
-- pg_notify would fire there.
--
-- Notification payloads name the key first, as '<length of key>:<key>:<rest>', the length
-- counted in characters; the length makes the key end unambiguous whatever it contains.

CREATE FUNCTION {{schema}}.enqueue_workflow(
    workflow_name        text,
    queue_name           text,
    positional_args      json[]  DEFAULT ARRAY[]::json[],
    named_args           json    DEFAULT '{}'::json,
    class_name           text    DEFAULT NULL,
    config_name          text    DEFAULT NULL,
    workflow_id          text    DEFAULT NULL,
    app_version          text    DEFAULT NULL,
    timeout_ms           bigint  DEFAULT NULL,
    deadline_epoch_ms    bigint  DEFAULT NULL,
    deduplication_id     text    DEFAULT NULL,
    priority             integer DEFAULT NULL,
    queue_partition_key  text    DEFAULT NULL,
    authenticated_user   text    DEFAULT NULL,
    authenticated_roles  text    DEFAULT NULL,
    delay_until_epoch_ms bigint  DEFAULT NULL,
    application_name     text    DEFAULT NULL,
    shard_key            text    DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $dbos_fn$
DECLARE
    wf_id       text;
    now_ms      bigint := (extract(epoch FROM now()) * 1000)::bigint;
    inputs_json text;
BEGIN
    IF shard_key IS NULL OR shard_key = '' THEN
        RAISE EXCEPTION 'enqueue_workflow: shard_key must be a non-empty string on a sharded system database'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF workflow_name IS NULL OR workflow_name = '' THEN
        RAISE EXCEPTION 'enqueue_workflow: workflow_name must be a non-empty string'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF queue_name IS NULL OR queue_name = '' THEN
        RAISE EXCEPTION 'enqueue_workflow: queue_name must be a non-empty string'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF named_args IS NOT NULL AND json_typeof(named_args) <> 'object' THEN
        RAISE EXCEPTION 'enqueue_workflow: named_args must be a JSON object, not %',
                json_typeof(named_args)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF workflow_id = '' THEN
        RAISE EXCEPTION 'enqueue_workflow: workflow_id must not be empty (pass NULL for a new ID)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF delay_until_epoch_ms < 0 THEN
        RAISE EXCEPTION 'enqueue_workflow: delay_until_epoch_ms must be >= 0, got %',
                delay_until_epoch_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    wf_id := coalesce(workflow_id, gen_random_uuid()::text);
    inputs_json := json_build_object(
        'positionalArgs', coalesce(positional_args, ARRAY[]::json[]),
        'namedArgs', coalesce(named_args, '{}'::json)
    )::text;

    BEGIN
        INSERT INTO {{schema}}.workflow_status (
            shard_key, workflow_uuid, status, name, class_name, config_name,
            queue_name, deduplication_id, priority, queue_partition_key,
            application_version, application_name,
            authenticated_user, authenticated_roles,
            workflow_timeout_ms, workflow_deadline_epoch_ms, delay_until_epoch_ms,
            created_at, updated_at, recovery_attempts,
            owner_xid, serialization
        ) VALUES (
            enqueue_workflow.shard_key, wf_id,
            CASE WHEN delay_until_epoch_ms IS NULL THEN 'ENQUEUED' ELSE 'DELAYED' END,
            workflow_name, class_name, config_name,
            queue_name, deduplication_id, coalesce(priority, 0), queue_partition_key,
            app_version, application_name,
            authenticated_user, authenticated_roles,
            timeout_ms, deadline_epoch_ms, delay_until_epoch_ms,
            now_ms, now_ms, 0,
            gen_random_uuid()::text, 'portable_json'
        )
        -- The constraint rather than its columns: a column list would read shard_key as the
        -- parameter of that name.
        ON CONFLICT ON CONSTRAINT workflow_status_pkey
            DO UPDATE SET updated_at = excluded.updated_at;
    EXCEPTION WHEN unique_violation THEN
        -- The primary key is handled above, so this is the (key, queue, deduplication ID) index.
        RAISE EXCEPTION 'DBOS queue duplicated'
            USING ERRCODE = 'unique_violation',
                  DETAIL = format(
                      'Workflow %s: queue %s already has a workflow with deduplication ID %s',
                      wf_id, queue_name, deduplication_id);
    END;

    INSERT INTO {{schema}}.workflow_input (shard_key, workflow_uuid, inputs, retention_timestamp)
    VALUES (enqueue_workflow.shard_key, wf_id, inputs_json, now_ms)
    ON CONFLICT ON CONSTRAINT workflow_input_pkey DO NOTHING;

    -- Wake the queue's dequeuers, as an executor's enqueue does; sent at commit.
    PERFORM pg_notify('dbos_enqueue_channel', queue_name);
    RETURN wf_id;
END;
$dbos_fn$;


-- Send a message to the workflow destination_id under shard_key. With message_id the send is
-- idempotent per key: a second send with the same ID under the same key is ignored.
CREATE FUNCTION {{schema}}.send_message(
    destination_id text,
    message        json,
    topic          text DEFAULT NULL,
    message_id     text DEFAULT NULL,
    shard_key      text DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $dbos_fn$
DECLARE
    stored_topic text := coalesce(topic, '__null__topic__');  -- recv without a topic reads this
BEGIN
    IF shard_key IS NULL OR shard_key = '' THEN
        RAISE EXCEPTION 'send_message: shard_key must be a non-empty string on a sharded system database'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO {{schema}}.notifications (
        shard_key, message_uuid, destination_uuid, topic, message, serialization
    ) VALUES (
        send_message.shard_key,
        coalesce(message_id, gen_random_uuid()::text),
        destination_id,
        stored_topic,
        message::text,
        'portable_json'
    )
    ON CONFLICT ON CONSTRAINT notifications_pkey DO NOTHING;

    -- Only a new message wakes the receiver, as the unsharded trigger fires only on a new row.
    IF FOUND THEN
        PERFORM pg_notify(
            'dbos_notifications_channel',
            char_length(send_message.shard_key) || ':' || send_message.shard_key || ':'
                || destination_id || '::' || stored_topic);
    END IF;
EXCEPTION WHEN foreign_key_violation THEN
    RAISE EXCEPTION 'DBOS non-existent workflow'
        USING ERRCODE = 'foreign_key_violation',
              DETAIL = format('send_message: destination workflow %s does not exist under shard key %s',
                              destination_id, shard_key);
END;
$dbos_fn$;

-- lock_shards_here makes writing the tables of these shards on this node (Citus's shards' own
-- tables, named directly) as safe as a write on the distributed tables, which Citus routes
-- here: it takes the lock a distributed write takes, each shard's metadata lock in share mode
-- to commit, which a shard move or split takes exclusively, on every node, before it changes
-- the placement. It then reads the placements in a new snapshot, after the lock (each
-- statement of a function gets its own): if a shard's only placement is not on this node
-- (moved, split, or kept in several copies), the call fails with SQLSTATE DBS01, for the
-- caller to look the shard up again, and its transaction writes nothing. A shard split since
-- the caller looked it up is gone from the metadata (its tables may linger here until Citus's
-- cleanup drops them); Citus then cannot name its lock and raises an internal error, which
-- becomes DBS01 too. Shards go in the order given, which callers keep ascending, so two
-- callers cannot deadlock on them.
-- Returns true. Callers: run_routed, and the statements of a node's group-commit batch,
-- which call it first (see dbos_async's routed writes).
CREATE FUNCTION {{schema}}.lock_shards_here(shards bigint[])
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog
AS $dbos_fn$
DECLARE
    moved bigint;
BEGIN
    BEGIN
        -- ShareLock (5), to commit: no move or split of a shard commits until this write has.
        PERFORM lock_shard_metadata(5, shards);
    EXCEPTION WHEN internal_error THEN
        -- A shard gone from the metadata (split) is refused below; any other error stands.
        IF NOT EXISTS (SELECT 1 FROM unnest(shards) AS s(id)
                       WHERE NOT EXISTS (SELECT 1 FROM pg_dist_shard d WHERE d.shardid = s.id))
        THEN
            RAISE;
        END IF;
    END;
    moved := (SELECT s.id FROM unnest(shards) AS s(id)
              WHERE (SELECT array_agg(p.groupid) FROM pg_dist_placement p
                     WHERE p.shardid = s.id)
                    IS DISTINCT FROM ARRAY[(SELECT g.groupid FROM pg_dist_local_group g)]
              LIMIT 1);
    IF moved IS NOT NULL THEN
        RAISE EXCEPTION 'lock_shards_here: shard % has no placement of its own on this node',
                moved
            USING ERRCODE = 'DBS01';
    END IF;
    RETURN true;
END;
$dbos_fn$;

-- run_routed runs one workflow's write, made of single-table statements on one shard key, in
-- the caller's transaction, so a write costs its caller one round trip however many tables it
-- touches. On Citus every statement that names one key and one table runs whole on the node
-- holding that key's shard; a statement writing several tables at once (a modifying CTE)
-- would be gathered through the node that plans it.
--
-- steps is a JSON array of {"sql", "args", "rows", "gate", "many"}: the statement, its
-- parameters as texts (at most 48: the statement reads them as $1 .. $48, each text, and casts
-- them), whether it returns a row, and whether the write stops unless it returned one whose
-- "go" column, if it has one, is true (a fence: the workflow is PENDING and owned; a checkpoint
-- that landed). With "many" (on a shard's own tables only), the statement returns any number
-- of rows: a group-commit batch's rows of several keys of the shard, written in one statement.
-- Returns one element per step run: the row it returned, as JSON, or null; for "many", the
-- array of its rows.
-- The parameters go positionally: Citus 13.2 crashed running statements that read them as
-- subscripts of one array, and when this function was distributed (delegated to a worker).
--
-- With shard (Citus only), the statements name that shard's tables on this node rather than
-- the distributed tables: they run as plain PostgreSQL statements, without the distributed
-- planner and executor Citus runs for each statement on a distributed table (most of a
-- routed write's cost there), after lock_shards_here (above) locked and checked the shard.
-- With shards, the same for several shards of this node, each locked and checked; the whole
-- call fails if one was moved.
CREATE FUNCTION {{schema}}.run_routed(shard_key text, steps jsonb, shard bigint DEFAULT NULL,
                                      prepared_here text[] DEFAULT NULL,
                                      shards bigint[] DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog
-- Each prepared statement writes or reads one key's rows by primary key: its generic plan is
-- as good as any, and planning it anew for every call cost a third of its run.
SET plan_cache_mode = force_generic_plan
AS $dbos_fn$
DECLARE
    step     jsonb;
    args     text[];
    returned record;
    counted  bigint;
    result   jsonb;
    results  jsonb := '[]'::jsonb;
    prepared text;
    run      text;
BEGIN
    IF shard IS NOT NULL THEN
        shards := ARRAY[shard];
    END IF;
    IF shards IS NOT NULL THEN
        PERFORM {{schema}}.lock_shards_here(shards);
    END IF;
    FOR step IN SELECT value FROM jsonb_array_elements(steps) LOOP
        args := ARRAY(SELECT jsonb_array_elements_text(step -> 'args'));
        result := NULL;
        counted := 0;
        IF shards IS NOT NULL THEN
            -- On a shard's own tables each statement is prepared once per session and run by
            -- name, so its plan is kept, as a client's prepared statement's is (planning
            -- was most of a statement's cost here). Its parameters are texts, passed as
            -- literals that read back as the same texts.
            -- Which are prepared already is read once a call (reading it costs as much as
            -- a statement), or given by the caller; one prepared since is looked up alone.
            IF prepared_here IS NULL THEN
                prepared_here := ARRAY(SELECT s.name FROM pg_prepared_statements s
                                       WHERE s.name LIKE 'dbos\_routed\_%');
            END IF;
            prepared := 'dbos_routed_' || md5(step ->> 'sql');
            IF NOT prepared = ANY (prepared_here)
               AND NOT EXISTS (SELECT 1 FROM pg_prepared_statements s WHERE s.name = prepared) THEN
                EXECUTE format('PREPARE %I%s AS %s', prepared,
                               (SELECT coalesce('(' || string_agg('text', ',') || ')', '')
                                FROM unnest(args)),
                               step ->> 'sql');
                prepared_here := prepared_here || prepared;
            END IF;
            run := format('EXECUTE %I%s', prepared,
                          (SELECT coalesce('(' || string_agg(quote_nullable(a), ',' ORDER BY i)
                                           || ')', '')
                           FROM unnest(args) WITH ORDINALITY AS u(a, i)));
            IF (step ->> 'many')::boolean THEN
                result := '[]'::jsonb;
                FOR returned IN EXECUTE run LOOP
                    result := result || jsonb_build_array(to_jsonb(returned));
                END LOOP;
            ELSIF (step ->> 'rows')::boolean THEN
                EXECUTE run INTO returned;
                GET DIAGNOSTICS counted = ROW_COUNT;
            ELSE
                EXECUTE run;
            END IF;
        ELSIF (step ->> 'many')::boolean THEN
            RAISE EXCEPTION 'run_routed: a step of many rows runs on a shard''s own tables only'
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF (step ->> 'rows')::boolean THEN
            EXECUTE step ->> 'sql' INTO returned USING
                args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8],
                args[9], args[10], args[11], args[12], args[13], args[14], args[15], args[16],
                args[17], args[18], args[19], args[20], args[21], args[22], args[23], args[24],
                args[25], args[26], args[27], args[28], args[29], args[30], args[31], args[32],
                args[33], args[34], args[35], args[36], args[37], args[38], args[39], args[40],
                args[41], args[42], args[43], args[44], args[45], args[46], args[47], args[48];
            GET DIAGNOSTICS counted = ROW_COUNT;
        ELSE
            EXECUTE step ->> 'sql' USING
                args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8],
                args[9], args[10], args[11], args[12], args[13], args[14], args[15], args[16],
                args[17], args[18], args[19], args[20], args[21], args[22], args[23], args[24],
                args[25], args[26], args[27], args[28], args[29], args[30], args[31], args[32],
                args[33], args[34], args[35], args[36], args[37], args[38], args[39], args[40],
                args[41], args[42], args[43], args[44], args[45], args[46], args[47], args[48];
        END IF;
        IF counted > 0 THEN
            result := to_jsonb(returned);
        END IF;
        results := results || jsonb_build_array(result);
        IF (step ->> 'gate')::boolean
           AND (result IS NULL OR NOT coalesce((result ->> 'go')::boolean, true)) THEN
            EXIT;
        END IF;
    END LOOP;
    RETURN results;
END;
$dbos_fn$;
