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
use tokio::time::Instant;

use crate::broker::Queue;
pub(crate) use crate::broker::claim::slot::{DbClock, Slot};
use crate::broker::settle::lease::ack_in;
use crate::driver::{Arg, ClaimedRow};
use crate::sql::{ACK_BATCH, Db, LimitSql, PRUNE_SLACK};

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
    /// Where a rate applies: when each message taken may start, by this process's clock,
    /// earliest first (one per row; the rows may go to them in any order).
    pub slots: Vec<Slot>,
}

/// One limits row as the claim locks it.
struct Row {
    whole_queue: i64,
    max_running: i64,
    per_key: i64,
    rate_count: i64,
    rate_us: i64,
    /// The rate's burst (0: unset, the rate's count).
    burst: i64,
    /// The rate's bucket: the earliest time (µs) its next start would be, with no burst
    /// (the generic cell rate algorithm's theoretical arrival time). 0: unset.
    next_us: i64,
}

impl Row {
    /// Whether the claim writes starts for this limit.
    fn counts(&self) -> bool {
        self.max_running > 0 || self.rated()
    }

    fn rated(&self) -> bool {
        self.rate_count > 0 && self.rate_us > 0
    }

    /// The time between two starts at the rate, µs (rounded up: never faster).
    fn interval(&self) -> i64 {
        let (us, n) = (self.rate_us.max(1), self.rate_count.max(1));
        us / n + i64::from(us % n != 0)
    }

    /// How many may start at once.
    fn burst(&self) -> i64 {
        match self.burst {
            b if b >= 1 => b.min(self.rate_count.max(1)),
            _ => self.rate_count.max(1),
        }
    }

    /// The earliest a start may be, by the bucket: `next_us` less what the burst allows
    /// ahead of it.
    fn earliest(&self) -> i64 {
        self.next_us.saturating_sub((self.burst() - 1).saturating_mul(self.interval()))
    }
}

/// How far ahead of the claim the first start of a rated claim is put, for a period of
/// `period_us`: half the [`window`]'s guard. The claim's commit and the hand-over to the
/// worker happen meanwhile, so that the handler is ready to begin at its start.
fn lead(period_us: i64) -> i64 {
    guard(period_us) / 2
}

/// The guard a start counts for beyond a period of `period_us` (see [`window`]).
fn guard(period_us: i64) -> i64 {
    let most = i64::try_from(RATE_GUARD.as_micros()).unwrap_or(i64::MAX);
    (period_us / 10).min(most)
}

/// The starts of up to `room` messages, µs, by the buckets of `rated` (each row's
/// `next_us` moved on past them): from `first` on, none later than `last`. With
/// `together` they are all one time (a batch begins at once), at most the least burst.
fn plan(rated: &mut [&mut Row], room: i64, first: i64, last: i64, together: bool) -> Vec<i64> {
    let room = match together {
        true => rated.iter().map(|r| r.burst()).min().unwrap_or(room).min(room),
        false => room,
    };
    let mut starts: Vec<i64> = Vec::new();
    let mut next: Vec<i64> = rated.iter().map(|r| r.next_us).collect();
    while i64::try_from(starts.len()).unwrap_or(i64::MAX) < room {
        let at = rated
            .iter()
            .zip(&next)
            .map(|(r, n)| n.saturating_sub((r.burst() - 1).saturating_mul(r.interval())))
            .fold(first, i64::max);
        if at > last {
            break;
        }
        for (r, n) in rated.iter().zip(next.iter_mut()) {
            *n = (*n).max(at).saturating_add(r.interval());
        }
        starts.push(at);
    }
    if together && let Some(&at) = starts.last() {
        let k = i64::try_from(starts.len()).unwrap_or(i64::MAX);
        for (r, n) in rated.iter().zip(next.iter_mut()) {
            *n = r.next_us.max(at).saturating_add(k.saturating_mul(r.interval()));
        }
        starts.iter_mut().for_each(|s| *s = at);
    }
    for (r, n) in rated.iter_mut().zip(next) {
        r.next_us = n;
    }
    starts
}

pub(crate) use crate::sql::RATE_GUARD;

/// How long a start counts against a rate of period `period_us` (µs): the period and a
/// guard of a tenth of it, at most [`RATE_GUARD`]. A claim's starts are written at the
/// claim, its handlers begin a commit and a hand-over later, and that delay varies (by
/// tens of milliseconds on a loaded machine): without the guard, a period's worth of
/// handlers could begin less than a period after the previous period's began.
pub(crate) fn window(period_us: i64) -> i64 {
    period_us.saturating_add(guard(period_us))
}

/// Claims up to `limit` rows of `group` under lease `token` as the limits allow, first
/// acknowledging `acks`, in the transaction `tx` (begun with
/// [`LEASE_CLAIM_BEGIN`](crate::sql::Claiming::LEASE_CLAIM_BEGIN)); the caller commits.
///
/// Under a rate, each message taken gets a start time (its [`Slot`]) a little ahead,
/// spread as the rate's burst says, and that time is its start in the log: its handler
/// waits for it, and does not begin more than the rate's guard after it. With
/// `together` (a batch) the messages share one start.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn claim_in<DB: Db>(
    queue: &Queue<DB>,
    tx: &mut Transaction<'static, DB>,
    group: &str,
    limit: i64,
    lease: i64,
    token: i64,
    acks: &[(i64, i64)],
    together: bool,
) -> Result<Limited, sqlx::Error> {
    let sql = &*queue.sql;
    let limits = &sql.limits;
    let acked = ack_in(sql, tx, acks, queue.keeps()).await?;
    // The limits rows locked (the whole queue's first), then read with their scopes'
    // counts, or both at once where the transaction holds every row already.
    let locked = match LimitSql::<DB>::COUNTS_LOCK {
        true => None,
        false => Some(DB::fetch_rows(tx, &limits.lock, &[Arg::Text(group)], 0).await?),
    };
    let floor = queue.inner().upkeep.floor(queue.table(), group);
    if locked.as_ref().is_some_and(Vec::is_empty) {
        let rows = DB::claim(tx, sql, group, limit, lease, token, floor).await?;
        return Ok(Limited { rows, acked, held: None, limited: false, slots: Vec::new() });
    }
    let mut counted = DB::fetch_rows(tx, &limits.counts, &[Arg::Text(group)], 0).await?;
    let arrived = Instant::now();
    if let Some(locked) = &locked {
        // A limit set since the lock was taken is left to the next claim.
        counted.retain(|c| locked.iter().any(|l| l.int(0) == c.int(0)));
    }
    if counted.is_empty() {
        let rows = DB::claim(tx, sql, group, limit, lease, token, floor).await?;
        return Ok(Limited { rows, acked, held: None, limited: false, slots: Vec::new() });
    }
    let mut rows: Vec<Row> = counted
        .iter()
        .map(|r| Row {
            whole_queue: r.int(0),
            max_running: r.int(1),
            per_key: r.int(2),
            rate_count: r.int(3),
            rate_us: r.int(4),
            burst: r.int(5),
            next_us: r.int(6),
        })
        .collect();
    let scope = |row: &Row| if row.whole_queue == 1 { "" } else { group };
    let (mut room, mut held, mut per_key) = (limit, None, 0_i64);
    // The database's time at the counts, and when their answer came.
    let mut clock: Option<(i64, Instant)> = None;
    // Whether a scope holds enough starts past their use to forget them.
    let mut prune = Vec::new();
    for (row, counts) in rows.iter().zip(&counted) {
        let (running, started, oldest, now, all) =
            (counts.int(7), counts.int(8), counts.int(9), counts.int(10), counts.int(11));
        if row.counts() && all.saturating_sub(running.max(started)) > PRUNE_SLACK {
            prune.push(row.whole_queue);
        }
        if row.max_running > 0 {
            let left = row.max_running.saturating_sub(running).max(0);
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
            clock.get_or_insert((now, arrived));
            let left = row.rate_count.saturating_sub(started).max(0);
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
    // Under a rate, the starts the buckets allow from a little ahead on, as far as a
    // quarter of the lease (and a period) ahead: the rest wait for a later claim.
    let mut starts = Vec::new();
    // Where the plan was made, and the buckets before it (see below).
    let mut planned = None;
    if let (Some((now, _)), true) = (clock, room > 0) {
        let shortest = rows.iter().filter(|r| r.rated()).map(|r| r.rate_us).min().unwrap_or(0);
        let first = now.saturating_add(lead(shortest));
        let last = first.saturating_add(shortest.min(lease / 4));
        planned = Some((first, last, rows.iter().map(|r| r.next_us).collect::<Vec<_>>()));
        let mut rated: Vec<&mut Row> = rows.iter_mut().filter(|r| r.rated()).collect();
        starts = plan(&mut rated, room, first, last, together);
        if starts.is_empty() {
            // The buckets' next start is past the last this claim may plan.
            let next = rated.iter().map(|r| r.earliest()).max().unwrap_or(last);
            let wait = next.saturating_sub(last).max(1_000);
            held = Some(Held::Rate(Duration::from_micros(wait.unsigned_abs())));
        }
        room = room.min(i64::try_from(starts.len()).unwrap_or(i64::MAX));
    }
    let claimed = if room > 0 {
        let claim = limits.claim(per_key, |per_key| DB::limited_claim_sql(&sql.table, per_key));
        DB::claim_limited(tx, sql, &claim, per_key, group, room, lease, token, floor).await?
    } else {
        Vec::new()
    };
    if let Some((first, last, before)) = planned
        && claimed.len() < starts.len()
    {
        // Fewer ready than planned for: the buckets move on by what was taken only (an
        // idle consumer's claims would otherwise push them ahead of time, poll by poll).
        rows.iter_mut().zip(before).for_each(|(r, next)| r.next_us = next);
        let mut rated: Vec<&mut Row> = rows.iter_mut().filter(|r| r.rated()).collect();
        let taken = i64::try_from(claimed.len()).unwrap_or(i64::MAX);
        starts = if taken > 0 { plan(&mut rated, taken, first, last, together) } else { Vec::new() };
    }
    // Every start of the claim (each scope that counts them, each message) in one
    // statement per chunk: (whole_queue, scope, its time if a rate planned it, id).
    let planned_at = &starts;
    let entries: Vec<(i64, &str, i64, i64)> = rows
        .iter()
        .filter(|row| row.counts())
        .flat_map(|row| {
            let (whole, scope) = (row.whole_queue, scope(row));
            claimed
                .iter()
                .enumerate()
                .map(move |(i, r)| (whole, scope, planned_at.get(i).copied().unwrap_or(0), r.id))
        })
        .collect();
    for chunk in entries.chunks(ACK_BATCH) {
        if starts.is_empty() {
            // Without a rate a start is the claim's time (it counts for a concurrency limit).
            let args: Vec<Arg<'_>> = chunk
                .iter()
                .flat_map(|&(whole, scope, _, id)| {
                    [Arg::Int(whole), Arg::Text(scope), Arg::Int(id), Arg::Int(token)]
                })
                .collect();
            DB::execute(tx, &limits.record(chunk.len()), &args).await?;
        } else {
            let args: Vec<Arg<'_>> = chunk
                .iter()
                .flat_map(|&(whole, scope, at, id)| {
                    [Arg::Int(whole), Arg::Text(scope), Arg::Int(at), Arg::Int(id), Arg::Int(token)]
                })
                .collect();
            DB::execute(tx, &limits.record_at(chunk.len()), &args).await?;
        }
    }
    for row in rows.iter().filter(|row| row.rated() && !starts.is_empty()) {
        let next = [Arg::Int(row.next_us), Arg::Int(row.whole_queue), Arg::Text(scope(row))];
        DB::execute(tx, &limits.set_next, &next).await?;
    }
    for row in rows.iter().filter(|row| prune.contains(&row.whole_queue)) {
        let prune = [Arg::Int(row.whole_queue), Arg::Text(scope(row)), Arg::Int(window(row.rate_us.max(0)))];
        DB::execute(tx, &limits.prune, &prune).await?;
    }
    // Fewer than asked for because of a limit, unless the limit left exactly that many.
    let held = held.filter(|_| i64::try_from(claimed.len()).unwrap_or(i64::MAX) < limit);
    let slots = match clock {
        Some((now, arrived)) if !starts.is_empty() => {
            let clock = &queue.inner().db_clock;
            let offset = clock.sample(now, arrived);
            let shortest = rows.iter().filter(|r| r.rated()).map(|r| r.rate_us).min().unwrap_or(0);
            let late = Duration::from_micros(guard(shortest).unsigned_abs());
            starts
                .iter()
                .map(|&at| {
                    let at = clock.local(at, offset);
                    Slot { at, late_after: at + late }
                })
                .collect()
        }
        _ => Vec::new(),
    };
    Ok(Limited { rows: claimed, acked, held, limited: true, slots })
}

/// Whether any limit applies to `group` of `queue` now.
pub(crate) async fn applies<DB: Db>(queue: &Queue<DB>, group: &str) -> Result<bool, sqlx::Error> {
    let mut conn = queue.inner().pool.acquire().await?;
    let rows = DB::fetch_rows(&mut conn, &queue.sql.limits.any, &[Arg::Text(group)], 0).await?;
    Ok(rows.first().is_some_and(|r| r.int(0) > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limits row of a rate of `count` per second, burst `burst` (0: unset).
    fn rated(count: i64, burst: i64, next_us: i64) -> Row {
        Row {
            whole_queue: 1,
            max_running: 0,
            per_key: 0,
            rate_count: count,
            rate_us: 1_000_000,
            burst,
            next_us,
        }
    }

    #[test]
    fn a_burst_of_one_spreads_starts_one_interval_apart() {
        let mut row = rated(10, 1, 0);
        let starts = plan(&mut [&mut row], 3, 5_000, 1_005_000, false);
        assert_eq!(starts, [5_000, 105_000, 205_000]);
        assert_eq!(row.next_us, 305_000);
        // The next claim goes on from there, not from its own first.
        let starts = plan(&mut [&mut row], 2, 6_000, 1_006_000, false);
        assert_eq!(starts, [305_000, 405_000]);
    }

    #[test]
    fn the_default_burst_starts_the_count_at_once_and_stops_at_the_last() {
        let mut row = rated(4, 0, 0);
        assert_eq!(
            plan(&mut [&mut row], 6, 1_000, 1_001_000, false),
            [1_000; 4].to_vec().into_iter().chain([251_000, 501_000]).collect::<Vec<_>>()
        );
        let mut row = rated(10, 1, 0);
        assert_eq!(plan(&mut [&mut row], 5, 0, 250_000, false), [0, 100_000, 200_000]);
    }

    #[test]
    fn a_batch_shares_one_start_and_takes_at_most_the_burst() {
        let mut row = rated(10, 3, 0);
        let starts = plan(&mut [&mut row], 8, 0, 1_000_000, true);
        assert_eq!(starts, [0, 0, 0]);
        assert_eq!(row.next_us, 300_000);
    }

    #[test]
    fn the_strictest_of_two_buckets_holds() {
        let (mut queue, mut group) = (rated(10, 1, 0), rated(5, 1, 0));
        let starts = plan(&mut [&mut queue, &mut group], 3, 0, 1_000_000, false);
        assert_eq!(starts, [0, 200_000, 400_000]);
    }
}
