//! Settling claimed messages: acknowledgements, retries, releases, lease extensions and
//! dead letters under a lease; and, for a transactional handler that failed, putting its
//! rows back in its own transaction.

use std::sync::Arc;
use std::time::Duration;

use notify_table::DurationRange;
use sqlx::Transaction;

use crate::broker::Queue;
use crate::broker::exec::{micros, retrying};
use crate::broker::operate::counts::{self, Counted};
use crate::broker::operate::history::{arcs, move_in, moved, record};
use crate::driver::{Arg, ClaimedRow};
use crate::error::{Error, check_duration};
use crate::sql::{ACK_BATCH, Db, Moved, TableSql, begin};

/// What [`Error::InvalidDuration`] names a retry's delay.
const RETRY_DELAY: &str = "retry delay";

/// A handler's [`Outcome::Retry`](crate::broker::Outcome::Retry): why the message runs again,
/// and after how long. A delay over [`MAX_DURATION`](crate::limits::MAX_DURATION) makes it the
/// attempt's failure, retried after the policy's backoff (`None`) with the refusal as
/// its reason, rather than a statement the database refuses or a message that never
/// comes back.
pub(crate) fn handler_retry(after: Duration) -> (String, Option<Duration>) {
    match check_duration(RETRY_DELAY, after, DurationRange::Span) {
        Ok(()) => ("retry requested by the handler".to_owned(), Some(after)),
        Err(refused) => (refused.to_string(), None),
    }
}

/// What [`Error::InvalidDuration`] names a snooze's delay.
const SNOOZE_DELAY: &str = "snooze delay";

/// A handler's [`Outcome::Snooze`](crate::broker::Outcome::Snooze): its delay, or, over
/// [`MAX_DURATION`](crate::limits::MAX_DURATION), the refusal that makes it the attempt's
/// failure (as [`handler_retry`] does).
pub(crate) fn handler_snooze(after: Duration) -> Result<Duration, String> {
    check_duration(SNOOZE_DELAY, after, DurationRange::Span).map(|()| after).map_err(|e| e.to_string())
}

/// Rows a statement puts back after a failed transactional handler (11 binds each, well
/// under every database's limit on binds).
const RESTORE_BATCH: usize = 256;

/// The statements an acknowledgement by claim may take where one of pairs would do.
const BY_CLAIM_STATEMENTS: usize = 4;

/// Acknowledges `acks` on `conn`, [`ACK_BATCH`] a statement; how many were still leased.
/// With `keeping`, moves them into the history instead (in `conn`'s transaction, which the
/// caller opens when a move is more than one statement).
///
/// By claim (`lease = ? AND id IN (...)`) when that takes at most [`BY_CLAIM_STATEMENTS`],
/// or no more than the same rows as `(id, lease)` pairs would: the databases find a
/// claim's rows cheaper than a list of pairs, enough to pay for a few more statements. Medians of three
/// interleaved runs of `rowbus bench broker --only drain8,batch100` (pairs always / by
/// claim when no more statements / by claim up to four): PostgreSQL drain8 46,506 /
/// 43,940 / 48,002 and batch100 29,086 / 37,793 / 46,170; MariaDB drain8 40,212 / 43,093 /
/// 52,134 and batch100 27,654 / 29,585 / 29,005; SQLite drain8 82,032 and batch100 45,160
/// with pairs, 106,578 and 46,396 by claim up to four. A relay to NATS at its defaults on
/// PostgreSQL went from 32,174 to 42,063 messages/s by claim.
pub(in crate::broker) async fn ack_in<DB: Db>(
    sql: &TableSql<DB>,
    conn: &mut DB::Connection,
    acks: &[(i64, i64)],
    keeping: bool,
) -> Result<u64, sqlx::Error> {
    let claims = by_claim(acks);
    let statements: usize = claims.iter().map(|(_, ids)| ids.len().div_ceil(ACK_BATCH)).sum();
    // Each statement's rows and binds, and whether it finds them by claim.
    let mut chunks: Vec<(usize, Vec<Arg<'_>>, bool)> = Vec::new();
    if statements <= acks.len().div_ceil(ACK_BATCH).max(BY_CLAIM_STATEMENTS) {
        for (token, ids) in &claims {
            chunks.extend(ids.chunks(ACK_BATCH).map(|chunk| (chunk.len(), claim_args(*token, chunk), true)));
        }
    } else {
        for chunk in acks.chunks(ACK_BATCH) {
            let ids = chunk.iter().map(|&(id, _)| Arg::Int(id));
            let pairs = chunk.iter().flat_map(|&(id, token)| [Arg::Int(id), Arg::Int(token)]);
            chunks.push((chunk.len(), ids.chain(pairs).collect(), false));
        }
    }
    let mut acked = 0;
    for (rows, args, by_claim) in chunks {
        acked += match (keeping, by_claim) {
            (true, true) => {
                move_in::<DB>(conn, &arcs(sql.history.of_claim(rows, Moved::Acked)), &args).await?
            }
            (true, false) => move_in::<DB>(conn, &arcs(sql.history.ack_pairs(rows)), &args).await?,
            (false, true) => DB::execute(conn, &Arc::from(sql.ack_many(rows)), &args).await?,
            (false, false) => DB::execute(conn, &Arc::from(sql.ack_pairs(rows)), &args).await?,
        };
    }
    Ok(acked)
}

/// The binds of a statement on rows of one claim: its token, then the ids.
fn claim_args(token: i64, ids: &[i64]) -> Vec<Arg<'static>> {
    std::iter::once(token).chain(ids.iter().copied()).map(Arg::Int).collect()
}

/// The ids of `(id, token)` pairs by the claim that took them (its token), claims in the
/// order met.
pub(in crate::broker) fn by_claim(pairs: &[(i64, i64)]) -> Vec<(i64, Vec<i64>)> {
    let mut claims: Vec<(i64, Vec<i64>)> = Vec::new();
    for &(id, token) in pairs {
        match claims.iter_mut().find(|(t, _)| *t == token) {
            Some((_, ids)) => ids.push(id),
            None => claims.push((token, vec![id])),
        }
    }
    claims
}

/// Runs a statement on a pool connection (again when it deadlocked); the rows it changed.
async fn execute<DB: Db>(queue: &Queue<DB>, sql: &Arc<str>, args: &[Arg<'_>]) -> Result<u64, Error> {
    let pool = &queue.inner().pool;
    retrying(queue, || async move { DB::execute(&mut *pool.acquire().await?, sql, args).await }).await
}

/// Runs a statement that must change exactly the leased row; refuses with
/// [`Error::LeaseLost`] when it changed nothing.
async fn on_lease<DB: Db>(queue: &Queue<DB>, sql: &Arc<str>, args: &[Arg<'_>], id: i64) -> Result<(), Error> {
    if execute(queue, sql, args).await? == 0 {
        return Err(lease_lost(queue, id));
    }
    Ok(())
}

fn lease_lost<DB: Db>(queue: &Queue<DB>, id: i64) -> Error {
    queue.inner().counters.leases_lost(1);
    count_lost(queue, 1);
    Error::LeaseLost { table: queue.table().to_string(), id }
}

/// Adds `n` settles refused for a lost lease to the queue's counts in the database, on a
/// task of its own: the refusal is reported to its caller at once, and a count that fails
/// is only logged.
fn count_lost<DB: Db>(queue: &Queue<DB>, n: u64) {
    if n > 0 {
        let queue = queue.clone();
        tokio::spawn(async move { counts::count(&queue, Counted::LeaseLost, n).await });
    }
}

/// After keyed messages `ids` were settled (committed): the dialect's cleanup of what it
/// keeps about their keys ([`Publishing::keyed_gone`](crate::sql::Publishing::keyed_gone)). A
/// failure is logged: the dialect catches up later.
pub(crate) async fn keys_gone<DB: Db>(queue: &Queue<DB>, ids: &[i64]) {
    if ids.is_empty() {
        return;
    }
    if let Err(error) = DB::keyed_gone(&queue.inner().pool, &queue.sql, ids).await {
        tracing::debug!(%error, table = %queue.table(), "cleaning up after keyed messages failed; a later cleanup does it");
    }
}

/// Deletes a leased message: acknowledged, or `dropped` by its handler.
pub(crate) async fn ack<DB: Db>(queue: &Queue<DB>, id: i64, token: i64, dropped: bool) -> Result<(), Error> {
    let args = [Arg::Int(id), Arg::Int(token)];
    if queue.keeps() {
        let history = &queue.sql.history;
        if moved(queue, if dropped { &history.drop } else { &history.ack }, &args).await? == 0 {
            return Err(lease_lost(queue, id));
        }
    } else {
        on_lease(queue, &queue.sql.ack, &args, id).await?;
    }
    let counters = &queue.inner().counters;
    if dropped {
        counters.dropped(1)
    } else {
        counters.acknowledged(1, 1)
    }
    Ok(())
}

/// Deletes the messages `ids` of one claim that their handler dropped, in one statement;
/// returns how many were still leased (the rest had lost their lease and were left alone).
pub(crate) async fn drop_many<DB: Db>(queue: &Queue<DB>, token: i64, ids: &[i64]) -> Result<u64, Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let args = claim_args(token, ids);
    let done = match queue.keeps() {
        true => moved(queue, &arcs(queue.sql.history.of_claim(ids.len(), Moved::Dropped)), &args).await?,
        false => execute(queue, &Arc::from(queue.sql.ack_many(ids.len())), &args).await?,
    };
    let counters = &queue.inner().counters;
    counters.dropped(done);
    counters.leases_lost(ids.len() as u64 - done);
    count_lost(queue, ids.len() as u64 - done);
    Ok(done)
}

/// Acknowledges `(id, token)` pairs of any claims ([`ack_in`]); counts what
/// was still leased as acknowledged and the rest as lost leases.
pub(crate) async fn ack_pairs<DB: Db>(queue: &Queue<DB>, pairs: &[(i64, i64)]) -> Result<u64, Error> {
    if pairs.is_empty() {
        return Ok(0);
    }
    let (pool, sql, keeping) = (&queue.inner().pool, &*queue.sql, queue.keeps());
    let acked = retrying(queue, || async move {
        if keeping && !sql.history.moves_in_one() {
            let mut tx = begin(pool, DB::WRITE_BEGIN).await?;
            let acked = ack_in(sql, &mut tx, pairs, true).await?;
            tx.commit().await?;
            return Ok(acked);
        }
        ack_in(sql, &mut *pool.acquire().await?, pairs, keeping).await
    })
    .await?;
    queue.inner().counters.acknowledged(pairs.len(), acked);
    count_lost(queue, (pairs.len() as u64).saturating_sub(acked));
    Ok(acked)
}

/// Schedules a leased message's next attempt after `after`, recording `error`; refuses an
/// `after` over [`MAX_DURATION`](crate::limits::MAX_DURATION) before any statement.
pub(crate) async fn retry<DB: Db>(
    queue: &Queue<DB>,
    id: i64,
    token: i64,
    after: Duration,
    error: &str,
) -> Result<(), Error> {
    check_duration(RETRY_DELAY, after, DurationRange::Span)?;
    let args = [Arg::Int(micros(after)), Arg::Text(error), Arg::Int(id), Arg::Int(token)];
    on_lease(queue, &queue.sql.retry, &args, id).await?;
    queue.inner().counters.retried(1);
    Ok(())
}

/// Puts a leased message back to run after `after`, its attempt not counted and its last
/// error left as it was; refuses an `after` over [`MAX_DURATION`](crate::limits::MAX_DURATION)
/// before any statement. The caller adds it to the queue's counts.
pub(crate) async fn snooze<DB: Db>(
    queue: &Queue<DB>,
    id: i64,
    token: i64,
    after: Duration,
) -> Result<(), Error> {
    check_duration(SNOOZE_DELAY, after, DurationRange::Span)?;
    on_lease(queue, &queue.sql.snooze, &[Arg::Int(micros(after)), Arg::Int(id), Arg::Int(token)], id).await?;
    queue.inner().counters.snoozed(1);
    Ok(())
}

/// Gives a leased message back unstarted, its attempt not counted.
pub(crate) async fn release<DB: Db>(queue: &Queue<DB>, id: i64, token: i64) -> Result<(), Error> {
    on_lease(queue, &queue.sql.release, &[Arg::Int(id), Arg::Int(token)], id).await?;
    queue.inner().counters.released(1);
    Ok(())
}

/// Gives back messages `ids` of one claim (lease `token`) unstarted, [`ACK_BATCH`] a
/// statement: claimable at once, their attempt not counted. How many were still leased
/// (the rest had lost their lease and were left alone).
///
/// [`ACK_BATCH`]: crate::sql::ACK_BATCH
pub(crate) async fn release_many<DB: Db>(queue: &Queue<DB>, token: i64, ids: &[i64]) -> Result<u64, Error> {
    let mut released = 0;
    for chunk in ids.chunks(ACK_BATCH) {
        let args = claim_args(token, chunk);
        released += execute(queue, &Arc::from(queue.sql.release_many(chunk.len())), &args).await?;
    }
    let counters = &queue.inner().counters;
    counters.released(released);
    counters.leases_lost(ids.len() as u64 - released);
    count_lost(queue, ids.len() as u64 - released);
    Ok(released)
}

/// Gives back a leased message whose handler was aborted, its attempt not counted.
pub(crate) async fn abandon<DB: Db>(queue: &Queue<DB>, id: i64, token: i64) -> Result<(), Error> {
    on_lease(queue, &queue.sql.release, &[Arg::Int(id), Arg::Int(token)], id).await?;
    queue.inner().counters.abandoned(1);
    Ok(())
}

/// Keeps a leased message `lease` more from now, while its lease still runs: one that ran
/// out is refused with [`Error::LeaseLost`] as a settle by a stale holder is. Refuses a
/// lease of zero or over [`MAX_DURATION`](crate::limits::MAX_DURATION) before any statement.
pub(crate) async fn extend<DB: Db>(
    queue: &Queue<DB>,
    id: i64,
    token: i64,
    lease: Duration,
) -> Result<(), Error> {
    check_duration("lease", lease, DurationRange::Positive)?;
    on_lease(queue, &queue.sql.extend, &[Arg::Int(micros(lease)), Arg::Int(id), Arg::Int(token)], id).await
}

/// Moves a leased message to the dead-letter table with `error`, in one transaction.
///
/// A move that fails (the dead-letter table missing or not one, or the history table
/// where the queue keeps it) is counted, logged at error level and refused with
/// [`Error::DeadLetterFailed`]: the message is given back to run again after `after`,
/// its attempt not counted, so that it comes back as often as a retry would and its
/// attempt does not grow past the last; a move that finds the lease lost changes nothing.
pub(crate) async fn dead_letter<DB: Db>(
    queue: &Queue<DB>,
    id: i64,
    token: i64,
    error: &str,
    after: Duration,
) -> Result<(), Error> {
    let (pool, sql, keeping) = (&queue.inner().pool, &*queue.sql, queue.keeps());
    let moved = async {
        let mut tx = begin(pool, DB::WRITE_BEGIN).await?;
        let args = [Arg::Text(error), Arg::Int(id), Arg::Int(token)];
        let mut copied = DB::execute(&mut tx, &sql.dead_insert, &args).await?;
        if keeping && copied == 1 {
            copied = DB::execute(&mut tx, &sql.history.dead, &args).await?;
        }
        let deleted = DB::execute(&mut tx, &sql.ack, &[Arg::Int(id), Arg::Int(token)]).await?;
        if copied == 1 && deleted == 1 {
            tx.commit().await?;
            Ok(true)
        } else {
            tx.rollback().await?;
            Ok::<_, sqlx::Error>(false)
        }
    }
    .await;
    match moved {
        Ok(true) => {
            queue.inner().counters.dead_lettered(1);
            Ok(())
        }
        Ok(false) => Err(lease_lost(queue, id)),
        Err(e) => Err(dead_letter_failed(queue, id, token, error, after, e).await),
    }
}

/// After the move of leased message `id` to the dead-letter table failed with `e`:
/// counts and logs it, gives the message back to run again after `after` (its attempt
/// not counted, `error` kept as its last), and returns the error that says so.
async fn dead_letter_failed<DB: Db>(
    queue: &Queue<DB>,
    id: i64,
    token: i64,
    error: &str,
    after: Duration,
    e: sqlx::Error,
) -> Error {
    queue.inner().counters.dead_letter_failed(1);
    let table = queue.table().to_string();
    let dead = format!("{table}_dead");
    let cause = Error::Database(e);
    tracing::error!(
        %table, id, error = %cause.one_line(), ?after,
        "dead-lettering a message failed; it stays in the queue and runs again after the delay"
    );
    let args = [Arg::Int(micros(after)), Arg::Text(error), Arg::Int(id), Arg::Int(token)];
    if let Err(back) = execute(queue, &queue.sql.release_later, &args).await {
        tracing::warn!(%table, id, error = %back.one_line(), "giving the message back failed; it comes back when its lease runs out");
    }
    Error::DeadLetterFailed { table, dead, id, after, source: Box::new(cause) }
}

/// In the claim's transaction, after its handler's writes were undone: puts the claimed
/// `rows` back with their attempt counted, to run again after `after` (or the policy's
/// backoff), or dead-letters those that have used their attempts. The caller commits and
/// then counts with [`Counters::failed_batch`](crate::broker::operate::stats::Counters::failed_batch).
/// Returns how many were dead-lettered.
pub(crate) async fn restore_failed<DB: Db>(
    queue: &Queue<DB>,
    tx: &mut Transaction<'static, DB>,
    rows: &[ClaimedRow],
    error: &str,
    after: Option<Duration>,
) -> Result<Restored, Error> {
    let retry = &queue.inner().options.retry;
    // Each row with the delay before its next attempt, or none when it is done for.
    let (dead, back): (Vec<_>, Vec<_>) = rows
        .iter()
        .map(|row| {
            let attempts = u32::try_from(row.attempts + 1).unwrap_or(u32::MAX);
            let exhausted = after.is_none() && retry.exhausted(attempts);
            let delay = after.unwrap_or_else(|| retry.delay(attempts));
            (row, (!exhausted).then(|| micros(delay)))
        })
        .partition(|(_, delay)| delay.is_none());
    for chunk in back.chunks(RESTORE_BATCH) {
        let args: Vec<Arg<'_>> = chunk
            .iter()
            .flat_map(|&(row, delay)| restore_args(row, row.attempts + 1, delay, Some(error)))
            .collect();
        DB::execute(tx, &Arc::from(queue.sql.restore(chunk.len())), &args).await?;
    }
    let dead: Vec<&ClaimedRow> = dead.into_iter().map(|(row, _)| row).collect();
    move_dead(queue, tx, &dead, error).await
}

/// In the claim's transaction: moves the claimed `dead` rows to the dead letters with
/// `error` as their last error, this attempt counted; those whose move fails go back to
/// the queue after the policy's backoff instead (see [`Restored::dead_failed`]).
pub(crate) async fn move_dead<DB: Db>(
    queue: &Queue<DB>,
    tx: &mut Transaction<'static, DB>,
    dead: &[&ClaimedRow],
    error: &str,
) -> Result<Restored, Error> {
    if dead.is_empty() {
        return Ok(Restored { dead: 0, dead_failed: 0 });
    }
    let retry = &queue.inner().options.retry;
    // The dead letters behind a savepoint of their own: a move that fails (the dead-letter
    // table missing or not one) must not undo the batch's transaction, whose rows would be
    // claimable again at once, in a loop.
    DB::simple(tx, "SAVEPOINT rowbus_dead").await?;
    let moved = async {
        for chunk in dead.chunks(RESTORE_BATCH) {
            let args: Vec<Arg<'_>> = chunk
                .iter()
                .flat_map(|&row| restore_args(row, row.attempts + 1, None, Some(error)))
                .collect();
            DB::execute(tx, &Arc::from(queue.sql.dead_restore(chunk.len())), &args).await?;
        }
        if queue.keeps() {
            let dead: Vec<ClaimedRow> = dead.iter().map(|&row| row.clone()).collect();
            record(queue, tx, &dead, Moved::Dead, Some(error)).await?;
        }
        Ok::<_, Error>(())
    }
    .await;
    let Err(cause) = moved else {
        return Ok(Restored { dead: dead.len() as u64, dead_failed: 0 });
    };
    DB::simple(tx, "ROLLBACK TO SAVEPOINT rowbus_dead").await?;
    // Back in the queue after the policy's backoff, the attempt not counted: it comes back
    // as often as a retry would, its attempt not growing past the last.
    let table = queue.table().to_string();
    tracing::error!(
        %table, rows = dead.len(), error = %cause.one_line(),
        "dead-lettering failed; the messages stay in the queue and run again after the backoff"
    );
    for chunk in dead.chunks(RESTORE_BATCH) {
        let args: Vec<Arg<'_>> = chunk
            .iter()
            .flat_map(|&row| {
                let delay = retry.delay(u32::try_from(row.attempts + 1).unwrap_or(u32::MAX));
                restore_args(row, row.attempts, Some(micros(delay)), Some(error))
            })
            .collect();
        DB::execute(tx, &Arc::from(queue.sql.restore(chunk.len())), &args).await?;
    }
    Ok(Restored { dead: 0, dead_failed: dead.len() as u64 })
}

/// In the claim's transaction, after its handler snoozed and its writes were undone: puts
/// the claimed `rows` back to run after `after`, their attempt not counted. Their last
/// error is cleared: the transactional claim took the rows without it.
pub(crate) async fn restore_snoozed<DB: Db>(
    queue: &Queue<DB>,
    tx: &mut Transaction<'static, DB>,
    rows: &[ClaimedRow],
    after: Duration,
) -> Result<(), Error> {
    for chunk in rows.chunks(RESTORE_BATCH) {
        let args: Vec<Arg<'_>> =
            chunk.iter().flat_map(|row| restore_args(row, row.attempts, Some(micros(after)), None)).collect();
        DB::execute(tx, &Arc::from(queue.sql.restore(chunk.len())), &args).await?;
    }
    Ok(())
}

/// What [`restore_failed`] did with the rows it did not put back to run again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Restored {
    /// Moved to the dead-letter table.
    pub dead: u64,
    /// Used their attempts, but their move to the dead-letter table failed: back in the
    /// queue after the backoff instead.
    pub dead_failed: u64,
}

/// The binds of a row [`restore_failed`] writes with `attempts` as its count, in the order
/// of both of its statements: the delay and the deduplication id only where the row goes
/// back to the queue.
fn restore_args<'a>(
    row: &'a ClaimedRow,
    attempts: i64,
    delay: Option<i64>,
    error: Option<&'a str>,
) -> Vec<Arg<'a>> {
    let text = |t: &'a Option<String>| t.as_deref().map_or(Arg::Null, Arg::Text);
    let mut args = vec![Arg::Int(row.id), Arg::Text(&row.group), Arg::Bytes(&row.payload)];
    args.push(Arg::Int(attempts));
    args.extend(delay.map(Arg::Int));
    args.extend([Arg::Int(row.created_at), error.map_or(Arg::Null, Arg::Text), Arg::Int(row.priority)]);
    args.extend([text(&row.key), text(&row.headers)]);
    args.extend(delay.map(|_| text(&row.dedup_id)));
    args
}
