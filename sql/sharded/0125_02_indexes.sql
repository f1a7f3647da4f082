-- DBOS system schema, version 125, sharded track, part 2 of 4: secondary indexes.
--
-- The indexes of ../0125_02_indexes.sql, with the same names, and one of its own (the keys with
-- queued work, below). Those serving statements confined to one shard key (dequeue,
-- deduplication, recovery, timeouts, a workflow's relatives and messages) lead with shard_key,
-- so one key's rows are one contiguous range. Those serving listings and sweeps over all keys
-- (by time, status, schedule, attributes, retention) keep the unsharded columns: such
-- statements name no key to lead with.

CREATE INDEX workflow_status_created_at_index
    ON {{schema}}.workflow_status (created_at);

CREATE INDEX idx_workflow_status_in_flight_v2
    ON {{schema}}.workflow_status (shard_key, queue_name, status, priority, created_at)
    INCLUDE (application_name)
    WHERE status IN ('ENQUEUED', 'PENDING');

-- Sharded only: which keys have ENQUEUED work on a queue (what a claim round visits). The
-- queue leads, so a recursive scan seeks from one key to the next (plain PostgreSQL), and each
-- Citus shard reads its keys off this small index alone; the in-flight index above leads with
-- the key and would make the scan walk other queues' and PENDING rows.
CREATE INDEX idx_workflow_status_queue_keys
    ON {{schema}}.workflow_status (queue_name, shard_key)
    INCLUDE (application_name)
    WHERE status = 'ENQUEUED';

CREATE INDEX idx_workflow_status_partition_dequeue_v3
    ON {{schema}}.workflow_status
        (shard_key, queue_name, status, queue_partition_key, priority, created_at, workflow_uuid)
    INCLUDE (application_name)
    WHERE status IN ('ENQUEUED', 'PENDING') AND queue_partition_key IS NOT NULL;

-- Deduplication is per key: one live (queue, deduplication ID) pair per key at a time. The key
-- must be part of any unique index on a table Citus distributes by it anyway.
CREATE UNIQUE INDEX uq_workflow_status_dedup_id
    ON {{schema}}.workflow_status (shard_key, queue_name, deduplication_id)
    WHERE deduplication_id IS NOT NULL;

CREATE INDEX idx_workflow_status_rate_limited
    ON {{schema}}.workflow_status (shard_key, queue_name, started_at_epoch_ms)
    WHERE rate_limited = true;

CREATE INDEX idx_workflow_status_delayed
    ON {{schema}}.workflow_status (shard_key, delay_until_epoch_ms)
    WHERE status = 'DELAYED';

CREATE INDEX idx_workflow_status_deadline
    ON {{schema}}.workflow_status (shard_key, workflow_deadline_epoch_ms)
    WHERE status IN ('ENQUEUED', 'PENDING', 'DELAYED') AND workflow_deadline_epoch_ms IS NOT NULL;

CREATE INDEX idx_workflow_status_pending
    ON {{schema}}.workflow_status (shard_key, created_at)
    WHERE status = 'PENDING';

CREATE INDEX idx_workflow_status_failed
    ON {{schema}}.workflow_status (status, created_at)
    WHERE status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED');

CREATE INDEX idx_workflow_status_forked_from
    ON {{schema}}.workflow_status (shard_key, forked_from)
    WHERE forked_from IS NOT NULL;

-- A parent's children are found under the parent's key, which the child stores.
CREATE INDEX idx_workflow_status_parent_workflow_id
    ON {{schema}}.workflow_status (parent_shard_key, parent_workflow_id)
    WHERE parent_workflow_id IS NOT NULL;

CREATE INDEX idx_workflow_status_completed_at
    ON {{schema}}.workflow_status (completed_at)
    WHERE completed_at IS NOT NULL;

CREATE INDEX idx_workflow_status_started_at
    ON {{schema}}.workflow_status (started_at_epoch_ms)
    WHERE started_at_epoch_ms IS NOT NULL;

CREATE INDEX idx_workflow_status_schedule_name
    ON {{schema}}.workflow_status (schedule_name)
    WHERE schedule_name IS NOT NULL;

CREATE INDEX idx_workflow_status_attributes
    ON {{schema}}.workflow_status USING gin (attributes)
    WHERE attributes IS NOT NULL;

-- recv: a workflow's messages on one topic, under the destination's key.
CREATE INDEX idx_workflow_topic
    ON {{schema}}.notifications (shard_key, destination_uuid, topic);

CREATE INDEX idx_operation_outputs_completed_at_function_name_v2
    ON {{schema}}.operation_outputs (completed_at_epoch_ms, function_name)
    INCLUDE (application_name);

CREATE INDEX idx_operation_outputs_retention
    ON {{schema}}.operation_outputs (retention_timestamp);

CREATE INDEX idx_workflow_input_retention
    ON {{schema}}.workflow_input (retention_timestamp);

CREATE INDEX idx_workflow_output_retention
    ON {{schema}}.workflow_output (retention_timestamp);

CREATE UNIQUE INDEX uq_application_versions_owner_version
    ON {{schema}}.application_versions (application_name, version_name)
    WHERE application_name IS NOT NULL;

CREATE UNIQUE INDEX uq_application_versions_unclaimed_version
    ON {{schema}}.application_versions (version_name)
    WHERE application_name IS NULL;

CREATE INDEX idx_application_versions_timestamp
    ON {{schema}}.application_versions (version_timestamp DESC);

CREATE INDEX idx_application_versions_owner_timestamp
    ON {{schema}}.application_versions (application_name, version_timestamp DESC);
