-- DBOS system schema, version 125 (baseline), part 2 of 3: secondary indexes.
--
-- Indexes backing primary keys and unique constraints come with the tables (part 1). The
-- tables are new and empty here, so plain CREATE INDEX inside the step's transaction is
-- enough; CONCURRENTLY only matters when adding an index to a live table.

-- workflow_status: listing by creation time.
CREATE INDEX workflow_status_created_at_index
    ON {{schema}}.workflow_status (created_at);

-- Queue dequeue: only in-flight rows, ordered as the dequeuer reads them. application_name is
-- an INCLUDE column so per-application counts run index-only.
CREATE INDEX idx_workflow_status_in_flight_v2
    ON {{schema}}.workflow_status (queue_name, status, priority, created_at)
    INCLUDE (application_name)
    WHERE status IN ('ENQUEUED', 'PENDING');

-- Partitioned-queue dequeue; the trailing workflow_uuid makes the order total.
CREATE INDEX idx_workflow_status_partition_dequeue_v3
    ON {{schema}}.workflow_status
        (queue_name, status, queue_partition_key, priority, created_at, workflow_uuid)
    INCLUDE (application_name)
    WHERE status IN ('ENQUEUED', 'PENDING') AND queue_partition_key IS NOT NULL;

-- Deduplication: one live (queue, deduplication ID) pair at a time.
CREATE UNIQUE INDEX uq_workflow_status_dedup_id
    ON {{schema}}.workflow_status (queue_name, deduplication_id)
    WHERE deduplication_id IS NOT NULL;

-- Rate limiting counts recent starts per queue.
CREATE INDEX idx_workflow_status_rate_limited
    ON {{schema}}.workflow_status (queue_name, started_at_epoch_ms)
    WHERE rate_limited = true;

-- Delayed workflows, found by the time they become due.
CREATE INDEX idx_workflow_status_delayed
    ON {{schema}}.workflow_status (delay_until_epoch_ms)
    WHERE status = 'DELAYED';

-- Timeout sweep: only active workflows that have a deadline.
CREATE INDEX idx_workflow_status_deadline
    ON {{schema}}.workflow_status (workflow_deadline_epoch_ms)
    WHERE status IN ('ENQUEUED', 'PENDING', 'DELAYED') AND workflow_deadline_epoch_ms IS NOT NULL;

-- Recovery and listing filters; partial so that the common NULL / finished rows cost nothing.
CREATE INDEX idx_workflow_status_pending
    ON {{schema}}.workflow_status (created_at)
    WHERE status = 'PENDING';

CREATE INDEX idx_workflow_status_failed
    ON {{schema}}.workflow_status (status, created_at)
    WHERE status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED');

CREATE INDEX idx_workflow_status_forked_from
    ON {{schema}}.workflow_status (forked_from)
    WHERE forked_from IS NOT NULL;

CREATE INDEX idx_workflow_status_parent_workflow_id
    ON {{schema}}.workflow_status (parent_workflow_id)
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

-- Containment (@>) filters on workflow attributes.
CREATE INDEX idx_workflow_status_attributes
    ON {{schema}}.workflow_status USING gin (attributes)
    WHERE attributes IS NOT NULL;

-- recv: a workflow's messages on one topic.
CREATE INDEX idx_workflow_topic
    ON {{schema}}.notifications (destination_uuid, topic);

-- Step statistics by completion time and step name.
CREATE INDEX idx_operation_outputs_completed_at_function_name_v2
    ON {{schema}}.operation_outputs (completed_at_epoch_ms, function_name)
    INCLUDE (application_name);

-- Retention: expiring old step results, inputs and outputs.
CREATE INDEX idx_operation_outputs_retention
    ON {{schema}}.operation_outputs (retention_timestamp);

CREATE INDEX idx_workflow_input_retention
    ON {{schema}}.workflow_input (retention_timestamp);

CREATE INDEX idx_workflow_output_retention
    ON {{schema}}.workflow_output (retention_timestamp);

-- Application versions: a version name is unique per application, and unique among the
-- versions no application has claimed (NULL application_name).
CREATE UNIQUE INDEX uq_application_versions_owner_version
    ON {{schema}}.application_versions (application_name, version_name)
    WHERE application_name IS NOT NULL;

CREATE UNIQUE INDEX uq_application_versions_unclaimed_version
    ON {{schema}}.application_versions (version_name)
    WHERE application_name IS NULL;

-- Latest versions first, overall and per application.
CREATE INDEX idx_application_versions_timestamp
    ON {{schema}}.application_versions (version_timestamp DESC);

CREATE INDEX idx_application_versions_owner_timestamp
    ON {{schema}}.application_versions (application_name, version_timestamp DESC);
