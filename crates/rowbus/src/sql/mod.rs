//! Everything rowbus says to a database, one module per database behind one trait.
//!
//! [`Dialect`] holds what differs: quoting and placeholders, how "now" and a delay are
//! written, the DDL, each claim in its database's shape, how a transaction begins, how
//! other processes are woken, how to connect and listen. Its provided methods are the
//! statements whose text only differs in those primitives; a database overrides one where
//! its shape differs. The broker and the listener are written once against it and never
//! ask which database they run on. [`TableSql`] is one queue table's statements, built
//! from the dialect.

mod dead;
mod history;
#[cfg(feature = "mysql")]
mod mysql;
mod pause;
mod positions;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod schedule;
#[cfg(feature = "sqlite")]
mod sqlite;
mod table;

use std::sync::Arc;

use futures::future::BoxFuture;
use notify_table::{NotifyTable, Statement};
use sqlx::Pool;

use crate::backend::DbPool;
use crate::broker::QueueTable;
use crate::db::sealed::Driver;
use crate::db::{Arg, ClaimedRow, args_of};
use crate::error::Error;
use crate::listener::ListenerTask;
use crate::notify::Notifier;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use history::HISTORY_INDEX_SUFFIX;
pub(crate) use history::{HISTORY_SUFFIX, HistorySql, KEEP_SUFFIX, Moved};
pub(crate) use pause::{PAUSE_SUFFIX, PauseSql};
pub(crate) use positions::{POSITIONS_SUFFIX, PositionsSql, micros, text};
pub(crate) use schedule::{SCHED_SUFFIX, ScheduleSql, TICKS_SUFFIX};
pub(crate) use table::{DEAD_FEATURE_COLUMNS, FEATURE_COLUMNS, InsertForm, QUEUE_COLUMNS, TableSql};

/// The name suffix of a queue table's claim index: (group, priority, visible_at, id)
/// (MySQL/MariaDB's claim order is the primary key instead).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const READY: &str = "_ready";
/// The name suffix of the claim index of a queue table made before priorities, which a
/// deploy replaces with [`READY`].
pub(crate) const OLD_CLAIM: &str = "_claim";
/// The name suffix of a queue table's ordering-key index: (key, id).
pub(crate) const KEYS: &str = "_key";
/// The name suffix of a queue table's unique index on deduplication ids.
pub(crate) const DEDUP: &str = "_dedup";

/// How long a deploy waits for another deploy's lock before it gives up: a deploy holds
/// it for a few statements of DDL, so a longer wait means one is stuck. (SQLite's deploys
/// wait for the write lock, as long as its busy timeout.)
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const DEPLOY_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// One database's SQL and connection behaviour. Sealed: implemented for
/// [`sqlx::Postgres`], [`sqlx::MySql`] and [`sqlx::Sqlite`] in this module's children.
pub trait Dialect: Driver + Sized {
    /// What a queue's statements keep on this database beside the shared ones (the
    /// statements and counters of tables of its own); `()` where there is nothing.
    type TableState: std::fmt::Debug + Send + Sync + 'static;
    /// The [`TableState`](Self::TableState) of queue `table`.
    fn table_state(table: &QueueTable) -> Self::TableState;

    // --- Identifiers and values.

    /// One identifier part, quoted. Only for validated plain identifiers.
    fn quote(part: &str) -> String;
    /// The placeholder of the `n`-th bind (from 1).
    fn param(n: usize) -> String;
    /// "Now" as the queue table stores times.
    const NOW: &'static str;
    /// "Now plus the microseconds in placeholder `p`".
    fn later(p: &str) -> String;
    /// The stored time `p` microseconds after the Unix epoch.
    fn from_micros(p: &str) -> String;
    /// The stored time `column` as microseconds since the Unix epoch, a BIGINT.
    fn micros_of(column: &str) -> String;
    /// `COUNT(*)` as a signed 64-bit integer.
    const COUNT: &'static str = "COUNT(*)";

    // --- Queue tables.

    /// Refuses a name this database cannot hold.
    fn check_table(_table: &QueueTable) -> Result<(), Error> {
        Ok(())
    }
    /// The queue table, its claim index and its dead-letter table, if missing.
    fn create_queue(table: &QueueTable) -> Vec<String>;
    /// `expr` (a text column, or a binary one holding UTF-8) as text, as the driver
    /// decodes a string.
    fn text_of(expr: &str) -> String {
        expr.to_owned()
    }
    /// `expr` (an integer column) as a signed 64-bit integer, as the driver decodes one.
    fn bigint(expr: &str) -> String {
        format!("CAST({expr} AS BIGINT)")
    }
    /// What a `SELECT` ends with to lock the rows it returns until its transaction ends
    /// (`""` where [`WRITE_BEGIN`](Self::WRITE_BEGIN) already holds every row).
    const FOR_UPDATE: &'static str = " FOR UPDATE";

    /// The largest statement (with its binds) the database takes, in bytes, and the
    /// setting that says so; `Some` query when the server decides it at run time.
    const STATEMENT_LIMIT: (u64, &'static str);
    /// A query returning the server's statement size limit, where it is a setting.
    const STATEMENT_LIMIT_SQL: Option<&'static str> = None;

    /// The queue's pause table (see [`PauseSql`]), if missing: `whole_queue` (0 or 1, a
    /// BIGINT where that is what the driver reads as `i64`), `group_name` as the queue
    /// table has it, `paused_at`; the key `(whole_queue, group_name)`.
    fn create_pause(table: &QueueTable) -> String;
    /// A condition true while neither the queue (in table `table`) nor the group in
    /// placeholder `group` is paused: one lookup in the pause table, which the claims
    /// carry.
    fn not_paused(table: &QueueTable, group: &str) -> String {
        format!(
            "NOT EXISTS (SELECT 1 FROM {} WHERE whole_queue = 1 OR group_name = {group})",
            quoted::<Self>(table, PAUSE_SUFFIX)
        )
    }
    /// A condition true for a row of the queue table (aliased `q` in the claim) that has
    /// no ordering key, or whose key has no earlier message in the table: ready, delayed,
    /// waiting for a retry or in flight, an earlier message holds its key's later ones.
    /// One probe of the key index per keyed candidate. A plain read, never a locking one
    /// (a claim's `SKIP LOCKED` must not skip the earlier row and so free its key).
    fn key_free(table: &QueueTable) -> String {
        format!(
            "(q.msg_key IS NULL OR NOT EXISTS (SELECT 1 FROM {} AS e WHERE e.msg_key = q.msg_key AND e.id < q.id))",
            quoted::<Self>(table, "")
        )
    }
    /// The type and constraints of a column a deploy adds to an older queue or
    /// dead-letter table (one of [`FEATURE_COLUMNS`]).
    fn column_def(column: &str) -> &'static str;
    /// The statements that bring a queue table made by an older rowbus up to date, run
    /// before [`create_queue`](Self::create_queue)'s (which then add the indexes):
    /// `missing` are the [`FEATURE_COLUMNS`] the queue table lacks, `dead_missing` the
    /// [`DEAD_FEATURE_COLUMNS`] its dead-letter table lacks (both empty for a new table).
    fn migrate_queue(table: &QueueTable, missing: &[&str], dead_missing: &[&str]) -> Vec<String> {
        let (t, dead) = (quoted::<Self>(table, ""), quoted::<Self>(table, "_dead"));
        let add = |table: &str, column: &str| {
            format!("ALTER TABLE {table} ADD COLUMN {} {}", Self::quote(column), Self::column_def(column))
        };
        let mut statements: Vec<String> = missing.iter().map(|c| add(&t, c)).collect();
        statements.extend(dead_missing.iter().map(|c| add(&dead, c)));
        if missing.contains(&"priority") {
            statements.push(format!("DROP INDEX IF EXISTS {}", quoted::<Self>(table, OLD_CLAIM)));
        }
        statements
    }
    /// Stores one message with a deduplication id unless a message with that id is in the
    /// queue (ready, delayed or in flight); whether it stored it. Binds: those of
    /// [`TableSql::insert`], then the id. `alone`: no transaction is open on `conn` (else
    /// this runs in the caller's, and leaves it as it found it when it stores nothing). By
    /// default one `INSERT` that a partial unique index on the id refuses
    /// ([`TableSql::insert_dedup`]).
    fn insert_deduplicated<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        args: &'c [Arg<'c>],
        alone: bool,
    ) -> BoxFuture<'c, Result<bool, sqlx::Error>> {
        let _ = alone;
        Box::pin(async move { Ok(Self::execute(conn, &sql.insert_dedup, args).await? > 0) })
    }
    /// Runs `insert` (binds `args`), an INSERT of messages into the queue table; `keyed`:
    /// some of them have an ordering key. The rows it stored. By default the statement
    /// alone.
    fn insert_messages<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        insert: &'c Arc<str>,
        args: &'c [Arg<'c>],
        keyed: bool,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        let _ = (sql, keyed);
        Self::execute(conn, insert, args)
    }
    /// After keyed messages `ids` were settled (committed): what the dialect keeps about
    /// their keys goes, now or a little later, for those that left for good, on a
    /// connection of `pool`; those still in the queue or its dead letters keep it. A
    /// failure leaves the cleanup to later. By default nothing.
    fn keyed_gone<'c>(
        pool: &'c Pool<Self>,
        sql: &'c Arc<TableSql<Self>>,
        ids: &'c [i64],
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        let _ = (pool, sql, ids);
        Box::pin(async { Ok(()) })
    }
    /// In a requeue's transaction, after the dead letters `ids` were copied back into the
    /// queue table: what the dialect keeps about keys, for them too. By default nothing.
    fn requeued<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        ids: &'c [Arg<'c>],
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        let _ = (conn, sql, ids);
        Box::pin(async { Ok(()) })
    }
    /// The tables of a queue besides those every database gives it (dropped with it),
    /// quoted.
    fn side_tables(_table: &QueueTable) -> Vec<String> {
        Vec::new()
    }
    /// What brings an older queue table's indexes up to date, run by a deploy after the
    /// columns ([`migrate_queue`](Self::migrate_queue)): for each change, a query returning
    /// one integer, non-zero when the table needs it (its binds are texts), and the
    /// statements that make it.
    fn index_upgrades(_table: &QueueTable) -> Vec<(String, Vec<String>, Vec<String>)> {
        Vec::new()
    }
    /// `INSERT INTO table (columns) VALUES (values)` that does nothing (and counts no
    /// row) where the key is taken.
    fn insert_ignore(table: &str, columns: &str, values: &str) -> String {
        format!("INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT DO NOTHING")
    }
    /// `INSERT INTO table (columns) select` that skips (and counts no row for) a row
    /// whose key is taken. `select` has a `WHERE` (SQLite needs one before `ON CONFLICT`).
    fn insert_select_ignore(table: &str, columns: &str, select: &str) -> String {
        format!("INSERT INTO {table} ({columns}) {select} ON CONFLICT DO NOTHING")
    }
    /// `INSERT INTO table (columns) VALUES (values)` that, where `key` is taken, sets
    /// `updates` to the values given instead.
    fn upsert(table: &str, columns: &str, values: &str, key: &str, updates: &[&str]) -> String {
        let set: Vec<String> = updates.iter().map(|c| format!("{c} = excluded.{c}")).collect();
        format!(
            "INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({key}) DO UPDATE SET {}",
            set.join(", ")
        )
    }
    /// The queue's schedule table and tick table (see [`ScheduleSql`]), if missing:
    /// `<table>_sched` (`name` the key, `cron`, `payload`, `group_name`, `every_us`,
    /// `since_us`, `version`) and `<table>_ticks` (`schedule_name`, `tick_us`,
    /// `published_at`; the key `(schedule_name, tick_us)`).
    fn create_schedules(table: &QueueTable) -> Vec<String>;

    // --- Kept history.

    /// The queue's history table (see [`HistorySql`]), its index on `handled_at` and its
    /// keep setting table, if missing. History: `id`, `group_name`, `payload`, `attempts`,
    /// `created_at` as the queue table has them, `outcome` (short text), `handled_at`
    /// (defaults to now), `last_error`; no key (a requeued dead letter comes back under its
    /// id and may be handled again). Keep setting: `id` (the key, always 1) and `keep_us`
    /// (a BIGINT).
    fn create_history(table: &QueueTable) -> Vec<String>;
    /// Deletes up to `limit` (a placeholder) of history table `h`'s oldest rows handled
    /// before the time `cutoff` (an expression), oldest first.
    fn prune_history_sql(h: &str, cutoff: &str, limit: &str) -> String;
    /// One statement that writes rows a transactional claim took into history table `h`,
    /// given as one JSON text (binds: the rows, then their outcome): an array of
    /// `{"i": id, "g": group, "p": payload in hex, "a": attempts, "c": created_at µs,
    /// "e": error or null}`. `None` where the rows go as binds, a `VALUES` tuple each.
    fn history_json_insert(_h: &str) -> Option<String> {
        None
    }
    /// The statements that move the rows of queue table `t` matching `filter` into history
    /// table `h` as `outcome`, with `error` (a placeholder, or `last_error`: the row's own)
    /// as their last error, run in one transaction; the last one's count is the rows moved.
    /// By default a copy, then a delete, with the same binds.
    fn move_to_history(t: &str, h: &str, filter: &str, outcome: &str, error: &str) -> Vec<String> {
        history::copy_then_delete::<Self>(t, h, filter, outcome, error)
    }

    // --- Deploying.

    /// How a deploy's transaction begins: the check of what exists and the `CREATE`s run
    /// in it, on one connection.
    const DEPLOY_BEGIN: &'static str = "BEGIN";
    /// Takes, on `conn` inside the deploy's transaction, the lock that makes deploys of
    /// `table` run one at a time (every replica of an app may deploy at start-up): its
    /// name or key is a bind value. A lock of its own waits at most `DEPLOY_LOCK_WAIT`,
    /// then fails with [`Error::DeployLocked`].
    fn lock_deploy<'c>(conn: &'c mut Self::Connection, table: &'c str) -> BoxFuture<'c, Result<(), Error>>;
    /// Releases that lock before the transaction ends, where its end does not release it.
    fn unlock_deploy<'c>(
        _conn: &'c mut Self::Connection,
        _table: &'c str,
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        Box::pin(async { Ok(()) })
    }

    // --- Claims.

    /// How a lease claim's transaction begins.
    const LEASE_CLAIM_BEGIN: &'static str;
    /// How a transactional handler's claim begins.
    const LOCKED_CLAIM_BEGIN: &'static str;
    /// How a transaction that writes begins ([`BrokerTx`](crate::BrokerTx), dead letters).
    const WRITE_BEGIN: &'static str = "BEGIN";
    /// The savepoint before a transactional handler's own statements.
    const HANDLER_SAVEPOINT: &'static str = "SAVEPOINT rowbus_handler";
    /// Whether a lease claim with nothing to acknowledge needs a transaction of its own
    /// (one statement is its own transaction where it both locks and marks the rows).
    const CLAIM_IN_TRANSACTION: bool = true;
    /// Whether a runner's acknowledgements ride on its next claim's transaction.
    const CLAIMS_CARRY_ACKS: bool = false;
    /// Whether the database runs one write transaction at a time (SQLite): a broker's
    /// transactional claims then wait for each other in the process, handed over the
    /// moment one commits, rather than in the database's busy handler, which retries
    /// after sleeps of up to 100 ms; and consecutive ones share a commit (see
    /// `broker::writer`). Publishes that fit one statement merge whatever their size.
    const ONE_WRITER: bool = false;
    /// The lease claim statement: binds group, limit, lease µs, token; a database whose
    /// claim has another shape says so in [`claim`](Self::claim).
    fn claim_sql(table: &QueueTable) -> String;
    /// A transactional handler's claim: up to `limit` ready rows, locked and deleted
    /// (the transaction's commit acknowledges them). Binds: group, limit.
    fn claim_locked_sql(table: &QueueTable) -> String;

    /// Claims up to `limit` rows of `group` under lease `token` on `conn`.
    fn claim<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        group: &'c str,
        limit: i64,
        lease: i64,
        token: i64,
    ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
        let args = [Arg::Text(group), Arg::Int(limit), Arg::Int(lease), Arg::Int(token)];
        Self::fetch_claimed(conn, &sql.claim, &args)
    }

    /// A claim of this process failed by a deadlock or a certification conflict (and is
    /// tried again): another consumer took the same rows. MariaDB on a Galera cluster
    /// keeps its claims to the node's own lane for a while; other databases do nothing.
    fn claim_conflicted() {}

    /// Takes up to `limit` ready rows of `group` in the caller's transaction, locked and
    /// deleted, then (when it took some) sets [`HANDLER_SAVEPOINT`](Self::HANDLER_SAVEPOINT)
    /// for the handler that gets them.
    fn take_locked<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        group: &'c str,
        limit: i64,
    ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
        Box::pin(async move {
            let rows =
                Self::fetch_claimed(conn, &sql.claim_locked, &[Arg::Text(group), Arg::Int(limit)]).await?;
            if !rows.is_empty() {
                Self::simple(conn, Self::HANDLER_SAVEPOINT).await?;
            }
            Ok(rows)
        })
    }

    // --- Notifications.

    /// Refuses a channel name this database cannot listen on.
    fn check_channel(channel: &str) -> Result<(), Error>;
    /// The statement that sends `payload` on `channel`.
    fn notify_sql(notifier: &Notifier, channel: &str, payload: &str) -> Result<Statement, Error>;
    /// The notify table's statements, if this database uses one.
    fn notify_table(notifier: &Notifier) -> Option<&NotifyTable>;
    /// The positions table of durable listeners (see [`PositionsSql`]), quoted as `t`, if
    /// missing: `channel` and `name` as the notify table holds a channel (the key),
    /// `position` (text), `first_unread`, `owner`, `checked_in` (BIGINT).
    fn create_positions(t: &str) -> String;

    /// Wakes other processes' subscriptions of `channel` and `groups`: a notification
    /// per group, sent on `conn`. A failure is logged: the poll interval still reaches
    /// the rows.
    fn wake<'c>(
        conn: &'c mut Self::Connection,
        notifier: &'c Notifier,
        channel: &'c str,
        groups: &'c [String],
    ) -> BoxFuture<'c, ()> {
        Box::pin(async move {
            for group in groups {
                let sent = match Self::notify_sql(notifier, channel, group) {
                    Ok(stmt) => {
                        Self::execute(conn, &stmt.sql, &args_of(&stmt)).await.map(drop).map_err(Error::from)
                    }
                    Err(e) => Err(e),
                };
                if let Err(error) = sent {
                    tracing::warn!(%error, table = channel, group, "wake-up notification failed; subscriptions elsewhere wait for their poll interval");
                }
            }
        })
    }

    /// Whether a transaction's wake-ups wait for [`wake_at_commit`](Self::wake_at_commit)
    /// rather than going out through [`wake`](Self::wake) as it publishes (delivered when
    /// it commits either way).
    const WAKES_AT_COMMIT: bool = false;

    /// Right before a transaction commits: wakes what [`wake_in_tx`](Self::wake_in_tx)
    /// left for the commit, for the `(channel, group)` pairs published in it.
    fn wake_at_commit<'c>(
        _conn: &'c mut Self::Connection,
        _pairs: &'c [(Arc<str>, String)],
    ) -> BoxFuture<'c, ()> {
        Box::pin(async {})
    }

    // --- Connecting.

    /// A pool of up to `max` connections in rowbus's session settings; with `create`, the
    /// database is made first if this database makes them on connecting (a SQLite file).
    fn connect_pool(url: &str, max: u32, create: bool) -> BoxFuture<'static, Result<Pool<Self>, Error>>;
    /// The pool in a [`DbPool`].
    fn wrap(pool: Pool<Self>) -> DbPool;
    /// Connects a listener's first session and starts its task.
    fn start_listener(task: ListenerTask) -> BoxFuture<'static, Result<tokio::task::JoinHandle<()>, Error>>;

    // --- The catalog and statistics.

    /// Which of [`QUEUE_COLUMNS`] table `name` (in `schema`, or where an unqualified name
    /// resolves) has, and whether it exists: a statement returning one row, the names
    /// present joined by commas (`''` for none) and an integer, 0 when there is no table.
    fn find_table_sql(schema: Option<&str>, name: &str) -> (String, Vec<String>);
    /// The queue tables where unqualified names resolve: one text column, the name as
    /// a statement would write it.
    fn queue_tables_sql() -> String;
    /// Per group of a queue table (quoted as `t`): group, then depth, ready, in flight
    /// and the oldest message's age in µs.
    fn group_stats_sql(t: &str) -> String {
        let now = Self::NOW;
        let (ready, in_flight) = Self::states(
            &format!("visible_at <= {now} AND (lease_until IS NULL OR lease_until <= {now})"),
            &format!("lease_until > {now}"),
        );
        format!(
            "SELECT group_name, {count}, {ready}, {in_flight}, {age} FROM {t} GROUP BY group_name ORDER BY group_name",
            count = Self::COUNT,
            age = Self::age_of("MIN(created_at)"),
        )
    }
    /// Counts of the rows matching `ready` and `in_flight`, as signed integers.
    fn states(ready: &str, in_flight: &str) -> (String, String);
    /// `now` minus the stored time `expr`, in µs.
    fn age_of(expr: &str) -> String;
    /// The notify table's row count and its oldest row's age in µs.
    fn notify_stats_sql(t: &str) -> String {
        format!("SELECT {}, {} FROM {t}", Self::COUNT, Self::notify_age("MIN(created_at)"))
    }
    /// `now` minus the notify table's `created_at` expression `expr`, in µs.
    fn notify_age(expr: &str) -> String {
        Self::age_of(expr)
    }
    /// How many ids queue table `table` has handed out: the last value of the sequence its
    /// ids come from, 0 before the first. A statement returning it as one integer, in one
    /// row when the table exists and none when it does not, and its binds (text).
    fn published_total_sql(table: &QueueTable) -> (String, Vec<String>);
    /// A statement run before [`published_total_sql`](Self::published_total_sql) on the
    /// same connection, its failure ignored: what makes the figure current where the server
    /// serves it from a cache.
    const PUBLISHED_TOTAL_FRESH: Option<&'static str> = None;
}

/// `n` placeholders, numbered from `first`.
pub(crate) fn placeholders<DB: Dialect>(first: usize, n: usize) -> String {
    (first..first + n).map(DB::param).collect::<Vec<_>>().join(", ")
}

/// A queue table's name with `suffix` (`""`, or `_dead` for its dead-letter table), quoted.
pub(crate) fn quoted<DB: Dialect>(table: &QueueTable, suffix: &str) -> String {
    let name = DB::quote(&format!("{}{suffix}", table.name()));
    match table.schema() {
        Some(schema) => format!("{}.{name}", DB::quote(schema)),
        None => name,
    }
}
