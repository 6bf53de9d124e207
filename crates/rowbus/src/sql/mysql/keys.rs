//! Ordering keys on MySQL/MariaDB: a table of their own, `<queue>_keys`, rather than an
//! index `(msg_key, id)` on the queue table.
//!
//! InnoDB has no partial index, and an index on a column NULL for nearly every message
//! still takes an entry per message: with the deduplication ids' index gone (see `dedup`),
//! it was what was left between 100-message publishes and the plain table
//! (mariadb-slap, 8 clients: 73,000-79,000 rows/s with it, 90,000-99,000 without). So the
//! queue table keeps the key in an unindexed column, and `<queue>_keys` holds `(id,
//! msg_key)` for each keyed message, written in the transaction that writes the message.
//!
//! The claim's check, "no earlier message of this key in the queue", reads that table and
//! joins each earlier row found to the queue table, so a row whose message is gone counts
//! for nothing: a message leaving never has to touch it in its own transaction. Rows go
//! after their message left for good: the process that settled keyed messages deletes,
//! up to 128 at a time once they committed, the rows of those now in neither the queue
//! nor its dead letters, and now and then ([`VACUUM_EVERY`]) any such row (left by a process that died in
//! between, or by a dead letter purged). A dead letter keeps its row, since a requeue
//! brings it back under its id; the requeue writes the row again all the same, in its own
//! transaction. A message in neither table in a consistent read never comes back, so
//! neither ever takes a row a message needs.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::{MySql, MySqlConnection, Pool};

use crate::driver::sealed::Driver as _;
use crate::driver::{Arg, ClaimedRow};
use crate::names::QueueTable;
use crate::sql::{KEYS, Naming, TableSql, placeholders, quoted};

/// The suffix of the keys' table.
pub(super) const KEYS_TABLE: &str = "_keys";

/// Each time this many more keyed messages settled, a vacuum looks at [`VACUUM_ROWS`]
/// rows, the next ones after the last vacuum's, and deletes those whose messages are gone
/// (so a vacuum costs the same however many messages wait).
const VACUUM_EVERY: u64 = 256;
/// Settled keyed messages whose rows one statement deletes.
const GONE_BATCH: usize = 128;
/// How long the rows of fewer settled keyed messages wait for more.
const GONE_AFTER: Duration = Duration::from_millis(500);
const VACUUM_ROWS: i64 = 1000;

/// One queue's keys: the statements of a publish, the settled messages whose rows wait to
/// be deleted, and the vacuum's count and position.
#[derive(Debug)]
pub(super) struct State {
    /// After an INSERT of keyed messages: their rows (see [`insert`]).
    rows: Arc<str>,
    /// Binds: the key. The row of the message just inserted.
    take: Arc<str>,
    /// Keyed messages settled: a vacuum each [`VACUUM_EVERY`].
    settled: AtomicU64,
    pending: Mutex<Pending>,
    /// The id after which the next vacuum looks (0: from the start).
    swept_to: AtomicI64,
}

/// Settled keyed messages whose rows are held back to be deleted together.
#[derive(Debug, Default)]
struct Pending {
    ids: Vec<i64>,
    /// A task is to delete them shortly.
    timer: bool,
}

impl State {
    pub(super) fn of(table: &QueueTable) -> Self {
        let (q, k) = (quoted::<MySql>(table, ""), quoted::<MySql>(table, KEYS_TABLE));
        State {
            rows: format!(
                "INSERT IGNORE INTO {k} (id, msg_key) SELECT id, msg_key FROM {q} \
                 WHERE id >= LAST_INSERT_ID() AND msg_key IS NOT NULL"
            )
            .into(),
            take: format!("INSERT INTO {k} (id, msg_key) VALUES (LAST_INSERT_ID(), ?)").into(),
            settled: AtomicU64::new(0),
            pending: Mutex::default(),
            swept_to: AtomicI64::new(0),
        }
    }
}

/// The keys' table, if missing.
pub(super) fn create(table: &QueueTable) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n\
         \x20 `id` BIGINT UNSIGNED NOT NULL,\n\
         \x20 `msg_key` {} NOT NULL,\n\
         \x20 PRIMARY KEY (`id`),\n\
         \x20 KEY {} (`msg_key`, `id`)\n\
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        quoted::<MySql>(table, KEYS_TABLE),
        super::side::SHORT_TEXT,
        key_index()
    )
}

/// The claim's check (see [`Claiming::key_free`](crate::sql::Claiming::key_free)) against the keys' table: the key's
/// earlier rows by the keys' index, each looked up in the queue. The index is forced and
/// the join order kept (`STRAIGHT_JOIN`): on the statistics of tables just made (empty)
/// MariaDB read the keys' table by id, every row below the candidate's, thousands of rows
/// per claim (`rowbus bench broker --keys 20000`, the slow log's `Rows_examined`).
pub(super) fn key_free(table: &QueueTable) -> String {
    format!(
        "(q.msg_key IS NULL OR NOT EXISTS (SELECT 1 FROM {} AS k FORCE INDEX ({}) STRAIGHT_JOIN {} AS e \
         ON e.id = k.id WHERE k.msg_key = q.msg_key AND k.id < q.id))",
        quoted::<MySql>(table, KEYS_TABLE),
        key_index(),
        quoted::<MySql>(table, "")
    )
}

/// [`key_free`] with `n` (at least 2) messages of a key at once: fewer than `n` earlier
/// rows of the key whose message is in the queue. `n` is written into the statement.
pub(super) fn key_within(table: &QueueTable, n: i64) -> String {
    format!(
        "(q.msg_key IS NULL OR NOT EXISTS (SELECT 1 FROM {} AS k FORCE INDEX ({}) STRAIGHT_JOIN {} AS e \
         ON e.id = k.id WHERE k.msg_key = q.msg_key AND k.id < q.id LIMIT 1 OFFSET {}))",
        quoted::<MySql>(table, KEYS_TABLE),
        key_index(),
        quoted::<MySql>(table, ""),
        n - 1
    )
}

/// The claimed `rows` less those whose key an earlier message in the queue holds (with
/// `per_key` above 1: `per_key` earlier messages), as a
/// statement begun now sees the queue. The claim's own check is not enough on InnoDB: its
/// locking read sees the latest committed rows, while the key check, a plain read, sees the
/// statement's snapshot; a keyed batch committed while the claim scanned passed the check
/// whole, its earlier rows not yet in the snapshot. Run after the locking read in the
/// claim's transaction; the rows it drops stay locked until that transaction ends and are
/// neither marked nor deleted. One statement, only when a claimed row has a key.
pub(super) async fn recheck(
    conn: &mut MySqlConnection,
    sql: &TableSql<MySql>,
    mut rows: Vec<ClaimedRow>,
    per_key: i64,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let keyed: Vec<i64> = rows.iter().filter(|row| row.key.is_some()).map(|row| row.id).collect();
    if keyed.is_empty() {
        return Ok(rows);
    }
    let check = format!(
        "SELECT CAST(q.id AS SIGNED) FROM {} AS q WHERE q.id IN ({}) AND NOT {}",
        sql.quoted,
        placeholders::<MySql>(1, keyed.len()),
        if per_key > 1 { key_within(&sql.table, per_key) } else { key_free(&sql.table) }
    );
    let args: Vec<Arg<'_>> = keyed.iter().map(|id| Arg::Int(*id)).collect();
    let held = MySql::fetch_rows(conn, &Arc::from(check), &args, 0).await?;
    let held: Vec<i64> = held.iter().map(|row| row.int(0)).collect();
    if !held.is_empty() {
        rows.retain(|row| !held.contains(&row.id));
    }
    Ok(rows)
}

/// The keys' index `(msg_key, id)`. MySQL names indexes per table, and a name made from
/// the table's would pass the 64 characters of an identifier for the longest table names.
fn key_index() -> String {
    MySql::quote("by_key")
}

/// What moves a queue table of an older rowbus, whose keys have an index `<queue>_key`,
/// to the keys' table (as [`Schema::index_upgrades`](crate::sql::Schema::index_upgrades) says).
pub(super) fn upgrade(table: &QueueTable) -> (String, Vec<String>, Vec<String>) {
    let (q, k) = (quoted::<MySql>(table, ""), quoted::<MySql>(table, KEYS_TABLE));
    let copy =
        format!("INSERT IGNORE INTO {k} (id, msg_key) SELECT id, msg_key FROM {q} WHERE msg_key IS NOT NULL");
    super::side::index_to_table(table, KEYS, create(table), copy)
}

/// [`Publishing::insert_messages`](crate::sql::Publishing::insert_messages): keyed ones in a transaction (a savepoint of the caller's)
/// with their rows in the keys' table: those of the messages just inserted (ids from the
/// first one on, which may take in other publishers' committed ones, whose rows are there
/// already).
pub(super) fn insert<'c>(
    conn: &'c mut MySqlConnection,
    sql: &'c TableSql<MySql>,
    insert: &'c Arc<str>,
    args: &'c [Arg<'c>],
    keyed: bool,
) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
    Box::pin(async move {
        if !keyed {
            return MySql::execute(conn, insert, args).await;
        }
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let stored = MySql::execute(&mut tx, insert, args).await?;
        MySql::execute(&mut tx, &sql.state.keys.rows, &[]).await?;
        tx.commit().await?;
        Ok(stored)
    })
}

/// Where a message's ordering key is among the binds of [`TableSql::insert`].
pub(super) const KEY_BIND: usize = 4;

/// The row of the message just inserted on `conn`, whose key is `key`.
pub(super) async fn take(
    conn: &mut MySqlConnection,
    sql: &TableSql<MySql>,
    key: &str,
) -> Result<(), sqlx::Error> {
    MySql::execute(conn, &sql.state.keys.take, &[Arg::Text(key)]).await.map(drop)
}

/// [`Publishing::requeued`](crate::sql::Publishing::requeued): the requeued dead letters' rows, from the dead letters.
pub(super) fn requeued<'c>(
    conn: &'c mut MySqlConnection,
    sql: &'c TableSql<MySql>,
    ids: &'c [Arg<'c>],
) -> BoxFuture<'c, Result<(), sqlx::Error>> {
    Box::pin(async move {
        let k = quoted::<MySql>(&sql.table, KEYS_TABLE);
        let rows = format!(
            "INSERT IGNORE INTO {k} (id, msg_key) SELECT id, msg_key FROM {} WHERE id IN ({}) AND msg_key IS NOT NULL",
            sql.dead,
            placeholders::<MySql>(1, ids.len())
        );
        MySql::execute(conn, &rows.into(), ids).await.map(drop)
    })
}

/// [`Publishing::keyed_gone`](crate::sql::Publishing::keyed_gone): the rows of those in neither the queue nor its dead letters
/// deleted, [`GONE_BATCH`] at a time (or what settled within [`GONE_AFTER`]); a vacuum
/// each [`VACUUM_EVERY`] settled. Not a statement per settle, which would double an
/// acknowledgement's writes: a stale row costs nothing meanwhile (the claim's check joins
/// it to the queue).
pub(super) fn gone<'c>(
    pool: &'c Pool<MySql>,
    sql: &'c Arc<TableSql<MySql>>,
    ids: &'c [i64],
) -> BoxFuture<'c, Result<(), sqlx::Error>> {
    Box::pin(async move {
        let (full, timer) = {
            let mut pending = sql.state.keys.pending.lock().expect("keys' buffer");
            pending.ids.extend_from_slice(ids);
            let timer = !std::mem::replace(&mut pending.timer, true);
            (pending.ids.len() >= GONE_BATCH, timer)
        };
        if timer {
            let (pool, sql) = (pool.clone(), sql.clone());
            tokio::spawn(async move {
                tokio::time::sleep(GONE_AFTER).await;
                sql.state.keys.pending.lock().expect("keys' buffer").timer = false;
                if let Err(error) = delete_settled(&pool, &sql).await {
                    tracing::debug!(%error, "cleaning up after keyed messages failed; a vacuum does it");
                }
            });
        }
        if full {
            return delete_settled(pool, sql).await;
        }
        Ok(())
    })
}

/// Deletes the rows of the settled messages held back, and vacuums when their count
/// passed a multiple of [`VACUUM_EVERY`].
async fn delete_settled(pool: &Pool<MySql>, sql: &TableSql<MySql>) -> Result<(), sqlx::Error> {
    let ids = std::mem::take(&mut sql.state.keys.pending.lock().expect("keys' buffer").ids);
    if ids.is_empty() {
        return Ok(());
    }
    let mut conn = pool.acquire().await?;
    let args: Vec<Arg<'_>> = ids.iter().copied().map(Arg::Int).collect();
    MySql::execute(&mut conn, &gone_sql(sql, ids.len()).into(), &args).await?;
    let before = sql.state.keys.settled.fetch_add(ids.len() as u64, Ordering::Relaxed);
    if before / VACUUM_EVERY != (before + ids.len() as u64) / VACUUM_EVERY {
        vacuum(&mut conn, sql).await?;
    }
    Ok(())
}

/// Deletes the rows of messages `ids` (binds) that are in neither the queue table nor
/// its dead letters. A consistent read: a message in neither never comes back (a
/// requeue takes it from the dead letters, in one transaction), so a row this deletes
/// is never needed again; a message still leased by another process, or dead-lettered
/// (a requeue brings it back under its id), keeps its row.
fn gone_sql(sql: &TableSql<MySql>, ids: usize) -> String {
    let k = quoted::<MySql>(&sql.table, KEYS_TABLE);
    format!(
        "DELETE FROM {k} WHERE id IN ({}) AND NOT EXISTS (SELECT 1 FROM {} AS q WHERE q.id = {k}.id) \
         AND NOT EXISTS (SELECT 1 FROM {} AS d WHERE d.id = {k}.id)",
        placeholders::<MySql>(1, ids),
        sql.quoted,
        sql.dead
    )
}

/// Looks at the next [`VACUUM_ROWS`] rows by id (from where the last vacuum stopped,
/// from the start once it reached the end) and deletes those whose messages are in
/// neither the queue table nor the dead letters.
async fn vacuum(conn: &mut MySqlConnection, sql: &TableSql<MySql>) -> Result<(), sqlx::Error> {
    let k = quoted::<MySql>(&sql.table, KEYS_TABLE);
    let window = format!(
        "SELECT CAST(k.id AS SIGNED), CAST(q.id IS NULL AND d.id IS NULL AS SIGNED) \
         FROM (SELECT id FROM {k} WHERE id > ? ORDER BY id LIMIT ?) AS k \
         LEFT JOIN {} AS q ON q.id = k.id LEFT JOIN {} AS d ON d.id = k.id ORDER BY k.id",
        sql.quoted, sql.dead
    );
    let from = sql.state.keys.swept_to.load(Ordering::Relaxed);
    let rows = MySql::fetch_rows(conn, &window.into(), &[Arg::Int(from), Arg::Int(VACUUM_ROWS)], 0).await?;
    let next = match rows.last() {
        Some(last) if rows.len() as i64 == VACUUM_ROWS => last.int(0),
        _ => 0,
    };
    sql.state.keys.swept_to.store(next, Ordering::Relaxed);
    // The same check again, on the rows found: as for `gone_sql`.
    let args: Vec<Arg<'_>> =
        rows.iter().filter(|row| row.int(1) == 1).map(|row| Arg::Int(row.int(0))).collect();
    if args.is_empty() {
        return Ok(());
    }
    MySql::execute(conn, &gone_sql(sql, args.len()).into(), &args).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_a_table_and_older_tables_move_to_it() {
        let table: QueueTable = "app.jobs".parse().unwrap();
        assert!(create(&table).starts_with("CREATE TABLE IF NOT EXISTS `app`.`jobs_keys` ("));
        assert!(create(&table).contains("KEY `by_key` (`msg_key`, `id`)"));
        let (check, binds, statements) = upgrade(&table);
        assert!(check.contains("index_name = ?"), "{check}");
        assert_eq!(binds, ["app", "jobs", "jobs_key"]);
        assert_eq!(
            statements[1],
            "INSERT IGNORE INTO `app`.`jobs_keys` (id, msg_key) SELECT id, msg_key FROM `app`.`jobs` WHERE msg_key IS NOT NULL"
        );
        assert_eq!(statements[2], "ALTER TABLE `app`.`jobs` DROP INDEX `jobs_key`");
    }

    #[test]
    fn the_claims_check_counts_only_rows_whose_message_is_there() {
        let free = key_free(&"jobs".parse().unwrap());
        assert_eq!(
            free,
            "(q.msg_key IS NULL OR NOT EXISTS (SELECT 1 FROM `jobs_keys` AS k FORCE INDEX (`by_key`) \
             STRAIGHT_JOIN `jobs` AS e ON e.id = k.id WHERE k.msg_key = q.msg_key AND k.id < q.id))"
        );
    }
}
