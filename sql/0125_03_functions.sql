-- DBOS system schema, version 125 (baseline), part 3 of 3: functions and the notification trigger.
--
-- These functions are an interface: clients in any language (and the DBOS tooling) call them by
-- these exact signatures, so names, argument order, types and defaults must not change.
-- Every function pins search_path to pg_catalog so a caller's search_path cannot redirect a
-- built-in; table names are therefore always qualified with {{schema}}.
-- Bodies are dollar-quoted with the tag $dbos_fn$; the runner picks another tag in the rare case
-- that the quoted schema name itself contains it.

-- LISTEN/NOTIFY wake-up for recv: payload '<destination workflow ID>::<topic>'.
CREATE FUNCTION {{schema}}.notifications_function()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $dbos_fn$
BEGIN
    PERFORM pg_notify('dbos_notifications_channel', NEW.destination_uuid || '::' || NEW.topic);
    RETURN NULL;  -- AFTER trigger: the result is ignored
END;
$dbos_fn$;

CREATE TRIGGER dbos_notifications_trigger
    AFTER INSERT ON {{schema}}.notifications
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.notifications_function();


-- Enqueue a workflow from plain SQL. The inputs are stored in the portable JSON format,
-- {"positionalArgs": [...], "namedArgs": {...}}, so any DBOS SDK can run the workflow.
-- Enqueueing an existing workflow ID again is a no-op apart from touching updated_at, which
-- makes retries of the same call safe. Returns the workflow ID.
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
    application_name     text    DEFAULT NULL
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
    -- NULL arguments are stored as empty ones, so readers always find an array and an object.
    inputs_json := json_build_object(
        'positionalArgs', coalesce(positional_args, ARRAY[]::json[]),
        'namedArgs', coalesce(named_args, '{}'::json)
    )::text;

    BEGIN
        INSERT INTO {{schema}}.workflow_status (
            workflow_uuid, status, name, class_name, config_name,
            queue_name, deduplication_id, priority, queue_partition_key,
            application_version, application_name,
            authenticated_user, authenticated_roles,
            workflow_timeout_ms, workflow_deadline_epoch_ms, delay_until_epoch_ms,
            created_at, updated_at, recovery_attempts,
            owner_xid, serialization
        ) VALUES (
            wf_id,
            CASE WHEN delay_until_epoch_ms IS NULL THEN 'ENQUEUED' ELSE 'DELAYED' END,
            workflow_name, class_name, config_name,
            queue_name, deduplication_id, coalesce(priority, 0), queue_partition_key,
            app_version, application_name,
            authenticated_user, authenticated_roles,
            timeout_ms, deadline_epoch_ms, delay_until_epoch_ms,
            now_ms, now_ms, 0,
            -- A fresh owner: no executor has claimed this workflow yet.
            gen_random_uuid()::text, 'portable_json'
        )
        ON CONFLICT (workflow_uuid) DO UPDATE SET updated_at = excluded.updated_at;
    EXCEPTION WHEN unique_violation THEN
        -- The primary key is handled above, so this is the (queue, deduplication ID) index.
        RAISE EXCEPTION 'DBOS queue duplicated'
            USING ERRCODE = 'unique_violation',
                  DETAIL = format(
                      'Workflow %s: queue %s already has a workflow with deduplication ID %s',
                      wf_id, queue_name, deduplication_id);
    END;

    INSERT INTO {{schema}}.workflow_input (workflow_uuid, inputs, retention_timestamp)
    VALUES (wf_id, inputs_json, now_ms)
    ON CONFLICT (workflow_uuid) DO NOTHING;

    RETURN wf_id;
END;
$dbos_fn$;


-- Send a message to a workflow from plain SQL (the SQL side of DBOS.send). With message_id
-- the send is idempotent: a second send with the same ID is ignored.
CREATE FUNCTION {{schema}}.send_message(
    destination_id text,
    message        json,
    topic          text DEFAULT NULL,
    message_id     text DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $dbos_fn$
BEGIN
    INSERT INTO {{schema}}.notifications (
        message_uuid, destination_uuid, topic, message, serialization
    ) VALUES (
        coalesce(message_id, gen_random_uuid()::text),
        destination_id,
        -- recv without a topic reads this sentinel.
        coalesce(topic, '__null__topic__'),
        message::text,
        'portable_json'
    )
    ON CONFLICT (message_uuid) DO NOTHING;
EXCEPTION WHEN foreign_key_violation THEN
    RAISE EXCEPTION 'DBOS non-existent workflow'
        USING ERRCODE = 'foreign_key_violation',
              DETAIL = format('send_message: destination workflow %s does not exist',
                              destination_id);
END;
$dbos_fn$;
