//! SQLite: `?` placeholders, times as integer microseconds, one writer at a
//! time (the claim's own write is its lock), the notify table.

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use notify_table::{Dialect as NotifyDialect, NotifyTable, Row, Statement};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode};
use sqlx::{Connection as _, Pool, Sqlite};

use super::{
    Catalog, Claiming, Connecting, DEDUP, Db, KEYS, Keeping, Limiting, Naming, Pausing, Positions,
    Publishing, QUEUE_NAMES, READY, Scheduling, Schema, Waking,
};
use crate::backend::{Backend, connect_error, invalid_url, pool_options};
use crate::driver::sealed::Driver as _;
use crate::driver::{Arg, notify_row, signed_id};
use crate::error::Error;
use crate::names::QueueTable;
use crate::sql::DbPool;
use crate::sql::Notifier;
use crate::sql::TableConn;
use crate::sql::push::PushHandle;

mod busy;

crate::driver::driver!(Sqlite);

impl Db for Sqlite {
    const BACKEND: Backend = Backend::Sqlite;
}

/// Microseconds since the Unix epoch of the time that SQLite's date-function arguments
/// `$time` name. SQLite 3.35 has no `unixepoch`, and the table's defaults run in whichever
/// SQLite writes a row (another program's may be older than the bundled one). SQLite's
/// clock counts whole milliseconds: rounding the Julian day to them undoes its
/// floating-point error (tens of µs), so the value is exact.
macro_rules! epoch_micros {
    ($time:literal) => {
        concat!("(CAST(ROUND((julianday(", $time, ") - 2440587.5) * 86400000.0) AS INTEGER) * 1000)")
    };
}

const NOW: &str = epoch_micros!("'now'");

/// What a claim returns: id, group, payload, attempts, created_at µs.
const CLAIMED: &str = "id, group_name, payload, attempts, created_at, priority, msg_key, dedup_id, headers";

/// The ids of the rows ready to claim, by priority then oldest first, unless paused or
/// held behind an earlier message of their key (binds: group, limit).
fn select_ready(table: &QueueTable) -> String {
    ready_rows(table, "id")
}

/// [`select_ready`] returning `columns` of the rows.
fn ready_rows(table: &QueueTable, columns: &str) -> String {
    let t = super::quoted::<Sqlite>(table, "");
    format!(
        "SELECT {columns} FROM {t} AS q WHERE group_name = ?1 AND visible_at <= {NOW} \
         AND (lease_until IS NULL OR lease_until <= {NOW}) AND {} AND {} AND {} \
         ORDER BY priority, visible_at, id LIMIT ?2",
        Sqlite::not_paused(table, "?1"),
        Sqlite::not_limited_in_claim(table),
        Sqlite::key_free(table)
    )
}

/// Whether SQLite said the database is locked (SQLITE_BUSY).
fn is_locked(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("5"))
}

/// The bytes a WAL is cut back to when it starts over: SQLite's own automatic
/// checkpoints run at 1,000 pages (4 MiB), so a WAL no reader holds stays below this.
const JOURNAL_SIZE_LIMIT: &str = "8388608";

/// `url`'s options; the file is made only with `create`, never because the URL says
/// `mode=rwc`: whether a database appears is the caller's choice, not the URL's. The busy
/// timeout holds until [`busy::install`] replaces SQLite's handler on the connection.
fn options(url: &str, create: bool) -> Result<SqliteConnectOptions, Error> {
    // sqlx leaves the journal mode alone: WAL lets readers run beside the one writer.
    Ok(SqliteConnectOptions::from_str(url)
        .map_err(|e| invalid_url(url, e))?
        .create_if_missing(create)
        .journal_mode(SqliteJournalMode::Wal)
        // A WAL that grew while a reader held it shrinks to this when it starts over.
        .pragma("journal_size_limit", JOURNAL_SIZE_LIMIT)
        .busy_timeout(busy::TIMEOUT))
}

/// A failed open: [`Error::MissingDatabase`] when SQLite could not open a file that is
/// not there and was not to be made, else the driver's error.
fn open_error<'a>(
    url: &'a str,
    options: &'a SqliteConnectOptions,
    create: bool,
) -> impl FnOnce(sqlx::Error) -> Error + 'a {
    move |source| {
        // SQLITE_CANTOPEN, in the low byte of the extended result code.
        let cannot_open = matches!(&source, sqlx::Error::Database(db)
            if db.code().and_then(|code| code.parse::<i32>().ok()).is_some_and(|code| code & 0xff == 14));
        let path = options.get_filename();
        if cannot_open && !create && !path.exists() {
            let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
            Error::MissingDatabase { path }
        } else {
            connect_error(url)(source)
        }
    }
}

impl Naming for Sqlite {
    /// No row locks: `BEGIN IMMEDIATE` holds the database's one write lock.
    const FOR_UPDATE: &'static str = "";

    fn quote(part: &str) -> String {
        format!("`{part}`")
    }

    /// Anonymous: numbered `?NNN` ones cost sqlx a name lookup per bind (measured: 100-row
    /// publishes 15% slower). The claims, whose binds do not follow their text, number
    /// theirs.
    fn param(_: usize) -> String {
        "?".to_owned()
    }

    const NOW: &'static str = NOW;

    fn later(p: &str) -> String {
        format!("{NOW} + {p}")
    }

    fn from_micros(p: &str) -> String {
        p.to_owned()
    }

    fn micros_of(column: &str) -> String {
        column.to_owned()
    }

    fn check_table(table: &QueueTable) -> Result<(), Error> {
        match table.schema() {
            Some(_) => Err(Error::InvalidName {
                name: table.channel().to_owned(),
                reason: "SQLite has no schemas: use an unqualified table name".into(),
            }),
            None => Ok(()),
        }
    }
}

impl Schema for Sqlite {
    /// Besides the shared ones, its indexes': they share the tables' names.
    fn queue_names() -> Vec<&'static str> {
        [&QUEUE_NAMES[..], &[READY, KEYS, DEDUP, super::HISTORY_INDEX_SUFFIX, super::EVENTS_INDEX]].concat()
    }

    const NAMES_FOLD_CASE: bool = true;

    type TableState = ();

    fn table_state(_table: &QueueTable) {}

    fn create_queue(table: &QueueTable) -> Vec<String> {
        let (t, dead) = (super::quoted::<Self>(table, ""), super::quoted::<Self>(table, "_dead"));
        let index = |suffix: &str| Self::quote(&format!("{}{suffix}", table.name()));
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n\
                 \x20 `id` INTEGER PRIMARY KEY AUTOINCREMENT,\n\
                 \x20 `group_name` TEXT NOT NULL DEFAULT '',\n\
                 \x20 `priority` INTEGER NOT NULL DEFAULT 0,\n\
                 \x20 `msg_key` TEXT,\n\
                 \x20 `dedup_id` TEXT,\n\
                 \x20 `headers` TEXT,\n\
                 \x20 `payload` BLOB NOT NULL,\n\
                 \x20 `attempts` INTEGER NOT NULL DEFAULT 0,\n\
                 \x20 `visible_at` INTEGER NOT NULL DEFAULT ({NOW}),\n\
                 \x20 `lease` INTEGER,\n\
                 \x20 `lease_until` INTEGER,\n\
                 \x20 `created_at` INTEGER NOT NULL DEFAULT ({NOW}),\n\
                 \x20 `last_error` TEXT\n\
                 )"
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS {} ON {t} (`group_name`, `priority`, `visible_at`, `id`)",
                index(READY)
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS {} ON {t} (`msg_key`, `id`) WHERE `msg_key` IS NOT NULL",
                index(KEYS)
            ),
            format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS {} ON {t} (`dedup_id`) WHERE `dedup_id` IS NOT NULL",
                index(DEDUP)
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {dead} (\n\
                 \x20 `id` INTEGER PRIMARY KEY,\n\
                 \x20 `group_name` TEXT NOT NULL,\n\
                 \x20 `priority` INTEGER NOT NULL DEFAULT 0,\n\
                 \x20 `msg_key` TEXT,\n\
                 \x20 `headers` TEXT,\n\
                 \x20 `payload` BLOB NOT NULL,\n\
                 \x20 `attempts` INTEGER NOT NULL,\n\
                 \x20 `created_at` INTEGER NOT NULL,\n\
                 \x20 `failed_at` INTEGER NOT NULL DEFAULT ({NOW}),\n\
                 \x20 `last_error` TEXT\n\
                 )"
            ),
        ]
    }

    fn column_def(column: &str) -> &'static str {
        match column {
            "priority" => "INTEGER NOT NULL DEFAULT 0",
            _ => "TEXT",
        }
    }

    /// The database's one write lock, taken at the start.
    const DEPLOY_BEGIN: &'static str = "BEGIN IMMEDIATE";

    /// Nothing more: [`DEPLOY_BEGIN`](Self::DEPLOY_BEGIN) took the database's write lock,
    /// which every other deploy's `BEGIN IMMEDIATE` waits for (up to the busy timeout).
    fn lock_deploy<'c>(_: &'c mut Self::Connection, _: &'c str) -> BoxFuture<'c, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }
}

impl Publishing for Sqlite {
    /// SQLite's default `SQLITE_MAX_LENGTH`, the most a string or blob holds.
    const STATEMENT_LIMIT: (u64, &'static str) = (1_000_000_000, "SQLite's SQLITE_MAX_LENGTH");

    const LAST_ID_SQL: &'static str = "SELECT last_insert_rowid()";
}

/// Nothing to rotate: SQLite writes no row versions into its tables; a reader holding a
/// read transaction holds back the WAL's checkpoints instead, which the upkeep runs and
/// reports.
impl super::Rotating for Sqlite {
    /// `PASSIVE`: copies what no reader holds, waiting for no lock, and lets the next
    /// write start the WAL over once all of it is copied.
    fn checkpoint_sql() -> Option<&'static str> {
        Some("PRAGMA wal_checkpoint(PASSIVE)")
    }
}

impl Claiming for Sqlite {
    /// `BEGIN IMMEDIATE` everywhere: a transaction that will write takes the write lock
    /// first instead of failing to upgrade a read lock.
    const LEASE_CLAIM_BEGIN: &'static str = "BEGIN IMMEDIATE";

    const LOCKED_CLAIM_BEGIN: &'static str = "BEGIN IMMEDIATE";

    const WRITE_BEGIN: &'static str = "BEGIN IMMEDIATE";

    /// The claim is one `UPDATE ... RETURNING`, its own transaction.
    const CLAIM_IN_TRANSACTION: bool = false;

    /// One writer: an acknowledgement that rides on the next claim saves a write
    /// transaction and its sync. (On PostgreSQL and MariaDB it would hold its row locks
    /// while the claim runs, and other claims' deletions queue behind them: measured no
    /// faster there, and slower for batches of 100 on PostgreSQL.)
    const CLAIMS_CARRY_ACKS: bool = true;

    const ONE_WRITER: bool = true;

    /// One writer: the UPDATE's own read is the lock.
    fn claim_sql(table: &QueueTable) -> String {
        let t = super::quoted::<Self>(table, "");
        format!(
            "UPDATE {t} SET lease_until = {}, lease = ?4, attempts = attempts + 1 \
             WHERE id IN ({}) RETURNING {CLAIMED}",
            Self::later("?3"),
            select_ready(table)
        )
    }

    /// Only reads: [`take_locked`](Self::take_locked) deletes the rows next, by id. The
    /// transaction holds the write lock, so nothing changes between the two. One
    /// `DELETE ... WHERE id IN (the ready rows) RETURNING` costs more: SQLite keeps the
    /// subquery's ids and the returned rows in temporary b-trees before the first row
    /// goes out (measured with callgrind, 100-row claims: 3.14M instructions against 2.65M,
    /// the second statement's round trip included).
    fn claim_locked_sql(table: &QueueTable) -> String {
        ready_rows(table, CLAIMED)
    }

    fn take_locked<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c super::TableSql<Self>,
        group: &'c str,
        limit: i64,
        _floor: super::Floor,
    ) -> BoxFuture<'c, Result<Vec<crate::driver::ClaimedRow>, sqlx::Error>> {
        Box::pin(async move {
            let rows =
                Self::fetch_claimed(conn, &sql.claim_locked, &[Arg::Text(group), Arg::Int(limit)]).await?;
            let chunks = rows.chunks(crate::sql::ACK_BATCH);
            let last = chunks.len();
            for (i, chunk) in chunks.enumerate() {
                // The last DELETE carries the handler's savepoint: one round trip less.
                let delete = match i + 1 == last {
                    true => {
                        Arc::from(format!("{}; {}", sql.delete_ids(chunk.len()), Self::HANDLER_SAVEPOINT))
                    }
                    false => sql.delete_ids(chunk.len()),
                };
                let args: Vec<Arg<'_>> = chunk.iter().map(|row| Arg::Int(row.id)).collect();
                Self::execute(conn, &delete, &args).await?;
            }
            Ok(rows)
        })
    }
}

impl Waking for Sqlite {
    fn check_channel(channel: &str) -> Result<(), Error> {
        Ok(notify_table::check_channel(channel).map(drop)?)
    }

    fn notify_sql(notifier: &Notifier, channel: &str, payload: &str) -> Result<Statement, Error> {
        Ok(notifier.sqlite.notify_sql(channel, payload)?)
    }

    fn notify_table(notifier: &Notifier) -> Option<&NotifyTable> {
        Some(&notifier.sqlite)
    }
}

impl Connecting for Sqlite {
    fn connect_pool(url: &str, max: u32, create: bool) -> BoxFuture<'static, Result<Pool<Self>, Error>> {
        let url = url.to_owned();
        Box::pin(async move {
            let pool = pool_options::<Self>(max.min(4))
                .after_connect(|conn, _| Box::pin(async move { busy::install(conn).await }));
            let options = options(&url, create)?;
            // Two processes opening a new file at once both switch it to WAL; SQLite answers
            // the loser "database is locked" at once rather than through the busy timeout
            // (seen with two `rowbus deploy` started together): try again a few times.
            let mut tries = 0;
            loop {
                tries += 1;
                match pool.clone().connect_with(options.clone()).await {
                    Err(e) if is_locked(&e) && tries < 20 => {
                        tokio::time::sleep(Duration::from_millis(25 * tries)).await;
                    }
                    done => return done.map_err(open_error(&url, &options, create)),
                }
            }
        })
    }

    fn wrap(pool: Pool<Self>) -> DbPool {
        DbPool::Sqlite(pool)
    }

    type ListenConn = SqliteConnection;
}

impl Catalog for Sqlite {
    /// The attached databases' names (a queue table name with a schema is refused on
    /// SQLite before any statement).
    fn schema_exists_sql() -> &'static str {
        "SELECT COUNT(*) FROM pragma_database_list WHERE name = ?1"
    }

    fn find_table_sql(_: Option<&str>, name: &str) -> (String, Vec<String>) {
        let sql = format!(
            "SELECT COALESCE((SELECT group_concat(name, ',') FROM pragma_table_info(?1) WHERE name IN ({})), ''), \
             (SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE)",
            super::table::known_columns()
        );
        (sql, vec![name.to_owned()])
    }

    fn queue_tables_sql() -> String {
        format!(
            "SELECT m.name FROM sqlite_master AS m, pragma_table_info(m.name) AS p \
             WHERE m.type = 'table' AND p.name IN ({}) \
             GROUP BY m.name \
             HAVING COUNT(DISTINCT p.name) = {} \
             ORDER BY m.name",
            super::table::column_list(&super::QUEUE_COLUMNS),
            super::QUEUE_COLUMNS.len()
        )
    }

    fn states(ready: &str, in_flight: &str) -> (String, String) {
        (format!("SUM({ready})"), format!("SUM(COALESCE({in_flight}, 0))"))
    }

    fn age_of(expr: &str) -> String {
        format!("{NOW} - {expr}")
    }

    /// The notify table keeps its times as text.
    fn notify_age(expr: &str) -> String {
        format!("CAST((julianday('now') - julianday({expr})) * 86400000000.0 AS INTEGER)")
    }

    /// `AUTOINCREMENT` keeps the largest id ever used in `sqlite_sequence`, which has no
    /// row for the table before its first insert.
    fn published_total_sql(table: &QueueTable) -> (String, Vec<String>) {
        let sql = "SELECT COALESCE((SELECT seq FROM sqlite_sequence s WHERE s.name = m.name), 0) \
                   FROM sqlite_master m WHERE m.type = 'table' AND m.name = ?1 COLLATE NOCASE";
        (sql.to_owned(), vec![table.name().to_owned()])
    }
}

impl Keeping for Sqlite {
    fn create_history(table: &QueueTable) -> Vec<String> {
        let h = super::quoted::<Self>(table, super::HISTORY_SUFFIX);
        let index = Self::quote(&format!("{}{}", table.name(), super::HISTORY_INDEX_SUFFIX));
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {h} (\n\
                 \x20 `id` INTEGER NOT NULL,\n\
                 \x20 `group_name` TEXT NOT NULL,\n\
                 \x20 `payload` BLOB NOT NULL,\n\
                 \x20 `attempts` INTEGER NOT NULL,\n\
                 \x20 `created_at` INTEGER NOT NULL,\n\
                 \x20 `outcome` TEXT NOT NULL,\n\
                 \x20 `handled_at` INTEGER NOT NULL DEFAULT ({NOW}),\n\
                 \x20 `last_error` TEXT\n\
                 )"
            ),
            format!("CREATE INDEX IF NOT EXISTS {index} ON {h} (`handled_at`)"),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (`id` INTEGER PRIMARY KEY, `keep_us` INTEGER NOT NULL)",
                super::quoted::<Self>(table, super::KEEP_SUFFIX)
            ),
        ]
    }

    /// `DELETE ... LIMIT` only where SQLite was built with it: the oldest rows' rowids.
    fn prune_history_sql(h: &str, cutoff: &str, limit: &str) -> String {
        format!(
            "DELETE FROM {h} WHERE rowid IN (SELECT rowid FROM {h} WHERE `handled_at` < {cutoff} \
             ORDER BY `handled_at` LIMIT {limit})"
        )
    }
}

impl super::Counting for Sqlite {
    fn create_counts(table: &QueueTable) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (`name` TEXT PRIMARY KEY, `n` INTEGER NOT NULL)",
            super::quoted::<Self>(table, super::COUNTS_SUFFIX)
        )
    }
}

impl Pausing for Sqlite {
    fn create_pause(table: &QueueTable) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n\
             \x20 `whole_queue` INTEGER NOT NULL,\n\
             \x20 `group_name` TEXT NOT NULL,\n\
             \x20 `paused_at` INTEGER NOT NULL DEFAULT ({NOW}),\n\
             \x20 PRIMARY KEY (`whole_queue`, `group_name`)\n\
             )",
            super::quoted::<Self>(table, super::PAUSE_SUFFIX)
        )
    }
}

impl Limiting for Sqlite {
    fn create_limits(table: &QueueTable) -> Vec<String> {
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                 \x20 `whole_queue` INTEGER NOT NULL,\n\
                 \x20 `group_name` TEXT NOT NULL,\n\
                 \x20 `max_running` INTEGER,\n\
                 \x20 `per_key` INTEGER,\n\
                 \x20 `rate_count` INTEGER,\n\
                 \x20 `rate_period_us` INTEGER,\n\
                 \x20 `rate_burst` INTEGER,\n\
                 \x20 `rate_next_us` INTEGER,\n\
                 \x20 PRIMARY KEY (`whole_queue`, `group_name`)\n\
                 )",
                super::quoted::<Self>(table, super::LIMITS_SUFFIX)
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                 \x20 `whole_queue` INTEGER NOT NULL,\n\
                 \x20 `group_name` TEXT NOT NULL,\n\
                 \x20 `started_us` INTEGER NOT NULL,\n\
                 \x20 `id` INTEGER NOT NULL,\n\
                 \x20 `lease` INTEGER NOT NULL,\n\
                 \x20 PRIMARY KEY (`whole_queue`, `group_name`, `started_us`, `id`)\n\
                 )",
                super::quoted::<Self>(table, super::STARTS_SUFFIX)
            ),
        ]
    }

    fn not_limited_in_claim(table: &QueueTable) -> String {
        Self::not_limited(table, "?1")
    }
}

impl Scheduling for Sqlite {
    fn create_schedules(table: &QueueTable) -> Vec<String> {
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                 \x20 `name` TEXT PRIMARY KEY,\n\
                 \x20 `cron` TEXT NOT NULL,\n\
                 \x20 `payload` TEXT NOT NULL,\n\
                 \x20 `group_name` TEXT NOT NULL,\n\
                 \x20 `every_us` INTEGER NOT NULL,\n\
                 \x20 `since_us` INTEGER NOT NULL,\n\
                 \x20 `version` INTEGER NOT NULL\n\
                 )",
                super::quoted::<Self>(table, super::SCHED_SUFFIX)
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                 \x20 `schedule_name` TEXT NOT NULL,\n\
                 \x20 `tick_us` INTEGER NOT NULL,\n\
                 \x20 `published_at` INTEGER NOT NULL DEFAULT ({NOW}),\n\
                 \x20 PRIMARY KEY (`schedule_name`, `tick_us`)\n\
                 )",
                super::quoted::<Self>(table, super::TICKS_SUFFIX)
            ),
        ]
    }
}

impl Positions for Sqlite {
    fn create_positions(t: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n\
             \x20 `channel` TEXT NOT NULL,\n\
             \x20 `name` TEXT NOT NULL,\n\
             \x20 `position` TEXT NOT NULL,\n\
             \x20 `first_unread` INTEGER NOT NULL,\n\
             \x20 `owner` INTEGER NOT NULL,\n\
             \x20 `checked_in` INTEGER NOT NULL,\n\
             \x20 `lease` INTEGER NOT NULL DEFAULT 0,\n\
             \x20 PRIMARY KEY (`channel`, `name`)\n\
             )"
        )
    }
}

impl TableConn for SqliteConnection {
    type Db = Sqlite;

    async fn rows(
        &mut self,
        stmt: &Statement,
        texts: usize,
    ) -> Result<Vec<crate::driver::TextsAndInts>, sqlx::Error> {
        Sqlite::fetch_rows(self, &stmt.sql, &crate::driver::args_of(stmt), texts).await
    }

    fn dialect() -> NotifyDialect {
        NotifyDialect::Sqlite { pid: std::process::id() }
    }

    /// Never makes the file: a listener reads a notify table that `deploy` made.
    async fn open(url: &str) -> Result<(Self, String), Error> {
        let options = options(url, false)?;
        let mut conn =
            SqliteConnection::connect_with(&options).await.map_err(open_error(url, &options, false))?;
        busy::install(&mut conn).await.map_err(connect_error(url))?;
        Ok((conn, url.to_owned()))
    }

    /// A watch on the database's files (see `push/watch.rs`).
    fn push(at: &str, _table: &str, retry: (Duration, Duration)) -> Option<PushHandle> {
        let file = options(at, false).map(|o| o.get_filename().to_owned()).unwrap_or_default();
        Some(super::push::spawn::<super::push::watch::FileWatch>(
            "a watch on the database's files",
            file,
            retry.0,
            retry.1,
        ))
    }

    /// Changes when another connection commits; reads no page.
    async fn data_version(&mut self) -> Result<Option<i64>, sqlx::Error> {
        Ok(Some(sqlx::query_scalar("PRAGMA data_version").fetch_one(self).await?))
    }

    async fn session_id(&mut self) -> Result<Option<u64>, Error> {
        Ok(None)
    }

    async fn fetch(&mut self, stmt: &Statement) -> Result<Vec<Row>, sqlx::Error> {
        Sqlite::statement(stmt).fetch_all(self).await?.iter().map(notify_row).collect()
    }

    async fn execute(&mut self, stmt: &Statement) -> Result<u64, sqlx::Error> {
        Ok(Sqlite::statement(stmt).execute(self).await?.rows_affected())
    }

    async fn fetch_ids(&mut self, stmt: &Statement) -> Result<Vec<u64>, sqlx::Error> {
        Sqlite::statement(stmt).fetch_all(self).await?.iter().map(signed_id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::TableSql;

    fn sql(name: &str) -> TableSql<Sqlite> {
        TableSql::new(&name.parse().unwrap()).unwrap()
    }

    async fn memory() -> SqliteConnection {
        SqliteConnection::connect("sqlite::memory:").await.unwrap()
    }

    /// `NOW` is the Unix time Rust reads, in µs, down to SQLite's whole milliseconds.
    #[tokio::test]
    async fn now_is_the_unix_time_in_micros() {
        let micros = || {
            let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            i64::try_from(since.as_micros()).unwrap()
        };
        let mut conn = memory().await;
        let before = micros();
        let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {NOW}")))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        let after = micros();
        assert_eq!(now % 1000, 0, "{now}");
        assert!(before - before % 1000 <= now && now <= after, "{before} <= {now} <= {after}");
    }

    /// Exact for every millisecond: a dense run of them from 2024 and one every ~11.6 days
    /// from 1970 to 2160, against the exact value and against `unixepoch('subsec')` of
    /// the bundled SQLite (3.42+), rounded. The time comes in through the same Julian day
    /// arithmetic as `'now'` (whole milliseconds, by `'unixepoch'`).
    #[tokio::test]
    async fn epoch_micros_is_exact_for_every_millisecond() {
        let at = epoch_micros!("n.ms / 1000.0, 'unixepoch'");
        let sql = format!(
            "WITH RECURSIVE n(ms, k) AS (SELECT ?1, 1 UNION ALL SELECT ms + ?2, k + 1 FROM n WHERE k < ?3) \
             SELECT COUNT(*), MIN(ms) FROM n WHERE {at} != ms * 1000 \
             OR {at} != CAST(ROUND(unixepoch(n.ms / 1000.0, 'unixepoch', 'subsec') * 1000000) AS INTEGER)"
        );
        let mut conn = memory().await;
        for (first, step, count) in [(1_704_067_200_000_i64, 1_i64, 200_000_i64), (0, 1_000_003, 6_000)] {
            let (wrong, example): (i64, Option<i64>) = sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))
                .bind(first)
                .bind(step)
                .bind(count)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            assert_eq!(wrong, 0, "{wrong} of {count} milliseconds from {first} wrong, the first {example:?}");
        }
    }

    #[test]
    fn no_schemas() {
        assert!(TableSql::<Sqlite>::new(&"app.jobs".parse().unwrap()).is_err());
    }

    #[test]
    fn claims_number_their_binds() {
        let t = sql("jobs");
        assert!(t.claim.starts_with(&format!("UPDATE `jobs` SET lease_until = {NOW} + ?3, lease = ?4")));
        assert!(
            t.claim.contains("group_name = ?1") && t.claim.contains("LIMIT ?2) RETURNING id, group_name")
        );
        assert!(t.claim_locked.starts_with("SELECT id, group_name, payload, attempts, created_at"));
        assert!(t.claim_locked.ends_with("ORDER BY priority, visible_at, id LIMIT ?2"));
        assert_eq!(&*t.delete_ids(2), "DELETE FROM `jobs` WHERE id IN (?, ?)");
        assert_eq!(t.restore(1).matches('?').count(), 11);
        assert_eq!(t.ack_pairs(1), "DELETE FROM `jobs` WHERE id IN (?) AND (id, lease) IN ((?, ?))");
    }
}
