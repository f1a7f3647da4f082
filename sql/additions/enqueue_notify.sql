-- dbos_async's own addition to the DBOS system schema (not part of DBOS's version 125):
-- a NOTIFY on dbos_enqueue_channel for every workflow inserted ENQUEUED or DELAYED, or
-- moved back to ENQUEUED by an update, whoever writes it.
--
-- Why: executors claim a queue as soon as a notification names it, and otherwise find work
-- only by a poll that backs off while idle (to one statement per idle_poll_max_interval).
-- Writers that send no notification (the dbos package and its clients, raw SQL, the
-- enqueue_workflow function) then waited for that poll: up to the whole interval after a
-- long idle spell. With this trigger the server announces their rows itself, at commit, like
-- the notifications trigger of send/recv; an executor's own enqueue then sends no NOTIFY of
-- its own.
--
-- Statement level, with a transition table: a statement inserting many rows notifies once
-- per queue (PostgreSQL also folds equal notifications of one transaction into one), and a
-- statement inserting none ENQUEUED costs one call that finds nothing. The payloads are the
-- ones executors send: the queue's name, or for a DELAYED row the watchers' key
-- 'dbos_async:delayed' (dbos_async._executor.queues.enqueue.DELAYED_KEY).
--
-- Compatibility: the dbos package neither reads nor creates these objects; its migrations
-- leave them alone and it never LISTENs on this channel. DBOS's recorded version is not
-- changed: the runner adds this file wherever the trigger is missing (also on a schema DBOS
-- created), in one transaction, and reads its presence at start-up; an executor on a schema
-- without it (verified, not migrated) notifies as before. The file can run again over a
-- part of it left (a trigger dropped by hand). Placeholders as in ../0125_*.sql.

CREATE OR REPLACE FUNCTION {{schema}}.dbos_async_enqueue_notify()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $dbos_fn$
BEGIN
    PERFORM pg_notify('dbos_enqueue_channel', announced.payload)
    FROM (
        SELECT DISTINCT CASE WHEN status = 'ENQUEUED' THEN queue_name
                             ELSE 'dbos_async:delayed' END AS payload
        FROM inserted_rows
        WHERE queue_name IS NOT NULL AND status IN ('ENQUEUED', 'DELAYED')
    ) AS announced;
    RETURN NULL;  -- AFTER trigger: the result is ignored
END;
$dbos_fn$;

DROP TRIGGER IF EXISTS dbos_async_enqueue_trigger ON {{schema}}.workflow_status;
CREATE TRIGGER dbos_async_enqueue_trigger
    AFTER INSERT ON {{schema}}.workflow_status
    REFERENCING NEW TABLE AS inserted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.dbos_async_enqueue_notify();

-- A workflow an update moves back to ENQUEUED: the dbos package's resume, a raw UPDATE, a
-- DELAYED workflow whose delay ended. Row level with a WHEN clause, which the server checks
-- without calling a function: the many other updates of a status row (claims, outcomes)
-- pay only that check. The payload is the queue's name, as for an insert.
CREATE OR REPLACE FUNCTION {{schema}}.dbos_async_requeue_notify()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $dbos_fn$
BEGIN
    PERFORM pg_notify('dbos_enqueue_channel', NEW.queue_name);
    RETURN NULL;  -- AFTER trigger: the result is ignored
END;
$dbos_fn$;

DROP TRIGGER IF EXISTS dbos_async_requeue_trigger ON {{schema}}.workflow_status;
CREATE TRIGGER dbos_async_requeue_trigger
    AFTER UPDATE OF status ON {{schema}}.workflow_status
    FOR EACH ROW
    WHEN (NEW.status = 'ENQUEUED' AND OLD.status IS DISTINCT FROM 'ENQUEUED'
          AND NEW.queue_name IS NOT NULL)
    EXECUTE FUNCTION {{schema}}.dbos_async_requeue_notify();
