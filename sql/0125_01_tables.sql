-- DBOS system schema, version 125 (baseline), part 1 of 3: tables and their constraints.
--
-- {{schema}} is replaced by the runner (dbos_async/_sysdb/migrations.py) with the validated,
-- double-quoted schema identifier. All three 0125_* files run in one transaction, together with
-- the version bump. The bookkeeping table dbos_migrations is not here: the runner creates it
-- before any step, as the dbos package does.
--
-- Column order, types, defaults and constraint names are those of a database the dbos package
-- migrated to version 125, so both libraries read and write the same catalog. Timestamps are
-- integer milliseconds since the Unix epoch.

-- One row per workflow: its identity, state, queue placement and (legacy) result columns.
CREATE TABLE {{schema}}.workflow_status (
    workflow_uuid              text NOT NULL,
    status                     text,
    name                       text,
    authenticated_user         text,
    assumed_role               text,
    authenticated_roles        text,
    request                    text,
    output                     text,
    error                      text,
    executor_id                text,
    created_at                 bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    updated_at                 bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    application_version        text,
    application_id             text,
    class_name                 varchar(255) DEFAULT NULL,
    config_name                varchar(255) DEFAULT NULL,
    recovery_attempts          bigint DEFAULT 0,
    queue_name                 text,
    workflow_timeout_ms        bigint,
    workflow_deadline_epoch_ms bigint,
    inputs                     text,
    started_at_epoch_ms        bigint,
    deduplication_id           text,
    priority                   integer NOT NULL DEFAULT 0,
    queue_partition_key        text,
    forked_from                text,
    owner_xid                  text,
    parent_workflow_id         text,
    serialization              text,
    delay_until_epoch_ms       bigint,
    was_forked_from            boolean NOT NULL DEFAULT false,
    rate_limited               boolean NOT NULL DEFAULT false,
    completed_at               bigint,
    attributes                 jsonb,
    schedule_name              text,
    debounce_deadline_epoch_ms bigint,
    is_debounced               boolean NOT NULL DEFAULT false,
    application_name           text,
    creator_xid                text,
    CONSTRAINT workflow_status_pkey PRIMARY KEY (workflow_uuid)
);

-- Step results. No foreign key to workflow_status (removed at DBOS version 112), so steps
-- can be recorded and garbage-collected independently of their workflow row.
CREATE TABLE {{schema}}.operation_outputs (
    workflow_uuid         text NOT NULL,
    function_id           integer NOT NULL,
    function_name         text NOT NULL DEFAULT '',
    output                text,
    error                 text,
    child_workflow_id     text,
    started_at_epoch_ms   bigint,
    completed_at_epoch_ms bigint,
    serialization         text,
    application_name      text,
    retention_timestamp   bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    CONSTRAINT operation_outputs_pkey PRIMARY KEY (workflow_uuid, function_id)
);

-- Messages sent to a workflow (send/recv). Inserting a row wakes listeners via the trigger
-- defined in 0125_03_functions.sql.
CREATE TABLE {{schema}}.notifications (
    message_uuid            text NOT NULL DEFAULT gen_random_uuid(),
    destination_uuid        text NOT NULL,
    topic                   text,
    message                 text NOT NULL,
    created_at_epoch_ms     bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    serialization           text,
    consumed                boolean NOT NULL DEFAULT false,
    consumed_by_function_id integer,
    CONSTRAINT notifications_pkey PRIMARY KEY (message_uuid),
    CONSTRAINT notifications_destination_uuid_fkey FOREIGN KEY (destination_uuid)
        REFERENCES {{schema}}.workflow_status (workflow_uuid)
        ON UPDATE CASCADE ON DELETE CASCADE
);

-- Latest value of each event a workflow published (set_event/get_event).
CREATE TABLE {{schema}}.workflow_events (
    workflow_uuid text NOT NULL,
    key           text NOT NULL,
    value         text NOT NULL,
    serialization text,
    CONSTRAINT workflow_events_pkey PRIMARY KEY (workflow_uuid, key),
    CONSTRAINT workflow_events_workflow_uuid_fkey FOREIGN KEY (workflow_uuid)
        REFERENCES {{schema}}.workflow_status (workflow_uuid)
        ON UPDATE CASCADE ON DELETE CASCADE
);

-- Every value of each event, by the step that set it, so forks and replays see the value
-- that was current at that step.
CREATE TABLE {{schema}}.workflow_events_history (
    workflow_uuid text NOT NULL,
    function_id   integer NOT NULL,
    key           text NOT NULL,
    value         text NOT NULL,
    serialization text,
    CONSTRAINT workflow_events_history_pkey PRIMARY KEY (workflow_uuid, function_id, key),
    CONSTRAINT workflow_events_history_workflow_uuid_fkey FOREIGN KEY (workflow_uuid)
        REFERENCES {{schema}}.workflow_status (workflow_uuid)
        ON UPDATE CASCADE ON DELETE CASCADE
);

-- Append-only streams a workflow writes, read by offset.
CREATE TABLE {{schema}}.streams (
    workflow_uuid text NOT NULL,
    key           text NOT NULL,
    value         text NOT NULL,
    "offset"      integer NOT NULL,
    function_id   integer NOT NULL DEFAULT 0,
    serialization text,
    CONSTRAINT streams_pkey PRIMARY KEY (workflow_uuid, key, "offset"),
    CONSTRAINT streams_workflow_uuid_fkey FOREIGN KEY (workflow_uuid)
        REFERENCES {{schema}}.workflow_status (workflow_uuid)
        ON UPDATE CASCADE ON DELETE CASCADE
);

-- Key-value state of event dispatchers (e.g. the last offset a consumer handled).
CREATE TABLE {{schema}}.event_dispatch_kv (
    service_name     text NOT NULL,
    workflow_fn_name text NOT NULL,
    key              text NOT NULL,
    value            text,
    update_seq       numeric(38, 0),
    update_time      numeric(38, 15),
    CONSTRAINT event_dispatch_kv_pkey PRIMARY KEY (service_name, workflow_fn_name, key)
);

-- Schedules stored in the database (cron-like), with their backfill state.
CREATE TABLE {{schema}}.workflow_schedules (
    schedule_id         text NOT NULL,
    schedule_name       text NOT NULL,
    workflow_name       text NOT NULL,
    workflow_class_name text,
    schedule            text NOT NULL,
    status              text NOT NULL DEFAULT 'ACTIVE',
    context             text NOT NULL,
    last_fired_at       text,
    automatic_backfill  boolean NOT NULL DEFAULT false,
    cron_timezone       text,
    queue_name          text,
    application_name    text,
    CONSTRAINT workflow_schedules_pkey PRIMARY KEY (schedule_id),
    CONSTRAINT workflow_schedules_schedule_name_key UNIQUE (schedule_name)
);

-- Application versions seen by this database. The global uniqueness of version_name is
-- kept for older DBOS releases; newer ones rely on the per-application partial indexes.
CREATE TABLE {{schema}}.application_versions (
    version_id        text NOT NULL,
    version_name      text NOT NULL,
    version_timestamp bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    created_at        bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    application_name  text,
    CONSTRAINT application_versions_pkey PRIMARY KEY (version_id),
    CONSTRAINT application_versions_version_name_key UNIQUE (version_name)
);

-- Queues declared in the database, with their flow-control settings.
CREATE TABLE {{schema}}.queues (
    queue_id                        text NOT NULL DEFAULT gen_random_uuid()::text,
    name                            text NOT NULL,
    concurrency                     integer,
    worker_concurrency              integer,
    rate_limit_max                  integer,
    rate_limit_period_sec           double precision,
    priority_enabled                boolean NOT NULL DEFAULT false,
    partition_queue                 boolean NOT NULL DEFAULT false,
    polling_interval_sec            double precision NOT NULL DEFAULT 1.0,
    created_at                      bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    updated_at                      bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    application_name                text,
    partition_concurrency           integer,
    partition_worker_concurrency    integer,
    partition_rate_limit_max        integer,
    partition_rate_limit_period_sec double precision,
    CONSTRAINT queues_pkey PRIMARY KEY (queue_id),
    CONSTRAINT queues_name_key UNIQUE (name)
);

-- Workflow inputs and outputs, split from workflow_status so they can be expired on their
-- own retention schedule. No foreign keys, for the same reason.
CREATE TABLE {{schema}}.workflow_input (
    workflow_uuid       text NOT NULL,
    inputs              text,
    retention_timestamp bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    CONSTRAINT workflow_input_pkey PRIMARY KEY (workflow_uuid)
);

CREATE TABLE {{schema}}.workflow_output (
    workflow_uuid       text NOT NULL,
    output              text,
    error               text,
    retention_timestamp bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    CONSTRAINT workflow_output_pkey PRIMARY KEY (workflow_uuid)
);
