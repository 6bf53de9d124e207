//! Kept history: a queue deployed with a keep duration moves each handled message into its
//! history table (`<table>_hist`) in the transaction that deletes it; the brokers that
//! consume the queue delete what is older than the keep duration, in bounded batches, on
//! a cadence. The keep duration lives in the database (`<table>_keep`), so every process
//! consuming the queue follows the last deploy's: a subscription reads it when it starts,
//! and the cleanup reads it again on each pass.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use notify_table::{DurationRange, Statement, Value};
use tracing::{Instrument as _, debug, info_span, warn};

use crate::broker::exec::{micros, queue_error, retrying};
pub(crate) use crate::broker::operate::keeping::Keeping;
use crate::broker::{Broker, Inner, Queue, check_group};
use crate::deploy::DeployOptions;
use crate::driver::{Arg, ClaimedRow, HistoryRow};
use crate::error::{Error, check_duration};
use crate::sql::{Db, begin};
use crate::sql::{Moved, TableSql};

/// How often a broker consuming a queue deletes its expired history (and reads its keep
/// setting again); the first pass runs when its first subscription of the queue starts.
pub const HISTORY_CLEANUP_INTERVAL: Duration = Duration::from_secs(60);

/// Most history rows one cleanup statement deletes: a batch holds its locks briefly, and
/// a full batch is followed by the next at once.
pub const HISTORY_CLEANUP_BATCH: u32 = 1000;

/// Rows of a transactional claim one history statement writes (6 binds each).
const RECORD_BATCH: usize = 256;

/// How a kept message was settled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HistoryOutcome {
    /// Its handler succeeded (for a transactional handler: its transaction committed).
    Acknowledged,
    /// Its handler dropped it ([`Outcome::Drop`](crate::broker::Outcome::Drop)).
    Dropped,
    /// It went to the dead-letter table.
    DeadLettered,
    /// It was cancelled ([`Queue::cancel`]).
    Cancelled,
    /// An outcome this rowbus does not know, as stored (written by a newer one).
    Other(String),
}

impl HistoryOutcome {
    fn from_stored(text: String) -> Self {
        match text.as_str() {
            "acked" => HistoryOutcome::Acknowledged,
            "dropped" => HistoryOutcome::Dropped,
            "dead" => HistoryOutcome::DeadLettered,
            "cancelled" => HistoryOutcome::Cancelled,
            _ => HistoryOutcome::Other(text),
        }
    }

    /// The outcome as the history table stores it: `acked`, `dropped`, `dead`, `cancelled`.
    pub fn as_str(&self) -> &str {
        match self {
            HistoryOutcome::Acknowledged => Moved::Acked.as_sql(),
            HistoryOutcome::Dropped => Moved::Dropped.as_sql(),
            HistoryOutcome::DeadLettered => Moved::Dead.as_sql(),
            HistoryOutcome::Cancelled => Moved::Cancelled.as_sql(),
            HistoryOutcome::Other(text) => text,
        }
    }
}

/// A handled message as the queue's history table (`<table>_hist`) keeps it: its payload,
/// outcome and times (not its priority, ordering key or headers).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HistoryEntry {
    /// Its id in the queue.
    pub id: i64,
    /// Its group.
    pub group: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The attempts it took, the last one included.
    pub attempts: i64,
    /// How it was settled.
    pub outcome: HistoryOutcome,
    /// Its last error: why it was dead-lettered, or an earlier attempt's failure (none for
    /// a transactional handler's message, whose claim does not read it).
    pub last_error: Option<String>,
    /// When it was published.
    pub published_at: SystemTime,
    /// When it was settled.
    pub handled_at: SystemTime,
}

/// An empty entry (id 0, acknowledged, published and handled at the Unix epoch): with
/// its fields set one by one, what a test of code that shows history starts from (the
/// struct may grow, so it is not built field by field outside rowbus).
impl Default for HistoryEntry {
    fn default() -> Self {
        HistoryEntry {
            id: 0,
            group: String::new(),
            payload: Vec::new(),
            attempts: 0,
            outcome: HistoryOutcome::Acknowledged,
            last_error: None,
            published_at: SystemTime::UNIX_EPOCH,
            handled_at: SystemTime::UNIX_EPOCH,
        }
    }
}

impl HistoryEntry {
    fn from_row(row: HistoryRow) -> Self {
        let at = |us: i64| SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0));
        HistoryEntry {
            id: row.row.id,
            group: row.row.group,
            payload: row.row.payload,
            attempts: row.row.attempts,
            outcome: HistoryOutcome::from_stored(row.outcome),
            last_error: row.row.last_error,
            published_at: at(row.row.created_at),
            handled_at: at(row.row.failed_at),
        }
    }
}

/// Which page of a queue's history [`Queue::history`] returns: newest first (the latest
/// handled first), `limit` of them after skipping `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryPage {
    /// Only this group's; every group's when `None`.
    pub group: Option<String>,
    /// The most to return (100 by default).
    pub limit: u32,
    /// How many newer ones to skip: the previous pages' rows.
    pub offset: u64,
}

impl Default for HistoryPage {
    fn default() -> Self {
        HistoryPage { group: None, limit: 100, offset: 0 }
    }
}

/// What a cleanup of a queue's history did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// Rows deleted.
    pub rows: u64,
    /// Statements run: one per batch, the last one not full.
    pub batches: u64,
}

/// The statements that set `queue`'s keep duration to `keep`, run after its tables'
/// in the deploy's transaction ([`Queue::deploy_with`]).
pub(crate) fn keep_statements<DB: Db>(queue: &Queue<DB>, keep: Duration) -> Result<Vec<Statement>, Error> {
    check_duration("keep", keep, DurationRange::Span)?;
    let history = &queue.sql.history;
    Ok(vec![
        Statement { sql: Arc::from(history.clear_keep.to_string().as_str()), binds: Vec::new() },
        Statement { sql: history.insert_keep.clone(), binds: vec![Value::Int(micros(keep))] },
    ])
}

impl<DB: Db> Queue<DB> {
    /// Deploys the queue as [`deploy`](Self::deploy) does and sets how long it keeps
    /// handled messages: from now on every process consuming it moves each acknowledged,
    /// dropped or dead-lettered message into its history table (`<table>_hist`, read with
    /// [`history`](Self::history)) instead of only deleting it, and deletes history older
    /// than `keep`. `Duration::ZERO` turns keeping off (and the cleanup then deletes what
    /// was kept). [`deploy`](Self::deploy) alone leaves the setting as it is.
    ///
    /// Other processes' subscriptions follow the new setting at their next cleanup pass
    /// (every [`HISTORY_CLEANUP_INTERVAL`]); this broker's at once.
    ///
    /// ```no_run
    /// # async fn f(queue: rowbus::Queue<sqlx::Postgres>) -> Result<(), rowbus::Error> {
    /// use std::time::Duration;
    /// queue.deploy_keeping(Duration::from_secs(7 * 24 * 3600)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn deploy_keeping(&self, keep: Duration) -> Result<(), Error> {
        self.deploy_with(&DeployOptions::default().keep(keep)).await
    }

    /// How long the queue keeps handled messages; `None` when it keeps none.
    pub async fn keep(&self) -> Result<Option<Duration>, Error> {
        Ok(read_keep(self)
            .await?
            .filter(|&us| us > 0)
            .map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))))
    }

    /// A page of the queue's kept history, newest first.
    pub async fn history(&self, page: &HistoryPage) -> Result<Vec<HistoryEntry>, Error> {
        if let Some(group) = &page.group {
            check_group(group)?;
        }
        let sql: Arc<str> = Arc::from(self.sql.history.list(page.group.is_some()));
        let mut args: Vec<Arg<'_>> = page.group.as_deref().map(Arg::Text).into_iter().collect();
        args.push(Arg::Int(i64::from(page.limit)));
        args.push(Arg::Int(i64::try_from(page.offset).unwrap_or(i64::MAX)));
        let (pool, sql, args) = (&self.inner().pool, &sql, &args);
        let rows =
            retrying(self, || async move { DB::fetch_history(&mut *pool.acquire().await?, sql, args).await })
                .await?;
        Ok(rows.into_iter().map(HistoryEntry::from_row).collect())
    }

    /// Deletes the history older than the queue's keep duration (all of it once keeping
    /// was turned off), `batch` rows a statement, oldest first, until a statement deletes
    /// less than a whole batch. The brokers consuming the queue run this (with
    /// [`HISTORY_CLEANUP_BATCH`]) every [`HISTORY_CLEANUP_INTERVAL`].
    pub async fn prune_history(&self, batch: u32) -> Result<Pruned, Error> {
        let keep = read_keep(self).await?;
        match keep {
            Some(keep_us) => prune(self, keep_us, batch.max(1)).await,
            None => Ok(Pruned::default()),
        }
    }

    /// Whether this broker moves the queue's handled messages into its history.
    pub(crate) fn keeps(&self) -> bool {
        self.keeping.on()
    }
}

/// The stored keep setting in µs: `None` when it was never set.
/// Tries of [`read_keep`] after a lost connection.
const LOST_TRIES: u32 = 20;

/// The queue's keep setting. This is a subscription's first statement, and a pooled
/// connection used within the last second goes out untested
/// ([`UNTESTED_IDLE`](crate::backend::UNTESTED_IDLE)): after a server restart it may be
/// one the server dropped, and a subscription would fail to start where a claim would just
/// have been tried again. A read, so it is tried again after a lost connection, on
/// connections pinged first (a dead one is closed rather than handed out again), 50 ms
/// apart, up to [`LOST_TRIES`] times.
async fn read_keep<DB: Db>(queue: &Queue<DB>) -> Result<Option<i64>, Error> {
    let (pool, sql) = (&queue.inner().pool, &queue.sql.history.read_keep);
    let mut lost = 0;
    let rows = loop {
        let tested = lost > 0;
        let read = retrying(queue, || async move {
            let mut conn = pool.acquire().await?;
            if tested && let Err(error) = sqlx::Connection::ping(&mut *conn).await {
                conn.close_on_drop();
                return Err(error);
            }
            DB::fetch_rows(&mut *conn, sql, &[], 0).await
        })
        .await;
        match read {
            Err(error) if error.is_connection_error() && lost + 1 < LOST_TRIES => {
                lost += 1;
                debug!(%error, "reading the keep setting lost its connection; trying again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other?,
        }
    };
    Ok(rows.first().map(|row| row.int(0)))
}

async fn prune<DB: Db>(queue: &Queue<DB>, keep_us: i64, batch: u32) -> Result<Pruned, Error> {
    let (pool, sql) = (&queue.inner().pool, &queue.sql.history.prune);
    let args = [Arg::Int(-keep_us.max(0)), Arg::Int(i64::from(batch))];
    let args = &args;
    let mut pruned = Pruned::default();
    loop {
        let rows =
            retrying(queue, || async move { DB::execute(&mut *pool.acquire().await?, sql, args).await })
                .await?;
        pruned.rows += rows;
        pruned.batches += 1;
        if rows < u64::from(batch) {
            return Ok(pruned);
        }
    }
}

/// Reads the queue's keep setting for this broker: a subscription does before its first
/// claim. A queue without its keep table (deployed before kept history) or without its
/// table (its claims say so) keeps nothing; another failure (a missing grant) is the
/// subscription's.
pub(crate) async fn load<DB: Db>(queue: &Queue<DB>) -> Result<(), Error> {
    match read_keep(queue).await {
        Ok(keep) => queue.keeping.set(keep.unwrap_or(0)),
        Err(Error::MissingHistoryTable { .. } | Error::MissingQueueTable { .. }) => queue.keeping.set(0),
        Err(error) => return Err(error),
    }
    Ok(())
}

/// Starts this broker's cleanup of the queue's history, unless it runs already: a pass now
/// and every [`HISTORY_CLEANUP_INTERVAL`], until the broker shuts down or is dropped.
pub(crate) fn start_cleanup<DB: Db>(queue: &Queue<DB>) {
    if queue.keeping.cleaning.swap(true, Ordering::AcqRel) {
        return;
    }
    let inner: Weak<Inner<DB>> = Arc::downgrade(queue.inner());
    let (sql, keeping): (Arc<TableSql<DB>>, Arc<Keeping>) = (queue.sql.clone(), queue.keeping.clone());
    let publishing = queue.publishing.clone();
    let mut shutdown = queue.inner().shutdown.subscribe();
    let span = info_span!("rowbus.history", table = %queue.table());
    tokio::spawn(
        async move {
            loop {
                // A queue handle for this pass only: the task must not keep the broker alive.
                let Some(inner) = inner.upgrade() else { return };
                let queue = Queue {
                    broker: Broker { inner },
                    sql: sql.clone(),
                    keeping: keeping.clone(),
                    publishing: publishing.clone(),
                };
                let rows = match clean(&queue).await {
                    Ok(pruned) => {
                        if pruned.rows > 0 {
                            debug!(rows = pruned.rows, "expired history deleted");
                        }
                        pruned.rows
                    }
                    Err(error) => {
                        warn!(%error, "history cleanup failed; the next pass tries again");
                        0
                    }
                };
                queue.inner().counters.history_cleaned(rows);
                drop(queue);
                tokio::select! {
                    _ = shutdown.wait_for(|stop| *stop) => return,
                    _ = tokio::time::sleep(HISTORY_CLEANUP_INTERVAL) => {}
                }
            }
        }
        .instrument(span),
    );
}

/// One cleanup pass: the keep setting read again, then the expired rows deleted.
async fn clean<DB: Db>(queue: &Queue<DB>) -> Result<Pruned, Error> {
    let keep = match read_keep(queue).await {
        Err(Error::MissingHistoryTable { .. } | Error::MissingQueueTable { .. }) => None,
        read => read?,
    };
    let Some(keep_us) = keep else {
        queue.keeping.set(0);
        return Ok(Pruned::default());
    };
    queue.keeping.set(keep_us);
    prune(queue, keep_us, HISTORY_CLEANUP_BATCH).await
}

/// Runs a move's `statements` (see [`HistorySql`](crate::sql::HistorySql)) on `conn`, all
/// with `args`: the rows the last one changed, which is the rows moved.
pub(crate) async fn move_in<DB: Db>(
    conn: &mut DB::Connection,
    statements: &[Arc<str>],
    args: &[Arg<'_>],
) -> Result<u64, sqlx::Error> {
    let mut moved = 0;
    for statement in statements {
        moved = DB::execute(conn, statement, args).await?;
    }
    Ok(moved)
}

/// Runs a move on a pool connection, in a transaction of its own when it is more than one
/// statement, again when it deadlocked: the rows moved.
pub(crate) async fn moved<DB: Db>(
    queue: &Queue<DB>,
    statements: &[Arc<str>],
    args: &[Arg<'_>],
) -> Result<u64, Error> {
    let pool = &queue.inner().pool;
    retrying(queue, || async move {
        if let [one] = statements {
            return DB::execute(&mut *pool.acquire().await?, one, args).await;
        }
        let mut tx = begin(pool, DB::WRITE_BEGIN).await?;
        let moved = move_in::<DB>(&mut tx, statements, args).await?;
        tx.commit().await?;
        Ok(moved)
    })
    .await
}

/// Statements as the driver takes them.
pub(crate) fn arcs(statements: Vec<String>) -> Vec<Arc<str>> {
    statements.into_iter().map(Arc::from).collect()
}

/// In a transactional claim's transaction: writes `rows` (the claim took them, this
/// attempt not yet counted) into the history as `outcome`, with `error` when dead: as one
/// JSON text where the database takes that, otherwise [`RECORD_BATCH`] rows of binds a
/// statement.
pub(crate) async fn record<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    rows: &[ClaimedRow],
    outcome: Moved,
    error: Option<&str>,
) -> Result<(), Error> {
    let small = rows.iter().map(|row| row.payload.len()).sum::<usize>() <= JSON_PAYLOAD_BYTES;
    if let (Some(sql), true) = (&queue.sql.history.insert_json, small) {
        let json = rows_json(rows, error);
        let args = [Arg::Text(&json), Arg::Text(outcome.as_sql())];
        DB::execute(conn, sql, &args).await.map_err(|e| queue_error(queue, e))?;
        return Ok(());
    }
    for chunk in rows.chunks(RECORD_BATCH) {
        let sql: Arc<str> = Arc::from(queue.sql.history.insert(chunk.len(), outcome, error.is_some()));
        let args: Vec<Arg<'_>> = chunk
            .iter()
            .flat_map(|row| {
                let mut args = vec![
                    Arg::Int(row.id),
                    Arg::Text(&row.group),
                    Arg::Bytes(&row.payload),
                    Arg::Int(row.attempts + 1),
                    Arg::Int(row.created_at),
                ];
                args.extend(error.map(Arg::Text));
                args
            })
            .collect();
        DB::execute(conn, &sql, &args).await.map_err(|e| queue_error(queue, e))?;
    }
    Ok(())
}

/// The most payload bytes written into the history as one JSON text (in hex, twice that):
/// larger ones go as binds, well within every limit.
const JSON_PAYLOAD_BYTES: usize = 16 << 20;

/// `rows` as [`Keeping::history_json_insert`](crate::sql::Keeping::history_json_insert)
/// takes them: their attempt counted, `error` on each.
fn rows_json(rows: &[ClaimedRow], error: Option<&str>) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let entries: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            let mut hex = String::with_capacity(row.payload.len() * 2);
            for byte in &row.payload {
                hex.push(char::from(HEX[usize::from(byte >> 4)]));
                hex.push(char::from(HEX[usize::from(byte & 0xf)]));
            }
            serde_json::json!({
                "i": row.id,
                "g": row.group,
                "p": hex,
                "a": row.attempts + 1,
                "c": row.created_at,
                "e": error,
            })
        })
        .collect();
    serde_json::Value::Array(entries).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_go_as_json_with_hex_payloads() {
        let row = ClaimedRow {
            id: 3,
            group: "g\"1".into(),
            payload: vec![0x00, 0xab, 0x7f],
            attempts: 1,
            created_at: 42,
            priority: 0,
            key: None,
            dedup_id: None,
            headers: None,
        };
        let json: serde_json::Value = serde_json::from_str(&rows_json(&[row], Some("boom"))).unwrap();
        assert_eq!(
            json,
            serde_json::json!([{"i": 3, "g": "g\"1", "p": "00ab7f", "a": 2, "c": 42, "e": "boom"}])
        );
        let none: serde_json::Value = serde_json::from_str(&rows_json(&[], None)).unwrap();
        assert_eq!(none, serde_json::json!([]));
    }
}
