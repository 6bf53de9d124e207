//! The claim of a group some limit applies to (see [`Queue::set_limit`]): in one
//! transaction, the limits rows that apply are locked (the whole queue's first), the
//! room each leaves is counted from the start log, the claim takes at most the least of
//! them, and a start is written per message taken for each limit that counts them. Claims
//! of other processes on the same limits wait for the lock, and then count what this one
//! took: racing claims never take more than a limit leaves.
//!
//! SQLite claims hold the database's write lock from `BEGIN IMMEDIATE` on, which serialises
//! them the same way.

use std::time::Duration;

use sqlx::Transaction;

use crate::broker::Queue;
use crate::broker::settle::lease::ack_in;
use crate::driver::{Arg, ClaimedRow};
use crate::sql::{ACK_BATCH, Db};

/// Why a limited claim took fewer than it was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// A concurrency limit is reached: a slot frees when a message in flight settles or
    /// its lease runs out.
    Running,
    /// A rate limit is reached: its next start is allowed after this long (by the
    /// database's clock).
    Rate(Duration),
}

/// What a limited claim did.
pub(crate) struct Limited {
    pub rows: Vec<ClaimedRow>,
    pub acked: u64,
    /// What held the claim back, if anything did.
    pub held: Option<Held>,
    /// Whether any limit applies to the group still (if not, the next claim is a plain
    /// one).
    pub limited: bool,
}

/// One limits row as the claim locks it.
struct Row {
    whole_queue: i64,
    max_running: i64,
    per_key: i64,
    rate_count: i64,
    rate_us: i64,
}

impl Row {
    /// Whether the claim writes starts for this limit.
    fn counts(&self) -> bool {
        self.max_running > 0 || self.rated()
    }

    fn rated(&self) -> bool {
        self.rate_count > 0 && self.rate_us > 0
    }
}

/// The most [`window`] adds to a rate's period.
pub(crate) const RATE_GUARD: Duration = Duration::from_millis(100);

/// How long a start counts against a rate of period `period_us` (µs): the period and a
/// guard of a tenth of it, at most [`RATE_GUARD`]. A claim's starts are written at the
/// claim, its handlers begin a commit and a hand-over later, and that delay varies (by
/// tens of milliseconds on a loaded machine): without the guard, a period's worth of
/// handlers could begin less than a period after the previous period's began.
pub(crate) fn window(period_us: i64) -> i64 {
    let guard = i64::try_from(RATE_GUARD.as_micros()).unwrap_or(i64::MAX);
    period_us.saturating_add((period_us / 10).min(guard))
}

/// Claims up to `limit` rows of `group` under lease `token` as the limits allow, first
/// acknowledging `acks`, in the transaction `tx` (begun with
/// [`LEASE_CLAIM_BEGIN`](crate::sql::Claiming::LEASE_CLAIM_BEGIN)); the caller commits.
pub(crate) async fn claim_in<DB: Db>(
    queue: &Queue<DB>,
    tx: &mut Transaction<'static, DB>,
    group: &str,
    limit: i64,
    lease: i64,
    token: i64,
    acks: &[(i64, i64)],
) -> Result<Limited, sqlx::Error> {
    let sql = &*queue.sql;
    let limits = &sql.limits;
    let acked = ack_in(sql, tx, acks, queue.keeps()).await?;
    let locked = DB::fetch_rows(tx, &limits.lock, &[Arg::Text(group)], 0).await?;
    let floor = queue.inner().upkeep.floor(queue.table(), group);
    if locked.is_empty() {
        let rows = DB::claim(tx, sql, group, limit, lease, token, floor).await?;
        return Ok(Limited { rows, acked, held: None, limited: false });
    }
    let rows: Vec<Row> = locked
        .iter()
        .map(|r| Row {
            whole_queue: r.int(0),
            max_running: r.int(1),
            per_key: r.int(2),
            rate_count: r.int(3),
            rate_us: r.int(4),
        })
        .collect();
    let scope = |row: &Row| if row.whole_queue == 1 { "" } else { group };
    let (mut room, mut held, mut per_key) = (limit, None, 0_i64);
    for row in &rows {
        let binds = [Arg::Int(row.whole_queue), Arg::Text(scope(row))];
        if row.max_running > 0 {
            let running = DB::fetch_rows(tx, &limits.running, &binds, 0).await?;
            let left = row.max_running.saturating_sub(running.first().map_or(0, |r| r.int(0))).max(0);
            if left < room {
                room = left;
                held = Some(Held::Running);
            }
        }
        if row.per_key > 0 {
            per_key = if per_key == 0 { row.per_key } else { per_key.min(row.per_key) };
        }
        if row.rated() {
            let window = window(row.rate_us);
            let args = [binds[0], binds[1], Arg::Int(window)];
            let started = DB::fetch_rows(tx, &limits.started, &args, 0).await?;
            let (count, oldest, now) = started.first().map_or((0, 0, 0), |r| (r.int(0), r.int(1), r.int(2)));
            let left = row.rate_count.saturating_sub(count).max(0);
            if left < room || (left == 0 && room == 0) {
                room = left;
                // The oldest start of the period leaves it after `oldest + period`.
                let wait = oldest.saturating_add(window).saturating_sub(now).max(1_000);
                held = Some(if left == 0 {
                    Held::Rate(Duration::from_micros(wait.unsigned_abs()))
                } else {
                    Held::Running
                });
            }
        }
    }
    let claimed = if room > 0 {
        let claim = limits.claim(per_key, |per_key| DB::limited_claim_sql(&sql.table, per_key));
        DB::claim_limited(tx, sql, &claim, per_key, group, room, lease, token, floor).await?
    } else {
        Vec::new()
    };
    for row in rows.iter().filter(|row| row.counts()) {
        let (whole, scope) = (row.whole_queue, scope(row));
        for chunk in claimed.chunks(ACK_BATCH) {
            let args: Vec<Arg<'_>> = chunk
                .iter()
                .flat_map(|r| [Arg::Int(whole), Arg::Text(scope), Arg::Int(r.id), Arg::Int(token)])
                .collect();
            DB::execute(tx, &limits.record(chunk.len()), &args).await?;
        }
        let prune = [Arg::Int(whole), Arg::Text(scope), Arg::Int(window(row.rate_us.max(0)))];
        DB::execute(tx, &limits.prune, &prune).await?;
    }
    // Fewer than asked for because of a limit, unless the limit left exactly that many.
    let held = held.filter(|_| i64::try_from(claimed.len()).unwrap_or(i64::MAX) < limit);
    Ok(Limited { rows: claimed, acked, held, limited: true })
}

/// Whether any limit applies to `group` of `queue` now.
pub(crate) async fn applies<DB: Db>(queue: &Queue<DB>, group: &str) -> Result<bool, sqlx::Error> {
    let mut conn = queue.inner().pool.acquire().await?;
    let rows = DB::fetch_rows(&mut conn, &queue.sql.limits.any, &[Arg::Text(group)], 0).await?;
    Ok(rows.first().is_some_and(|r| r.int(0) > 0))
}
