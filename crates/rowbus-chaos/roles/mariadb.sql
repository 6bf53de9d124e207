-- rowbus least-privilege roles (users) on MySQL/MariaDB: notifier, listener, publisher, consumer,
-- monitor.
-- Applied by scripts/roles.sh and by `rowbus-chaos` (which runs under these users).
-- Each `-- @section NAME` is applied on its own; placeholders are substituted first:
--   @PREFIX@ user-name prefix, @PASSWORD@ the users' password, @SCHEMA@ the database of the
--   tables, @NOTIFY@ the notify table, @QUEUE@ a queue table (its dead letters: @QUEUE@_dead, its pauses: @QUEUE@_pause, its history:
--   @QUEUE@_hist and @QUEUE@_keep, its schedules: @QUEUE@_sched and @QUEUE@_ticks, its
--   deduplication ids: @QUEUE@_dedup, its ordering keys: @QUEUE@_keys, its event counts:
--   @QUEUE@_count, its limits: @QUEUE@_limits and @QUEUE@_starts).
-- Every statement is idempotent: run it again after adding a queue. The tables must exist.

-- @section roles
CREATE USER IF NOT EXISTS '@PREFIX@notifier'@'%' IDENTIFIED BY '@PASSWORD@';
ALTER USER '@PREFIX@notifier'@'%' IDENTIFIED BY '@PASSWORD@';
CREATE USER IF NOT EXISTS '@PREFIX@listener'@'%' IDENTIFIED BY '@PASSWORD@';
ALTER USER '@PREFIX@listener'@'%' IDENTIFIED BY '@PASSWORD@';
CREATE USER IF NOT EXISTS '@PREFIX@publisher'@'%' IDENTIFIED BY '@PASSWORD@';
ALTER USER '@PREFIX@publisher'@'%' IDENTIFIED BY '@PASSWORD@';
CREATE USER IF NOT EXISTS '@PREFIX@consumer'@'%' IDENTIFIED BY '@PASSWORD@';
ALTER USER '@PREFIX@consumer'@'%' IDENTIFIED BY '@PASSWORD@';
CREATE USER IF NOT EXISTS '@PREFIX@monitor'@'%' IDENTIFIED BY '@PASSWORD@';
ALTER USER '@PREFIX@monitor'@'%' IDENTIFIED BY '@PASSWORD@';

-- @section notify
-- notifier: one INSERT per notification. listener: polls (SELECT) and cleans up (DELETE).
GRANT INSERT ON `@SCHEMA@`.`@NOTIFY@` TO '@PREFIX@notifier'@'%';
GRANT SELECT, DELETE ON `@SCHEMA@`.`@NOTIFY@` TO '@PREFIX@listener'@'%';
-- monitor (rowbus stats): the notify table's size and lag, and the durable listeners'
-- positions (@NOTIFY@_positions, made with the notify table by rowbus deploy).
GRANT SELECT ON `@SCHEMA@`.`@NOTIFY@` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@NOTIFY@_positions` TO '@PREFIX@monitor'@'%';

-- @section queue
GRANT INSERT ON `@SCHEMA@`.`@QUEUE@` TO '@PREFIX@publisher'@'%';
-- A publish with a deduplication id takes the id's row in @QUEUE@_dedup, or hands over the
-- row of a message gone (it reads that message's id and dedup_id, no more), and now and
-- then deletes rows whose messages are gone. A keyed message's row in @QUEUE@_keys is
-- written with it (INSERT ... SELECT of the ids and keys just inserted).
GRANT SELECT (`id`, `msg_key`, `dedup_id`) ON `@SCHEMA@`.`@QUEUE@` TO '@PREFIX@publisher'@'%';
GRANT SELECT, INSERT, UPDATE, DELETE ON `@SCHEMA@`.`@QUEUE@_dedup` TO '@PREFIX@publisher'@'%';
GRANT INSERT ON `@SCHEMA@`.`@QUEUE@_keys` TO '@PREFIX@publisher'@'%';
-- Claims read the keys' rows; once keyed messages are settled, their consumer deletes the
-- rows of those in neither the queue nor its dead letters (it reads the dead letters' ids).
GRANT SELECT, DELETE ON `@SCHEMA@`.`@QUEUE@_keys` TO '@PREFIX@consumer'@'%';
GRANT SELECT (`id`) ON `@SCHEMA@`.`@QUEUE@_dead` TO '@PREFIX@consumer'@'%';
-- Claims are SELECT ... FOR UPDATE SKIP LOCKED then UPDATE; acks delete; dead letters are
-- INSERT ... SELECT into @QUEUE@_dead.
-- INSERT: a failed transactional handler (run_tx, run_batch_tx) puts its rows back.
GRANT SELECT, INSERT, UPDATE, DELETE ON `@SCHEMA@`.`@QUEUE@` TO '@PREFIX@consumer'@'%';
GRANT INSERT ON `@SCHEMA@`.`@QUEUE@_dead` TO '@PREFIX@consumer'@'%';
-- Every claim reads the pause table (rowbus pause); pausing is an administrator's.
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_pause` TO '@PREFIX@consumer'@'%';
-- Subscriptions read the keep setting (rowbus deploy --keep); kept history is moved in on
-- every settlement and cleaned up by the consumers' brokers (SELECT: the cleanup's read).
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_keep` TO '@PREFIX@consumer'@'%';
GRANT SELECT, INSERT, DELETE ON `@SCHEMA@`.`@QUEUE@_hist` TO '@PREFIX@consumer'@'%';
-- A consuming broker runs the queue's schedules (rowbus schedule): it reads them, records
-- each tick it publishes under the tick key, and cleans up old ticks.
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_sched` TO '@PREFIX@consumer'@'%';
GRANT SELECT, INSERT, DELETE ON `@SCHEMA@`.`@QUEUE@_ticks` TO '@PREFIX@consumer'@'%';
-- Consumers add to the queue's event counts (a snooze...): an upsert that reads the count.
GRANT SELECT, INSERT, UPDATE ON `@SCHEMA@`.`@QUEUE@_count` TO '@PREFIX@consumer'@'%';
-- Every claim reads the limits table (rowbus limit); a limited claim locks its scope's row
-- and logs, counts and prunes its starts. Setting limits is an administrator's.
GRANT SELECT, UPDATE ON `@SCHEMA@`.`@QUEUE@_limits` TO '@PREFIX@consumer'@'%';
GRANT SELECT, INSERT, DELETE ON `@SCHEMA@`.`@QUEUE@_starts` TO '@PREFIX@consumer'@'%';
-- monitor: reads what rowbus stats, dead list, history and schedule --list show; writes
-- nothing (requeue, purge, pause and resume are an administrator's).
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_dead` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_pause` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_hist` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_keep` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_sched` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_ticks` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_count` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_limits` TO '@PREFIX@monitor'@'%';
GRANT SELECT ON `@SCHEMA@`.`@QUEUE@_starts` TO '@PREFIX@monitor'@'%';

-- @section queue-listen-notify
-- listen_notify: publishers write wake-up rows; the consumers' broker polls and cleans up.
GRANT INSERT ON `@SCHEMA@`.`@NOTIFY@` TO '@PREFIX@publisher'@'%';
GRANT SELECT, DELETE ON `@SCHEMA@`.`@NOTIFY@` TO '@PREFIX@consumer'@'%';
