//! Deduplication ids on MySQL/MariaDB: a table of their own, `<queue>_dedup`, rather than a
//! unique index on the queue table.
//!
//! InnoDB has no partial index: a unique index on the queue table's `dedup_id` holds an
//! entry for every message, most of them NULL, and checks it on every insert. It cost
//! publishes of 100 messages 35-45% of their rate (mariadb-slap, 8 clients, the queue table
//! with and without it: 57,000-67,000 rows/s against 82,000-99,000). So the queue table
//! keeps the id in an unindexed column, and `<queue>_dedup` (`dedup_id` its key, `id` the
//! message's) holds one row per id that a message took.
//!
//! A row there may outlive its message: acknowledgements, dead letters and every other
//! way a message leaves never look at it. So a row holds its id only while the message it
//! names is still in the queue table with that id (a message put back after a failed
//! transactional handler keeps its row; a requeued dead letter has no id). Taking an id:
//! insert the message, then its row; if the id has a row already, lock it and look at the
//! message it names: still there, the new message is a duplicate and goes; gone, the row
//! passes to the new message. All in one transaction, so a message is never stored without
//! its id's row, and two publishers of one id meet at the row's lock (the second then sees
//! the first's message). Rows whose messages are gone are deleted now and then by the
//! publishers ([`CLEANUP_EVERY`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use sqlx::{MySql, MySqlConnection};

use crate::driver::Arg;
use crate::driver::sealed::Driver as _;
use crate::names::QueueTable;
use crate::sql::{DEDUP, Naming, TableSql, placeholders, quoted};

/// One in this many publishes of a deduplicated message runs a cleanup: it looks at
/// [`CLEANUP_ROWS`] rows, the next ones after the last cleanup's, and deletes those whose
/// messages are gone. A cleanup so costs the same however many live rows the table holds,
/// and the stale rows stay in proportion to them (a cleanup takes in the rows about 256
/// publishes left behind, about a quarter of those it looks at).
const CLEANUP_EVERY: u64 = 256;
const CLEANUP_ROWS: i64 = 1000;

/// The ids' table, if missing.
pub(super) fn create(table: &QueueTable) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n\
         \x20 `dedup_id` {} NOT NULL,\n\
         \x20 `id` BIGINT UNSIGNED NOT NULL,\n\
         \x20 PRIMARY KEY (`dedup_id`)\n\
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        quoted::<MySql>(table, DEDUP),
        super::side::SHORT_TEXT
    )
}

/// What moves a queue table of an older rowbus, whose `dedup_id` has a unique index
/// `<queue>_dedup`, to the ids' table: whether the index is there (binds: schema if any,
/// table, index), then the ids' table, the ids copied into it and the index dropped.
pub(super) fn upgrade(table: &QueueTable) -> (String, Vec<String>, Vec<String>) {
    let (q, d) = (quoted::<MySql>(table, ""), quoted::<MySql>(table, DEDUP));
    let copy = format!(
        "INSERT IGNORE INTO {d} (dedup_id, id) SELECT dedup_id, id FROM {q} WHERE dedup_id IS NOT NULL"
    );
    super::side::index_to_table(table, DEDUP, create(table), copy)
}

/// One queue's ids: the statements of a publish, and the cleanup's count and position.
#[derive(Debug)]
pub(super) struct State {
    /// Binds: those of [`TableSql::insert`], then the id. The message, no conflict clause.
    insert: Arc<str>,
    /// Binds: the id. The row of the message just inserted.
    take: Arc<str>,
    /// Binds: the id. Locks its row; the message it names.
    lock: Arc<str>,
    /// Binds: message id, dedup id. Whether that message is still there with that id.
    live: Arc<str>,
    /// Binds: the id. Hands the row to the message just inserted.
    hand_over: Arc<str>,
    /// Messages with an id this process published: one in [`CLEANUP_EVERY`] cleans up.
    published: AtomicU64,
    /// The id after which the next cleanup looks (empty: from the start).
    swept_to: Mutex<String>,
}

impl State {
    pub(super) fn of(table: &QueueTable) -> Self {
        let (q, d) = (quoted::<MySql>(table, ""), quoted::<MySql>(table, DEDUP));
        State {
            insert: TableSql::<MySql>::insert_with_dedup_sql(&q).into(),
            take: format!("INSERT INTO {d} (dedup_id, id) VALUES (?, LAST_INSERT_ID())").into(),
            lock: format!("SELECT CAST(id AS SIGNED) FROM {d} WHERE dedup_id = ? FOR UPDATE").into(),
            live: format!("SELECT 1 FROM {q} WHERE id = ? AND dedup_id = ?").into(),
            hand_over: format!("UPDATE {d} SET id = LAST_INSERT_ID() WHERE dedup_id = ?").into(),
            published: AtomicU64::new(0),
            swept_to: Mutex::default(),
        }
    }
}

/// MySQL's error for a key taken.
fn is_duplicate_key(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else { return false };
    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|my| my.number() == 1062)
}

/// [`Publishing::insert_deduplicated`](crate::sql::Publishing::insert_deduplicated) on MySQL/MariaDB: in a transaction of its own, or a
/// savepoint of the caller's (sqlx's nested `begin`), which a dropped future rolls back.
pub(super) fn insert<'c>(
    conn: &'c mut MySqlConnection,
    sql: &'c TableSql<MySql>,
    args: &'c [Arg<'c>],
    alone: bool,
) -> BoxFuture<'c, Result<bool, sqlx::Error>> {
    Box::pin(async move {
        let Some(Arg::Text(id)) = args.last().copied() else {
            return Err(sqlx::Error::Protocol("a deduplicated message binds its id last".into()));
        };
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let stored = take(&mut tx, sql, args, id).await?;
        if stored {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        if alone
            && sql.state.dedup.published.fetch_add(1, Ordering::Relaxed) % CLEANUP_EVERY == CLEANUP_EVERY - 1
        {
            clean_up(conn, sql).await?;
        }
        Ok(stored)
    })
}

/// Inserts the message and takes its id (see the module's doc); whether it did.
async fn take(
    conn: &mut MySqlConnection,
    sql: &TableSql<MySql>,
    args: &[Arg<'_>],
    id: &str,
) -> Result<bool, sqlx::Error> {
    let ids = &sql.state.dedup;
    MySql::execute(conn, &ids.insert, args).await?;
    // A keyed message's row in the keys' table goes with it (see `keys`).
    if let Some(Arg::Text(key)) = args.get(super::keys::KEY_BIND) {
        super::keys::take(conn, sql, key).await?;
    }
    // A row that vanishes between the failed insert and its lock was cleaned up: again.
    for _ in 0..3 {
        match MySql::execute(conn, &ids.take, &[Arg::Text(id)]).await {
            Ok(_) => return Ok(true),
            Err(e) if is_duplicate_key(&e) => {}
            Err(e) => return Err(e),
        }
        let held = MySql::fetch_rows(conn, &ids.lock, &[Arg::Text(id)], 0).await?;
        let Some(holder) = held.first().map(|row| row.int(0)) else { continue };
        // A statement of its own: under READ COMMITTED it sees what committed before it,
        // the holder's message too when it committed while this waited for the lock.
        let live = MySql::fetch_rows(conn, &ids.live, &[Arg::Int(holder), Arg::Text(id)], 0).await?;
        if !live.is_empty() {
            return Ok(false);
        }
        MySql::execute(conn, &ids.hand_over, &[Arg::Text(id)]).await?;
        return Ok(true);
    }
    Err(sqlx::Error::Protocol(format!("deduplication id {id:?}: its row kept vanishing; publish again")))
}

/// Looks at the next [`CLEANUP_ROWS`] rows by deduplication id (from where the last
/// cleanup stopped, from the start once it reached the end) and deletes those whose
/// messages are gone. A row handed to a new message meanwhile names another message and
/// stays.
async fn clean_up(conn: &mut MySqlConnection, sql: &TableSql<MySql>) -> Result<(), sqlx::Error> {
    let (q, d) = (&sql.quoted, quoted::<MySql>(&sql.table, DEDUP));
    let window = format!(
        "SELECT {}, CAST(d.id AS SIGNED), CAST(q.id IS NULL AS SIGNED) \
         FROM (SELECT dedup_id, id FROM {d} WHERE dedup_id > ? ORDER BY dedup_id LIMIT ?) AS d \
         LEFT JOIN {q} AS q ON q.id = d.id AND q.dedup_id = d.dedup_id ORDER BY d.dedup_id",
        MySql::text_of("d.dedup_id")
    );
    let from = sql.state.dedup.swept_to.lock().expect("sweep position").clone();
    let window =
        MySql::fetch_rows(conn, &window.into(), &[Arg::Text(&from), Arg::Int(CLEANUP_ROWS)], 1).await?;
    let next = match window.last() {
        Some(last) if window.len() as i64 == CLEANUP_ROWS => last.text(0).to_owned(),
        _ => String::new(),
    };
    *sql.state.dedup.swept_to.lock().expect("sweep position") = next;
    let rows: Vec<_> = window.iter().filter(|row| row.int(1) == 1).collect();
    if rows.is_empty() {
        return Ok(());
    }
    let pairs: Vec<String> = rows.iter().map(|_| "(?, ?)".to_owned()).collect();
    let delete = format!(
        "DELETE FROM {d} WHERE dedup_id IN ({}) AND (dedup_id, id) IN ({})",
        placeholders::<MySql>(1, rows.len()),
        pairs.join(", ")
    );
    let ids = rows.iter().map(|row| Arg::Text(row.text(0)));
    let pairs = rows.iter().flat_map(|row| [Arg::Text(row.text(0)), Arg::Int(row.int(0))]);
    let args: Vec<Arg<'_>> = ids.chain(pairs).collect();
    MySql::execute(conn, &delete.into(), &args).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_a_table_and_older_tables_move_to_it() {
        let table: QueueTable = "app.jobs".parse().unwrap();
        assert!(create(&table).starts_with("CREATE TABLE IF NOT EXISTS `app`.`jobs_dedup` ("));
        let (check, binds, statements) = upgrade(&table);
        assert!(check.contains("table_schema = ? AND table_name = ? AND index_name = ?"), "{check}");
        assert_eq!(binds, ["app", "jobs", "jobs_dedup"]);
        assert_eq!(statements[0], create(&table));
        assert_eq!(
            statements[1],
            "INSERT IGNORE INTO `app`.`jobs_dedup` (dedup_id, id) SELECT dedup_id, id FROM `app`.`jobs` WHERE dedup_id IS NOT NULL"
        );
        assert_eq!(statements[2], "ALTER TABLE `app`.`jobs` DROP INDEX `jobs_dedup`");
        let (check, binds, _) = upgrade(&"jobs".parse().unwrap());
        assert!(check.contains("table_schema = DATABASE()"));
        assert_eq!(binds, ["jobs", "jobs_dedup"]);
    }

    #[test]
    fn an_id_is_taken_by_the_message_just_inserted() {
        let sql = TableSql::<MySql>::new(&"jobs".parse().unwrap()).unwrap();
        let ids = &sql.state.dedup;
        assert_eq!(&*ids.take, "INSERT INTO `jobs_dedup` (dedup_id, id) VALUES (?, LAST_INSERT_ID())");
        assert!(ids.lock.ends_with("WHERE dedup_id = ? FOR UPDATE"));
        assert_eq!(&*ids.live, "SELECT 1 FROM `jobs` WHERE id = ? AND dedup_id = ?");
        assert!(ids.insert.starts_with("INSERT INTO `jobs` (group_name"), "no IGNORE");
    }
}
