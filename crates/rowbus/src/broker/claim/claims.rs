//! Claims: rows taken under a lease for a runner or a stream, or locked and deleted in a
//! transaction for a transactional handler. Each database's shape of them is its
//! [`Claiming`](crate::sql::Claiming) dialect's.

use std::time::{Duration, Instant};

use tracing::warn;

use sqlx::Transaction;

use crate::broker::Queue;
use crate::broker::claim::limited::{self, Held, Limited, Slot};
use crate::broker::exec::{micros, queue_error, retrying};
use crate::broker::settle::lease::{self, ack_in};
use crate::driver::ClaimedRow;
use crate::error::{Error, is_retryable};
use crate::sql::{Db, Finishing, begin};

/// What a claim brought back.
pub(crate) struct Claim {
    pub rows: Vec<ClaimedRow>,
    pub token: i64,
    /// What limit took fewer than the claim asked for, if one did.
    pub held: Option<Held>,
    /// Under a rate, when the messages may start, earliest first (see [`limited::claim_in`]).
    pub slots: Vec<Slot>,
}

/// Claims up to `limit` ready messages of `group` under a new lease, first acknowledging
/// the `(id, token)` pairs of `acks` in the same transaction: one commit for both. On an
/// error nothing was acknowledged.
///
/// `limited` says whether a limit applied to the group at the last claim: the claim then
/// goes the limited way ([`limited::claim_in`]), and says whether one still does. A plain
/// claim finds nothing in a limited group (it carries the check); when it finds nothing,
/// one look at the limits table tells, and the limited claim follows at once.
///
/// Safe to drop part way (a stream dropped, a runner's `select!`, an aborted relay): the
/// claim then runs to its end on a task of its own ([`Finishing`]), acknowledges `acks`
/// and gives what it took back at once, rather than after its lease.
pub(crate) async fn claim<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    limit: usize,
    lease: Duration,
    acks: &[(i64, i64)],
    limited: &mut bool,
    together: bool,
) -> Result<Claim, Error> {
    let (queue, group, acks, was_limited) = (queue.clone(), group.to_owned(), acks.to_vec(), *limited);
    let (claimed, still_limited) = Finishing::new(|abandoned| async move {
        let mut limited = was_limited;
        let claimed = claim_now(&queue, &group, limit, lease, &acks, &mut limited, together).await;
        if let (true, Ok(claim)) = (abandoned.is_set(), &claimed) {
            let ids: Vec<i64> = claim.rows.iter().map(|r| r.id).collect();
            if let Err(error) = lease::release_many(&queue, claim.token, &ids).await {
                warn!(%error, table = %queue.table(), "giving back a dropped claim's messages failed; their lease brings them back");
            }
        }
        (claimed, limited)
    })
    .await;
    *limited = still_limited;
    claimed
}

/// The claim itself, which [`claim`] runs to its end.
async fn claim_now<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    limit: usize,
    lease: Duration,
    acks: &[(i64, i64)],
    limited: &mut bool,
    together: bool,
) -> Result<Claim, Error> {
    let inner = queue.inner();
    let token = inner.token();
    let started = Instant::now();
    let lease_for = lease;
    let (lease, limit) = (micros(lease), i64::try_from(limit).unwrap_or(i64::MAX));
    let (mut rows, acked, held, slots) = if *limited {
        claim_limited(queue, group, limit, lease, token, acks, limited, together).await?
    } else {
        let (rows, acked) = claim_plain(queue, group, limit, lease, token, acks).await?;
        if rows.is_empty() && retrying(queue, || limited::applies(queue, group)).await? {
            *limited = true;
            let (rows, more, held, slots) =
                claim_limited(queue, group, limit, lease, token, &[], limited, together).await?;
            (rows, acked + more, held, slots)
        } else {
            (rows, acked, None, Vec::new())
        }
    };
    inner.counters.acknowledged(acks.len(), acked);
    // A claim whose commit took longer than its lease (a Galera cluster stalls commits
    // for seconds while it notices a lost node) returns rows another consumer may already
    // have claimed and handled: handling them would run a message twice without any
    // failure to account for it. They are left to whoever claims them next, as after a
    // crash.
    if started.elapsed() >= lease_for && !rows.is_empty() {
        warn!(
            table = %queue.table(),
            rows = rows.len(),
            "a claim took longer than its lease; its messages are left for the next claim"
        );
        rows.clear();
    }
    inner.counters.claimed(rows.len());
    // In claim order (a statement's RETURNING has none): by priority, then publish order.
    rows.sort_unstable_by_key(|r| (r.priority, r.id));
    Ok(Claim { rows, token, held, slots })
}

/// A limited claim ([`limited::claim_in`]) in a transaction of its own; sets `limited`
/// to whether a limit still applies.
#[allow(clippy::too_many_arguments)]
async fn claim_limited<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    limit: i64,
    lease: i64,
    token: i64,
    acks: &[(i64, i64)],
    limited: &mut bool,
    together: bool,
) -> Result<(Vec<ClaimedRow>, u64, Option<Held>, Vec<Slot>), Error> {
    let pool = &queue.inner().pool;
    let done = retrying(queue, || async move {
        let mut tx = begin(pool, DB::LEASE_CLAIM_BEGIN).await?;
        let done = limited::claim_in(queue, &mut tx, group, limit, lease, token, acks, together)
            .await
            .inspect_err(conflicted::<DB>)?;
        tx.commit().await.inspect_err(conflicted::<DB>)?;
        Ok(done)
    })
    .await?;
    let Limited { rows, acked, held, limited: still, slots } = done;
    *limited = still;
    Ok((rows, acked, held, slots))
}

/// The plain claim: the one statement (or transaction) of the database's shape.
async fn claim_plain<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    limit: i64,
    lease: i64,
    token: i64,
    acks: &[(i64, i64)],
) -> Result<(Vec<ClaimedRow>, u64), Error> {
    let inner = queue.inner();
    let (sql, keeping) = (&*queue.sql, queue.keeps());
    retrying(queue, || async move {
        let floor = inner.upkeep.floor(queue.table(), group);
        if acks.is_empty() && !DB::CLAIM_IN_TRANSACTION {
            let mut conn = inner.pool.acquire().await?;
            let rows = DB::claim(&mut conn, sql, group, limit, lease, token, floor).await;
            return Ok((rows.inspect_err(conflicted::<DB>)?, 0));
        }
        let mut tx = begin(&inner.pool, DB::LEASE_CLAIM_BEGIN).await?;
        let acked = ack_in(sql, &mut tx, acks, keeping).await?;
        let rows =
            DB::claim(&mut tx, sql, group, limit, lease, token, floor).await.inspect_err(conflicted::<DB>)?;
        tx.commit().await.inspect_err(conflicted::<DB>)?;
        Ok((rows, acked))
    })
    .await
}

/// Tells the dialect when a claim failed by a conflict with another's (it is tried again):
/// [`Claiming::claim_conflicted`](crate::sql::Claiming::claim_conflicted).
fn conflicted<DB: Db>(e: &sqlx::Error) {
    if is_retryable(e) {
        DB::claim_conflicted();
    }
}

/// Up to `limit` ready messages of `group`, taken in a new transaction for a transactional
/// handler: locked and deleted, so that committing the transaction acknowledges them.
pub(crate) async fn claim_locked<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    limit: usize,
) -> Result<(Transaction<'static, DB>, Vec<ClaimedRow>), Error> {
    let (pool, sql) = (&queue.inner().pool, &*queue.sql);
    let max = i64::try_from(limit).unwrap_or(i64::MAX);
    let (tx, rows) = retrying(queue, || async move {
        let floor = queue.inner().upkeep.floor(queue.table(), group);
        let mut tx = begin(pool, DB::LOCKED_CLAIM_BEGIN).await?;
        let rows = DB::take_locked(&mut tx, sql, group, max, floor).await.inspect_err(conflicted::<DB>)?;
        Ok((tx, rows))
    })
    .await?;
    Ok((tx, taken(queue, rows)))
}

/// [`claim_locked`] in the transaction `tx` already open (on a database with one writer,
/// where it cannot deadlock).
pub(crate) async fn take_in<DB: Db>(
    queue: &Queue<DB>,
    tx: &mut Transaction<'static, DB>,
    group: &str,
    limit: usize,
) -> Result<Vec<ClaimedRow>, Error> {
    let max = i64::try_from(limit).unwrap_or(i64::MAX);
    let floor = queue.inner().upkeep.floor(queue.table(), group);
    let rows = DB::take_locked(tx, &queue.sql, group, max, floor).await.map_err(|e| queue_error(queue, e))?;
    Ok(taken(queue, rows))
}

/// Counts a transactional claim (one that found nothing too, as lease claims are
/// counted), and puts what it took in the order handlers get it.
fn taken<DB: Db>(queue: &Queue<DB>, mut rows: Vec<ClaimedRow>) -> Vec<ClaimedRow> {
    queue.inner().counters.claimed(rows.len());
    rows.sort_unstable_by_key(|r| (r.priority, r.id));
    rows
}
