-- dbos_async's own addition to the DBOS system schema (not part of DBOS's version 125):
-- each queue's depth as executors measured it, one row per application, queue and minute.
--
-- Why: a queue's depth history can otherwise only be worked back from the count now
-- through the enqueues and starts since, which cannot see a waiting workflow cancelled,
-- deleted or put back in its queue since. An executor whose queues have work counts their
-- waiting workflows (ENQUEUED or DELAYED) once a minute, near its end, and stores the
-- count here; the depth history reads these minutes as measured and works back only the
-- others (dbos_async/_executor/queues/depth_samples.py).
--
-- application_name is the sampling executor's application ('' for one without a name,
-- which counts every application's workflows), as its count is scoped: readers take the
-- samples of their own scope. The key leads with it and the minute, which serves the
-- read (a window of one application's minutes), the sampler's check for a minute already
-- sampled and the deletes of old rows (by the sampler past a day, by the retention job).
--
-- Compatibility: the dbos package neither reads nor creates this table; its migrations
-- leave it alone. Added by the runner wherever it is missing (also on a schema DBOS
-- created); an executor on a schema without it (verified, not migrated, or a role that
-- could not add it) samples nothing. Placeholders as in ../0125_*.sql.

CREATE TABLE IF NOT EXISTS {{schema}}.dbos_async_depth_samples (
    application_name text NOT NULL,
    minute_epoch_ms bigint NOT NULL,
    queue_name text NOT NULL,
    waiting bigint NOT NULL,
    sampled_at_epoch_ms bigint NOT NULL,
    PRIMARY KEY (application_name, minute_epoch_ms, queue_name)
);
