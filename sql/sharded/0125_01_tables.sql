-- DBOS system schema, version 125, sharded track, part 1 of 4: tables and their constraints.
--
-- The same tables as ../0125_01_tables.sql, for a system database whose workflows are spread
-- over shard keys (tenants). Every per-workflow table starts with shard_key, and the key leads
-- each primary key, unique constraint and foreign key, so that:
--   * one workflow ID can exist under several keys (IDs are unique per key only);
--   * every row of a workflow lives with its workflow_status row, and a message lives under
--     its destination's key: on Citus (part 4) the tables are distributed by shard_key and
--     co-located, so all of one key's rows sit on one node and each constraint is checked there.
-- Constraint names are those of the unsharded schema: code matches errors by these names.
-- The global tables (event_dispatch_kv, workflow_schedules, application_versions, queues) are
-- shared by all keys and keep their unsharded layout.
--
-- The foreign keys are ON DELETE CASCADE but, unlike the unsharded schema, not ON UPDATE
-- CASCADE: Citus refuses ON UPDATE CASCADE on a foreign key that includes the distribution
-- column, and no statement ever changes a workflow's ID or key.
--
-- {{schema}} is replaced by the runner with the validated, double-quoted schema identifier.
-- All 0125_* files of this directory run in one transaction, together with the version bump.

CREATE TABLE {{schema}}.workflow_status (
    shard_key                  text NOT NULL,
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
    -- The key of parent_workflow_id, which may live under another key than its child.
    parent_shard_key           text,
    CONSTRAINT workflow_status_pkey PRIMARY KEY (shard_key, workflow_uuid)
);

-- Step results; no foreign key, as in the unsharded schema.
CREATE TABLE {{schema}}.operation_outputs (
    shard_key             text NOT NULL,
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
    -- The key of child_workflow_id, which may live under another key than this workflow.
    child_shard_key       text,
    CONSTRAINT operation_outputs_pkey PRIMARY KEY (shard_key, workflow_uuid, function_id)
);

-- Messages, stored under the destination's key. No trigger notifies of a new row (see part 3):
-- the writer notifies.
CREATE TABLE {{schema}}.notifications (
    shard_key               text NOT NULL,
    message_uuid            text NOT NULL DEFAULT gen_random_uuid(),
    destination_uuid        text NOT NULL,
    topic                   text,
    message                 text NOT NULL,
    created_at_epoch_ms     bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    serialization           text,
    consumed                boolean NOT NULL DEFAULT false,
    consumed_by_function_id integer,
    CONSTRAINT notifications_pkey PRIMARY KEY (shard_key, message_uuid),
    CONSTRAINT notifications_destination_uuid_fkey FOREIGN KEY (shard_key, destination_uuid)
        REFERENCES {{schema}}.workflow_status (shard_key, workflow_uuid)
        ON DELETE CASCADE
);

CREATE TABLE {{schema}}.workflow_events (
    shard_key     text NOT NULL,
    workflow_uuid text NOT NULL,
    key           text NOT NULL,
    value         text NOT NULL,
    serialization text,
    CONSTRAINT workflow_events_pkey PRIMARY KEY (shard_key, workflow_uuid, key),
    CONSTRAINT workflow_events_workflow_uuid_fkey FOREIGN KEY (shard_key, workflow_uuid)
        REFERENCES {{schema}}.workflow_status (shard_key, workflow_uuid)
        ON DELETE CASCADE
);

CREATE TABLE {{schema}}.workflow_events_history (
    shard_key     text NOT NULL,
    workflow_uuid text NOT NULL,
    function_id   integer NOT NULL,
    key           text NOT NULL,
    value         text NOT NULL,
    serialization text,
    CONSTRAINT workflow_events_history_pkey PRIMARY KEY (shard_key, workflow_uuid, function_id, key),
    CONSTRAINT workflow_events_history_workflow_uuid_fkey FOREIGN KEY (shard_key, workflow_uuid)
        REFERENCES {{schema}}.workflow_status (shard_key, workflow_uuid)
        ON DELETE CASCADE
);

CREATE TABLE {{schema}}.streams (
    shard_key     text NOT NULL,
    workflow_uuid text NOT NULL,
    key           text NOT NULL,
    value         text NOT NULL,
    "offset"      integer NOT NULL,
    function_id   integer NOT NULL DEFAULT 0,
    serialization text,
    CONSTRAINT streams_pkey PRIMARY KEY (shard_key, workflow_uuid, key, "offset"),
    CONSTRAINT streams_workflow_uuid_fkey FOREIGN KEY (shard_key, workflow_uuid)
        REFERENCES {{schema}}.workflow_status (shard_key, workflow_uuid)
        ON DELETE CASCADE
);

-- Global: event dispatchers' state is not per workflow.
CREATE TABLE {{schema}}.event_dispatch_kv (
    service_name     text NOT NULL,
    workflow_fn_name text NOT NULL,
    key              text NOT NULL,
    value            text,
    update_seq       numeric(38, 0),
    update_time      numeric(38, 15),
    CONSTRAINT event_dispatch_kv_pkey PRIMARY KEY (service_name, workflow_fn_name, key)
);

-- Global: a schedule is one row, whichever key its workflows run under.
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
    -- The shard key the schedule's workflows are started under.
    workflow_shard_key  text,
    CONSTRAINT workflow_schedules_pkey PRIMARY KEY (schedule_id),
    CONSTRAINT workflow_schedules_schedule_name_key UNIQUE (schedule_name)
);

-- Global: versions are the application's, not a key's.
CREATE TABLE {{schema}}.application_versions (
    version_id        text NOT NULL,
    version_name      text NOT NULL,
    version_timestamp bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    created_at        bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    application_name  text,
    CONSTRAINT application_versions_pkey PRIMARY KEY (version_id),
    CONSTRAINT application_versions_version_name_key UNIQUE (version_name)
);

-- Global: a queue's settings hold for every key that enqueues on it.
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

-- Inputs and outputs; no foreign keys, as in the unsharded schema.
CREATE TABLE {{schema}}.workflow_input (
    shard_key           text NOT NULL,
    workflow_uuid       text NOT NULL,
    inputs              text,
    retention_timestamp bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    CONSTRAINT workflow_input_pkey PRIMARY KEY (shard_key, workflow_uuid)
);

CREATE TABLE {{schema}}.workflow_output (
    shard_key           text NOT NULL,
    workflow_uuid       text NOT NULL,
    output              text,
    error               text,
    retention_timestamp bigint NOT NULL DEFAULT (extract(epoch FROM now()) * 1000.0)::bigint,
    CONSTRAINT workflow_output_pkey PRIMARY KEY (shard_key, workflow_uuid)
);
