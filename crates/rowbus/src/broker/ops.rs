//! The broker's statements, run on a connection: the one place that speaks SQL.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Pool, Transaction};
use tracing::warn;

use super::table::TableSql;
use super::{Message, Queue};
use crate::backend::Backend;
use crate::db::{Arg, ClaimedRow, Db, args_of};
use crate::error::{Error, is_missing_table, is_retryable};

/// A driver error, named for the queue when it says the table is missing.
fn queue_error<DB: Db>(queue: &Queue<DB>, e: sqlx::Error) -> Error {
    if is_missing_table(&e) {
        Error::MissingQueueTable { table: queue.sql.table.to_string() }
    } else {
        Error::Database(e)
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Most messages one INSERT carries (three binds each).
const INSERT_CHUNK: usize = 1000;
/// Tries of a statement that deadlocked (MySQL/MariaDB take row locks in index order).
/// InnoDB detects a deadlock at once, so a try costs a round trip; with 4, eight
/// subscriptions taking 16- and 100-row transactional batches from one table still saw
/// a claim in a few hundred fail (and wait the failed-claim second).
const DEADLOCK_TRIES: usize = 10;

/// Rows a statement puts back after a failed transactional handler (7 binds each, well
/// under every database's limit on binds).
const RESTORE_BATCH: usize = 256;

/// A transaction; on SQLite `BEGIN IMMEDIATE`, so a claim takes the write lock first
/// instead of failing to upgrade a read lock.
pub(crate) async fn begin<DB: Db>(pool: &Pool<DB>) -> Result<Transaction<'static, DB>, Error> {
    Ok(begin_sqlx(pool).await?)
}

async fn begin_sqlx<DB: Db>(pool: &Pool<DB>) -> Result<Transaction<'static, DB>, sqlx::Error> {
    match DB::BACKEND {
        Backend::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await,
        _ => pool.begin().await,
    }
}

pub(crate) async fn deploy<DB: Db>(queue: &Queue<DB>) -> Result<(), Error> {
    let sql = &queue.sql;
    let mut conn = queue.inner().pool.acquire().await?;
    if let (Backend::Postgres, Some((schema, _))) = (DB::BACKEND, sql.table.channel().split_once('.')) {
        let create = Arc::from(format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""));
        DB::execute(&mut conn, &create, &[]).await?;
    }
    for statement in &sql.create {
        DB::execute(&mut conn, &Arc::from(statement.as_str()), &[]).await?;
    }
    if let Some(notifier) = &queue.inner().notifier {
        for stmt in notifier.table(DB::BACKEND).create_table_sql() {
            DB::execute(&mut conn, &stmt.sql, &[]).await?;
        }
    }
    Ok(())
}

pub(crate) async fn undeploy<DB: Db>(queue: &Queue<DB>) -> Result<(), Error> {
    let mut conn = queue.inner().pool.acquire().await?;
    for table in [&queue.sql.quoted, &queue.sql.dead] {
        DB::execute(&mut conn, &Arc::from(format!("DROP TABLE IF EXISTS {table}")), &[]).await?;
    }
    Ok(())
}

pub(crate) async fn insert<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    messages: &[Message],
) -> Result<u64, Error> {
    let mut inserted = 0;
    for chunk in messages.chunks(INSERT_CHUNK) {
        let sql = Arc::from(queue.sql.insert(chunk.len()));
        let delays: Vec<i64> = chunk.iter().map(|m| micros(m.delay)).collect();
        let mut args = Vec::with_capacity(chunk.len() * 3);
        for (m, delay) in chunk.iter().zip(&delays) {
            args.extend([Arg::Text(&m.group), Arg::Bytes(&m.payload), Arg::Int(*delay)]);
        }
        inserted += DB::execute(conn, &sql, &args).await.map_err(|e| queue_error(queue, e))?;
    }
    super::Counters::add(&queue.inner().counters.published, inserted);
    Ok(inserted)
}

/// With `listen_notify`, tells other processes: `pg_notify(table, group)` outside a
/// transaction on PostgreSQL (inside one, [`pg_notify_in_tx`] does it at commit); a
/// notify-table row elsewhere, inside the transaction when there is one. A failure is
/// logged: the poll interval still reaches the rows.
pub(crate) async fn notify_others<DB: Db>(queue: &Queue<DB>, conn: &mut DB::Connection, groups: &[String]) {
    let inner = queue.inner();
    if !inner.options.listen_notify {
        return;
    }
    let channel = queue.sql.table.channel();
    for group in groups {
        let sent = match &inner.notifier {
            None => {
                let sql: Arc<str> = Arc::from("SELECT pg_notify($1, $2)");
                DB::execute(conn, &sql, &[Arg::Text(channel), Arg::Text(group)])
                    .await
                    .map(drop)
                    .map_err(Error::from)
            }
            Some(notifier) => match notifier.table(DB::BACKEND).notify_sql(channel, group) {
                Ok(stmt) => {
                    DB::execute(conn, &stmt.sql, &args_of(&stmt)).await.map(drop).map_err(Error::from)
                }
                Err(e) => Err(e.into()),
            },
        };
        if let Err(error) = sent {
            warn!(%error, table = channel, group, "wake-up notification failed; subscriptions elsewhere wait for their poll interval");
        }
    }
}

/// `pg_notify` for each (table, group) of a transaction, in a savepoint so that a failure
/// cannot abort the transaction.
pub(crate) async fn pg_notify_in_tx<DB: Db>(
    tx: &mut Transaction<'static, DB>,
    pairs: &[(Arc<TableSql>, String)],
) {
    if pairs.is_empty() {
        return;
    }
    let result: Result<(), sqlx::Error> = async {
        DB::simple(tx, "SAVEPOINT rowbus_notify").await?;
        let notify = Arc::<str>::from("SELECT pg_notify($1, $2)");
        for (table, group) in pairs {
            if let Err(e) =
                DB::execute(tx, &notify, &[Arg::Text(table.table.channel()), Arg::Text(group)]).await
            {
                DB::simple(tx, "ROLLBACK TO SAVEPOINT rowbus_notify").await?;
                return Err(e);
            }
        }
        DB::simple(tx, "RELEASE SAVEPOINT rowbus_notify").await
    }
    .await;
    if let Err(error) = result {
        warn!(%error, "wake-up notification failed; subscriptions elsewhere wait for their poll interval");
    }
}

/// Most acknowledgements one statement carries.
pub(crate) const ACK_BATCH: usize = 256;

/// How a lease claim begins on PostgreSQL, in one round trip.
///
/// Sorts off: see [`begin_locked_claim`] (without statistics the planner would sort a scan
/// of the whole table rather than read the claim index in order).
///
/// Asynchronous commit: the claim returns without waiting for its WAL to reach the disk.
/// A claim lost in a crash only leaves its rows unleased, to be claimed again, which
/// at-least-once delivery allows; and an acknowledgement, whose commit is synchronous,
/// flushes the WAL before it, the claim's included, so no acknowledged claim is lost.
/// (Claims on PostgreSQL carry no acknowledgements, see `runner::pending_acks`, so no
/// acknowledgement commits asynchronously.)
/// Measured against the autocommit claim, interleaved: 8 workers 10,200-10,500 to
/// 11,500-11,700 messages/s; 100-row batches 36,000-37,000 to 44,000-48,000.
const LEASE_CLAIM_BEGIN: &str = "BEGIN; SET LOCAL enable_sort = off; SET LOCAL synchronous_commit = off";

/// What a claim brought back.
pub(crate) struct Claim {
    pub rows: Vec<ClaimedRow>,
    pub token: i64,
}

/// Claims up to `limit` ready messages of `group` under a new lease, first acknowledging
/// the `(id, token)` pairs of `acks` in the same transaction: one commit for both. Retries
/// deadlocks; on an error nothing was acknowledged.
pub(crate) async fn claim<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    limit: usize,
    lease: Duration,
    acks: &[(i64, i64)],
) -> Result<Claim, Error> {
    let inner = queue.inner();
    let token = inner.token();
    let (lease, limit) = (micros(lease), i64::try_from(limit).unwrap_or(i64::MAX));
    let mut tries = 0;
    loop {
        tries += 1;
        let result = if acks.is_empty() && DB::BACKEND == Backend::Sqlite {
            // One statement, its own transaction.
            let mut conn = inner.pool.acquire().await?;
            claim_on(queue, &mut conn, group, limit, lease, token).await.map(|rows| (rows, 0))
        } else {
            async {
                let mut tx = match DB::BACKEND {
                    Backend::Postgres => inner.pool.begin_with(LEASE_CLAIM_BEGIN).await?,
                    _ => begin_sqlx(&inner.pool).await?,
                };
                let acked = ack_in(queue, &mut tx, acks).await?;
                let rows = claim_on(queue, &mut tx, group, limit, lease, token).await?;
                tx.commit().await?;
                Ok((rows, acked))
            }
            .await
        };
        match result {
            Ok((mut rows, acked)) => {
                counted_acks(queue, acks.len(), acked);
                rows.sort_unstable_by_key(|r| r.id);
                return Ok(Claim { rows, token });
            }
            Err(e) if is_retryable(&e) && tries < DEADLOCK_TRIES => continue,
            Err(e) => return Err(queue_error(queue, e)),
        }
    }
}

/// Acknowledges `acks` on `conn`, [`ACK_BATCH`] a statement; how many were still leased.
async fn ack_in<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    acks: &[(i64, i64)],
) -> Result<u64, sqlx::Error> {
    let mut acked = 0;
    for chunk in acks.chunks(ACK_BATCH) {
        let sql = Arc::from(queue.sql.ack_pairs(chunk.len()));
        let ids = chunk.iter().map(|&(id, _)| Arg::Int(id));
        let pairs = chunk.iter().flat_map(|&(id, token)| [Arg::Int(id), Arg::Int(token)]);
        let args: Vec<Arg<'_>> = ids.chain(pairs).collect();
        acked += DB::execute(conn, &sql, &args).await?;
    }
    Ok(acked)
}

/// Counts `acked` of `sent` acknowledgements as done and the rest as lost leases.
fn counted_acks<DB: Db>(queue: &Queue<DB>, sent: usize, acked: u64) {
    let counters = &queue.inner().counters;
    super::Counters::add(&counters.acked, acked);
    super::Counters::add(&counters.leases_lost, (sent as u64).saturating_sub(acked));
}

/// The claim on `conn`: one `UPDATE ... RETURNING` on PostgreSQL and SQLite; on MySQL,
/// which has none, `SELECT ... FOR UPDATE SKIP LOCKED` then a mark of the rows, in the
/// caller's transaction.
async fn claim_on<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    group: &str,
    limit: i64,
    lease: i64,
    token: i64,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    match DB::BACKEND {
        Backend::Postgres => {
            let args = [Arg::Text(group), Arg::Int(limit), Arg::Int(lease), Arg::Int(token)];
            return DB::fetch_claimed(conn, &queue.sql.claim, &args).await;
        }
        Backend::Sqlite => {
            let args = [Arg::Int(lease), Arg::Int(token), Arg::Text(group), Arg::Int(limit)];
            return DB::fetch_claimed(conn, &queue.sql.claim, &args).await;
        }
        Backend::MySql => {}
    }
    let sql = &queue.sql;
    let mut rows = DB::fetch_claimed(conn, &sql.claim_select, &[Arg::Text(group), Arg::Int(limit)]).await?;
    if !rows.is_empty() {
        let mark = Arc::from(sql.claim_mark(rows.len()));
        let mut args = vec![Arg::Int(lease), Arg::Int(token)];
        args.extend(rows.iter().map(|r| Arg::Int(r.id)));
        DB::execute(conn, &mark, &args).await?;
        // The rows were read before the mark counted this attempt.
        for row in &mut rows {
            row.attempts += 1;
        }
    }
    Ok(rows)
}

/// Runs a statement that must change exactly the leased row; refuses with
/// [`Error::LeaseLost`] when it changed nothing. Retries deadlocks.
async fn on_lease<DB: Db>(queue: &Queue<DB>, sql: &Arc<str>, args: &[Arg<'_>], id: i64) -> Result<(), Error> {
    if execute_retrying(queue, sql, args).await? == 0 {
        super::Counters::add(&queue.inner().counters.leases_lost, 1);
        return Err(Error::LeaseLost { table: queue.sql.table.to_string(), id });
    }
    Ok(())
}

/// Runs a statement on a pool connection, again when it deadlocked; the rows it changed.
async fn execute_retrying<DB: Db>(queue: &Queue<DB>, sql: &Arc<str>, args: &[Arg<'_>]) -> Result<u64, Error> {
    let mut tries = 0;
    loop {
        tries += 1;
        let mut conn = queue.inner().pool.acquire().await?;
        match DB::execute(&mut conn, sql, args).await {
            Ok(n) => return Ok(n),
            Err(e) if is_retryable(&e) && tries < DEADLOCK_TRIES => continue,
            Err(e) => return Err(queue_error(queue, e)),
        }
    }
}

/// Deletes a leased message: acknowledged, or `dropped` by its handler.
pub(crate) async fn ack<DB: Db>(queue: &Queue<DB>, id: i64, token: i64, dropped: bool) -> Result<(), Error> {
    on_lease(queue, &queue.sql.ack, &[Arg::Int(id), Arg::Int(token)], id).await?;
    let counters = &queue.inner().counters;
    super::Counters::add(if dropped { &counters.dropped } else { &counters.acked }, 1);
    Ok(())
}

/// Deletes the messages `ids` of one claim that their handler dropped, in one statement;
/// returns how many were still leased (the rest had lost their lease and were left alone).
pub(crate) async fn drop_many<DB: Db>(queue: &Queue<DB>, token: i64, ids: &[i64]) -> Result<u64, Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let sql = Arc::from(queue.sql.ack_many(ids.len()));
    let mut args = vec![Arg::Int(token)];
    args.extend(ids.iter().map(|&id| Arg::Int(id)));
    let done = execute_retrying(queue, &sql, &args).await?;
    let counters = &queue.inner().counters;
    super::Counters::add(&counters.dropped, done);
    super::Counters::add(&counters.leases_lost, ids.len() as u64 - done);
    Ok(done)
}

/// Acknowledges `(id, token)` pairs of any claims, [`ACK_BATCH`] a statement; counts what
/// was still leased as acknowledged and the rest as lost leases.
pub(crate) async fn ack_pairs<DB: Db>(queue: &Queue<DB>, pairs: &[(i64, i64)]) -> Result<u64, Error> {
    if pairs.is_empty() {
        return Ok(0);
    }
    let mut tries = 0;
    loop {
        tries += 1;
        let mut conn = queue.inner().pool.acquire().await?;
        match ack_in(queue, &mut conn, pairs).await {
            Ok(acked) => {
                counted_acks(queue, pairs.len(), acked);
                return Ok(acked);
            }
            Err(e) if is_retryable(&e) && tries < DEADLOCK_TRIES => continue,
            Err(e) => return Err(queue_error(queue, e)),
        }
    }
}

pub(crate) async fn retry<DB: Db>(
    queue: &Queue<DB>,
    id: i64,
    token: i64,
    after: Duration,
    error: &str,
) -> Result<(), Error> {
    let args = [Arg::Int(micros(after)), Arg::Text(error), Arg::Int(id), Arg::Int(token)];
    on_lease(queue, &queue.sql.retry, &args, id).await?;
    super::Counters::add(&queue.inner().counters.retried, 1);
    Ok(())
}

pub(crate) async fn release<DB: Db>(queue: &Queue<DB>, id: i64, token: i64) -> Result<(), Error> {
    on_lease(queue, &queue.sql.release, &[Arg::Int(id), Arg::Int(token)], id).await?;
    super::Counters::add(&queue.inner().counters.released, 1);
    Ok(())
}

pub(crate) async fn extend<DB: Db>(
    queue: &Queue<DB>,
    id: i64,
    token: i64,
    lease: Duration,
) -> Result<(), Error> {
    on_lease(queue, &queue.sql.extend, &[Arg::Int(micros(lease)), Arg::Int(id), Arg::Int(token)], id).await
}

/// Moves a leased message to the dead-letter table with `error`, in one transaction.
pub(crate) async fn dead_letter<DB: Db>(
    queue: &Queue<DB>,
    id: i64,
    token: i64,
    error: &str,
) -> Result<(), Error> {
    let sql = &queue.sql;
    let mut tx = begin(&queue.inner().pool).await?;
    let copied =
        DB::execute(&mut tx, &sql.dead_insert, &[Arg::Text(error), Arg::Int(id), Arg::Int(token)]).await?;
    let deleted = DB::execute(&mut tx, &sql.ack, &[Arg::Int(id), Arg::Int(token)]).await?;
    if copied != 1 || deleted != 1 {
        tx.rollback().await?;
        super::Counters::add(&queue.inner().counters.leases_lost, 1);
        return Err(Error::LeaseLost { table: sql.table.to_string(), id });
    }
    tx.commit().await?;
    super::Counters::add(&queue.inner().counters.dead_lettered, 1);
    Ok(())
}

/// Up to `limit` ready messages of `group`, taken in a new transaction for a transactional
/// handler: locked and deleted, so that committing the transaction acknowledges them.
/// A deadlock (MySQL's locking read and deletion can meet another claim's) is tried again.
pub(crate) async fn claim_locked<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    limit: usize,
) -> Result<(Transaction<'static, DB>, Vec<ClaimedRow>), Error> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut tries = 0;
    loop {
        tries += 1;
        let mut tx = begin_locked_claim(&queue.inner().pool).await?;
        match take_locked(queue, &mut tx, group, limit).await {
            Ok(rows) => return Ok((tx, rows)),
            Err(e) if is_retryable(&e) && tries < DEADLOCK_TRIES => continue,
            Err(e) => return Err(queue_error(queue, e)),
        }
    }
}

async fn take_locked<DB: Db>(
    queue: &Queue<DB>,
    tx: &mut Transaction<'static, DB>,
    group: &str,
    limit: i64,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let rows = DB::fetch_claimed(tx, &queue.sql.claim_locked, &[Arg::Text(group), Arg::Int(limit)]).await?;
    if DB::BACKEND == Backend::MySql {
        for chunk in rows.chunks(ACK_BATCH) {
            let sql = Arc::from(queue.sql.delete_locked(chunk.len()));
            let args: Vec<Arg<'_>> = chunk.iter().map(|row| Arg::Int(row.id)).collect();
            DB::execute(tx, &sql, &args).await?;
        }
    }
    Ok(rows)
}

/// Savepoint statements around a transactional handler: its writes can be undone while
/// the claim's row lock is kept, so that the failure is recorded before anyone else can
/// claim the message again.
pub(crate) async fn savepoint<DB: Db>(
    tx: &mut Transaction<'static, DB>,
    statement: &'static str,
) -> Result<(), Error> {
    DB::simple(tx, statement).await?;
    Ok(())
}

/// The transaction of a transactional handler's claim.
///
/// On PostgreSQL its claim runs with sorts disabled, in the same round trip as `BEGIN`:
/// a queue table that has not been analyzed since it filled (a new table with a backlog,
/// or one last analyzed while empty) has no statistics, and the planner, guessing a few
/// dozen ready rows, sorts a bitmap scan of the whole table instead of reading the claim
/// index in order (measured: 150-230 ms a claim over 100,000 rows, against 0.2 ms).
/// [`handler_savepoint`] resets the setting (to the server's default) before the
/// handler's own statements.
async fn begin_locked_claim<DB: Db>(pool: &Pool<DB>) -> Result<Transaction<'static, DB>, Error> {
    Ok(match DB::BACKEND {
        Backend::Postgres => pool.begin_with("BEGIN; SET LOCAL enable_sort = off").await?,
        _ => begin_sqlx(pool).await?,
    })
}

/// After a transactional claim, before its handler: the savepoint that undoes the handler's
/// writes alone, and on PostgreSQL the reset of the planner setting [`begin_locked_claim`]
/// changed.
pub(crate) fn handler_savepoint<DB: Db>() -> &'static str {
    match DB::BACKEND {
        Backend::Postgres => "RESET enable_sort; SAVEPOINT rowbus_handler",
        _ => "SAVEPOINT rowbus_handler",
    }
}

/// In the claim's transaction, after its handler's writes were undone: puts the claimed
/// `rows` back with their attempt counted, to run again after `after` (or the policy's
/// backoff), or dead-letters those that have used their attempts. The caller commits.
/// Returns how many were dead-lettered.
pub(crate) async fn restore_failed<DB: Db>(
    queue: &Queue<DB>,
    tx: &mut Transaction<'static, DB>,
    rows: &[ClaimedRow],
    error: &str,
    after: Option<Duration>,
) -> Result<u64, Error> {
    let inner = queue.inner();
    // Each row with the delay before its next attempt, or none when it is done for.
    let (dead, back): (Vec<_>, Vec<_>) = rows
        .iter()
        .map(|row| {
            let attempts = u32::try_from(row.attempts + 1).unwrap_or(u32::MAX);
            let exhausted = after.is_none() && inner.options.retry.exhausted(attempts);
            let delay = after.unwrap_or_else(|| inner.options.retry.delay(attempts));
            (row, (!exhausted).then(|| micros(delay)))
        })
        .partition(|(_, delay)| delay.is_none());
    for rows in [&dead, &back] {
        for chunk in rows.chunks(RESTORE_BATCH) {
            // A chunk is all dead or all back (and never empty).
            let sql = match chunk[0].1 {
                None => queue.sql.dead_restore(chunk.len()),
                Some(_) => queue.sql.restore(chunk.len()),
            };
            let sql = Arc::from(sql);
            let args: Vec<Arg<'_>> =
                chunk.iter().flat_map(|&(row, delay)| restore_args(row, delay, error)).collect();
            DB::execute(tx, &sql, &args).await?;
        }
    }
    Ok(dead.len() as u64)
}

/// The binds of a row [`restore_failed`] writes, in the order of both of its statements:
/// the delay only where the row goes back to the queue.
fn restore_args<'a>(row: &'a ClaimedRow, delay: Option<i64>, error: &'a str) -> Vec<Arg<'a>> {
    let mut args = vec![Arg::Int(row.id), Arg::Text(&row.group), Arg::Bytes(&row.payload)];
    args.push(Arg::Int(row.attempts + 1));
    args.extend(delay.map(Arg::Int));
    args.extend([Arg::Int(row.created_at), Arg::Text(error)]);
    args
}

pub(crate) async fn depth<DB: Db>(queue: &Queue<DB>, group: &str) -> Result<(i64, i64), Error> {
    let p = if DB::BACKEND == Backend::Postgres { "$1" } else { "?" };
    let mut conn = queue.inner().pool.acquire().await?;
    let count =
        |table: &str| Arc::<str>::from(format!("SELECT COUNT(*) FROM {table} WHERE group_name = {p}"));
    let waiting = DB::fetch_ints(&mut conn, &count(&queue.sql.quoted), &[Arg::Text(group)]).await?;
    let dead = DB::fetch_ints(&mut conn, &count(&queue.sql.dead), &[Arg::Text(group)]).await?;
    Ok((waiting.first().copied().unwrap_or(0), dead.first().copied().unwrap_or(0)))
}
