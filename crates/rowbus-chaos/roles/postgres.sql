-- rowbus least-privilege roles on PostgreSQL: notifier, listener, publisher, consumer, monitor.
-- Applied by scripts/roles.sh and by `rowbus-chaos` (which runs under these roles).
-- Each `-- @section NAME` is applied on its own; placeholders are substituted first:
--   @PREFIX@ role-name prefix, @PASSWORD@ the roles' password, @DATABASE@ the database,
--   @SCHEMA@ the queue table's schema, @QUEUE@ a queue table (its dead letters: @QUEUE@_dead, its pauses: @QUEUE@_pause, its history:
--   @QUEUE@_hist and @QUEUE@_keep, its schedules: @QUEUE@_sched and @QUEUE@_ticks, its event
--   counts: @QUEUE@_count, its limits: @QUEUE@_limits and @QUEUE@_starts).
-- Every statement is idempotent: run it again after adding a queue.

-- @section roles
DO $$
DECLARE
  role text;
BEGIN
  FOREACH role IN ARRAY ARRAY['notifier', 'listener', 'publisher', 'consumer', 'monitor'] LOOP
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '@PREFIX@' || role) THEN
      EXECUTE format('CREATE ROLE %I LOGIN', '@PREFIX@' || role);
    END IF;
    EXECUTE format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT PASSWORD %L',
                   '@PREFIX@' || role, '@PASSWORD@');
  END LOOP;
END $$;
GRANT CONNECT ON DATABASE "@DATABASE@"
  TO "@PREFIX@notifier", "@PREFIX@listener", "@PREFIX@publisher", "@PREFIX@consumer",
     "@PREFIX@monitor";
-- notifier: pg_notify, which PUBLIC may run by default (granted in case that was revoked).
GRANT EXECUTE ON FUNCTION pg_notify(text, text) TO "@PREFIX@notifier";
-- listener: LISTEN needs no privilege at all.

-- @section notify
-- PostgreSQL has no notify table: nothing to grant.

-- @section queue
GRANT USAGE ON SCHEMA "@SCHEMA@" TO "@PREFIX@publisher", "@PREFIX@consumer", "@PREFIX@monitor";
-- An identity column's sequence needs no grant of its own (a SERIAL's would).
GRANT INSERT ON "@SCHEMA@"."@QUEUE@" TO "@PREFIX@publisher";
-- Claims are UPDATE ... RETURNING over SELECT ... FOR UPDATE SKIP LOCKED; acks delete.
-- INSERT: a failed transactional handler (run_tx, run_batch_tx) puts its rows back.
GRANT SELECT, INSERT, UPDATE, DELETE ON "@SCHEMA@"."@QUEUE@" TO "@PREFIX@consumer";
-- Consumers empty the queue's partitions no publish fills any more: under the partition's
-- lock, what waits in it moves to the current one (SELECT, DELETE), then TRUNCATE.
GRANT SELECT, DELETE, TRUNCATE ON "@SCHEMA@"."@QUEUE@_p0", "@SCHEMA@"."@QUEUE@_p1", "@SCHEMA@"."@QUEUE@_p2",
  "@SCHEMA@"."@QUEUE@_p3" TO "@PREFIX@consumer";
GRANT INSERT ON "@SCHEMA@"."@QUEUE@_dead" TO "@PREFIX@consumer";
-- Every claim reads the pause table (rowbus pause); pausing is an administrator's.
GRANT SELECT ON "@SCHEMA@"."@QUEUE@_pause" TO "@PREFIX@consumer";
-- Subscriptions read the keep setting (rowbus deploy --keep); kept history is moved in on
-- every settlement and cleaned up by the consumers' brokers (SELECT: the cleanup's read).
GRANT SELECT ON "@SCHEMA@"."@QUEUE@_keep" TO "@PREFIX@consumer";
GRANT SELECT, INSERT, DELETE ON "@SCHEMA@"."@QUEUE@_hist" TO "@PREFIX@consumer";
-- A consuming broker runs the queue's schedules (rowbus schedule): it reads them, records
-- each tick it publishes under the tick key, and cleans up old ticks.
GRANT SELECT ON "@SCHEMA@"."@QUEUE@_sched" TO "@PREFIX@consumer";
GRANT SELECT, INSERT, DELETE ON "@SCHEMA@"."@QUEUE@_ticks" TO "@PREFIX@consumer";
-- Consumers add to the queue's event counts (a snooze...): an upsert that reads the count.
GRANT SELECT, INSERT, UPDATE ON "@SCHEMA@"."@QUEUE@_count" TO "@PREFIX@consumer";
-- Every claim reads the limits table (rowbus limit); a limited claim locks its scope's row
-- (FOR UPDATE needs UPDATE) and logs, counts and prunes its starts. Setting limits is an
-- administrator's.
GRANT SELECT, UPDATE ON "@SCHEMA@"."@QUEUE@_limits" TO "@PREFIX@consumer";
GRANT SELECT, INSERT, DELETE ON "@SCHEMA@"."@QUEUE@_starts" TO "@PREFIX@consumer";
-- monitor: reads what rowbus stats, dead list, history and schedule --list show; writes
-- nothing (requeue, purge, pause and resume are an administrator's).
GRANT SELECT ON "@SCHEMA@"."@QUEUE@", "@SCHEMA@"."@QUEUE@_dead", "@SCHEMA@"."@QUEUE@_pause",
  "@SCHEMA@"."@QUEUE@_hist", "@SCHEMA@"."@QUEUE@_keep", "@SCHEMA@"."@QUEUE@_sched",
  "@SCHEMA@"."@QUEUE@_ticks", "@SCHEMA@"."@QUEUE@_count", "@SCHEMA@"."@QUEUE@_limits",
  "@SCHEMA@"."@QUEUE@_starts" TO "@PREFIX@monitor";

-- @section queue-listen-notify
-- listen_notify: publishers call pg_notify; the consumers' broker LISTENs (no privilege).
GRANT EXECUTE ON FUNCTION pg_notify(text, text) TO "@PREFIX@publisher";
