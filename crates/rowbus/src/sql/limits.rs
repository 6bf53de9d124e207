//! A queue's limits: `<table>_limits`, one row per limited scope, and `<table>_starts`,
//! one row per message a limited claim took.
//!
//! A limits row `(whole_queue = 1, group_name = '')` limits the whole queue, a row
//! `(whole_queue = 0, group_name = G)` group `G` (the flag as in the pause table). Its
//! columns, each NULL when unset: `max_running` (messages in flight at once), `per_key`
//! (messages of one ordering key in flight at once), `rate_count` and `rate_period_us`
//! (messages started per period), `rate_burst` (how many of them may start at once) and
//! `rate_next_us` (the rate's bucket: see `broker::claim::limited`).
//!
//! Every claim carries [`Limiting::not_limited`]: on a group without limits it is one
//! probe of the (small) limits table, as the pause check is; on a limited group it finds
//! nothing, and the claim goes the limited way (`broker::claim::limited`): under the
//! lock of the scope's limits row, it counts the scope's starts whose message still
//! holds that lease unexpired (in flight) and those of the last period (the rate), claims
//! what both leave, and writes a start per message claimed.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::{LIMITS_SUFFIX, Naming, STARTS_SUFFIX, quoted};
use crate::names::QueueTable;

/// The most a start counts beyond its rate's period (a tenth of the period, at most
/// this): see `broker::claim::limited::window`.
pub(crate) const RATE_GUARD: std::time::Duration = std::time::Duration::from_millis(100);

/// How many starts a scope may hold beyond those a claim counts (in flight, or in the
/// rate's window) before a claim forgets the rest: forgetting them is a statement, which
/// every claim ran before (the fifth of a claim under a concurrency limit), and starts
/// past their use only lengthen the counts' scan of the scope a little.
pub(crate) const PRUNE_SLACK: i64 = 64;

/// The limits tables' statements for one queue.
#[derive(Debug)]
pub struct LimitSql<DB> {
    /// The limits table, quoted.
    pub limits: String,
    /// The start log, quoted.
    pub starts: String,
    /// Binds: whole_queue, group, max_running. Sets the scope's concurrency limit.
    pub set_running: Arc<str>,
    /// Binds: whole_queue, group, per_key.
    pub set_per_key: Arc<str>,
    /// Binds: whole_queue, group, rate_count, rate_period_us, rate_burst (0: unset, the
    /// count). Starts the rate's bucket afresh.
    pub set_rate: Arc<str>,
    /// Binds: rate_next_us, whole_queue, group. Moves the rate's bucket on.
    pub set_next: Arc<str>,
    /// Binds: whole_queue, group. Removes the scope's limits.
    pub clear: Arc<str>,
    /// Binds: whole_queue, group. Removes the scope's starts.
    pub clear_starts: Arc<str>,
    /// No binds: each limit as (group; whole_queue, max_running, per_key, rate_count,
    /// rate_period_us, rate_burst) and how its scope stands (running, started in the
    /// rate's window, ready), the whole queue's first: one statement, as stats read it.
    pub list: Arc<str>,
    /// Binds: group. The limits that apply to a claim of the group, locked until the
    /// transaction ends (whole_queue, max_running, per_key, rate_count, rate_period_us,
    /// rate_burst, rate_next_us),
    /// the whole queue's first (the order every claim locks them in).
    pub lock: Arc<str>,
    /// Binds: group. The limits that apply to a claim of the group as [`lock`](Self::lock)
    /// reads them (not locked: see [`COUNTS_LOCK`](Self::COUNTS_LOCK)), each followed by
    /// how its scope stands: its messages in flight (its starts whose message holds that
    /// lease unexpired; 0 without a concurrency limit), its starts in the rate's window and
    /// the oldest of them (µs; 0 without a rate), now (µs, by the database's clock) and
    /// all its starts. One statement for every limit and every count.
    pub counts: Arc<str>,
    /// Binds: whole_queue, group, period µs. Forgets the scope's starts older than the
    /// period whose message no longer holds their lease (a claim runs it once a scope holds
    /// [`PRUNE_SLACK`] starts beyond those it counts).
    pub prune: Arc<str>,
    /// Binds: whole_queue, group, whole_queue, group, whole_queue, group. Records the
    /// scope's messages in flight now that have no start as starts long past (counted as running, not against a rate): a limit
    /// set on a queue whose consumers are running counts what they hold.
    pub seed: Arc<str>,
    /// Binds: group. Whether any limit applies to the group (a count).
    pub any: Arc<str>,
    /// The limited claims built so far, by messages of a key at once.
    claims: Mutex<HashMap<i64, Arc<str>>>,
    db: PhantomData<fn() -> DB>,
}

impl<DB: Limiting> LimitSql<DB> {
    pub fn new(table: &QueueTable) -> Self {
        let (l, s, t) =
            (quoted::<DB>(table, LIMITS_SUFFIX), quoted::<DB>(table, STARTS_SUFFIX), quoted::<DB>(table, ""));
        let p = DB::param;
        let now_us = DB::micros_of(DB::CLOCK);
        let scope = format!("whole_queue = {} AND group_name = {}", p(1), p(2));
        let set = |column: &str, values: &str, updates: &[&str]| -> Arc<str> {
            DB::upsert(
                &l,
                &format!("whole_queue, group_name, {column}"),
                values,
                "whole_queue, group_name",
                updates,
            )
            .into()
        };
        // A start (written `s`) whose message holds its lease unexpired.
        let live = |s: &str| {
            format!(
                "EXISTS (SELECT 1 FROM {t} AS q WHERE q.id = {s}.id AND q.lease = {s}.lease AND q.lease_until > {})",
                DB::NOW
            )
        };
        let scope_of = |n: usize| -> String {
            // Scope binds n and n + 1; a whole-queue scope takes every group's rows.
            format!("({} = 1 OR group_name = {})", p(n), p(n + 1))
        };
        LimitSql {
            set_running: set("max_running", &format!("{}, {}, {}", p(1), p(2), p(3)), &["max_running"]),
            set_per_key: set("per_key", &format!("{}, {}, {}", p(1), p(2), p(3)), &["per_key"]),
            set_rate: set(
                "rate_count, rate_period_us, rate_burst, rate_next_us",
                &format!("{}, {}, {}, {}, NULLIF({}, 0), NULL", p(1), p(2), p(3), p(4), p(5)),
                &["rate_count", "rate_period_us", "rate_burst", "rate_next_us"],
            ),
            set_next: format!("UPDATE {l} SET rate_next_us = {} WHERE whole_queue = {} AND group_name = {}", p(1), p(2), p(3))
                .into(),
            clear: format!("DELETE FROM {l} WHERE {scope}").into(),
            clear_starts: format!("DELETE FROM {s} WHERE {scope}").into(),
            list: format!(
                "SELECT l.group_name, l.whole_queue, l.max_running, l.per_key, l.rate_count, l.rate_period_us, \
                 l.rate_burst, \
                 (SELECT {count} FROM {s} AS s WHERE s.whole_queue = l.whole_queue AND s.group_name = l.group_name \
                 AND {live}), \
                 CASE WHEN l.rate_count > 0 AND l.rate_period_us > 0 THEN (SELECT {count} FROM {s} AS s \
                 WHERE s.whole_queue = l.whole_queue AND s.group_name = l.group_name AND s.started_us > {now_us} - \
                 (l.rate_period_us + CASE WHEN l.rate_period_us / 10 < {guard} THEN l.rate_period_us / 10 \
                 ELSE {guard} END)) ELSE 0 END, \
                 (SELECT {count} FROM {t} WHERE (l.whole_queue = 1 OR group_name = l.group_name) \
                 AND visible_at <= {now} AND (lease_until IS NULL OR lease_until <= {now})) \
                 FROM {l} AS l ORDER BY l.whole_queue DESC, l.group_name",
                count = DB::COUNT,
                live = live("s"),
                guard = RATE_GUARD.as_micros(),
                now = DB::NOW,
            )
            .into(),
            lock: format!(
                "SELECT whole_queue, max_running, per_key, rate_count, rate_period_us, rate_burst, rate_next_us \
                 FROM {l} WHERE whole_queue = 1 OR group_name = {} ORDER BY whole_queue DESC{}",
                p(1),
                DB::FOR_UPDATE
            )
            .into(),
            counts: {
                let same = "s.whole_queue = l.whole_queue AND s.group_name = l.group_name";
                let rated = "l.rate_count > 0 AND l.rate_period_us > 0";
                let window = format!(
                    "s.started_us > {now_us} - (l.rate_period_us + CASE WHEN l.rate_period_us / 10 < {guard} \
                     THEN l.rate_period_us / 10 ELSE {guard} END)",
                    guard = RATE_GUARD.as_micros()
                );
                format!(
                    "SELECT l.whole_queue, l.max_running, l.per_key, l.rate_count, l.rate_period_us, l.rate_burst, \
                     l.rate_next_us, \
                     CASE WHEN l.max_running > 0 THEN (SELECT {count} FROM {s} AS s WHERE {same} AND {live}) \
                     ELSE 0 END, \
                     CASE WHEN {rated} THEN (SELECT {count} FROM {s} AS s WHERE {same} AND {window}) ELSE 0 END, \
                     CASE WHEN {rated} THEN (SELECT {oldest} FROM {s} AS s WHERE {same} AND {window}) ELSE 0 END, \
                     {now}, \
                     (SELECT {count} FROM {s} AS s WHERE {same}) \
                     FROM {l} AS l WHERE l.whole_queue = 1 OR l.group_name = {} ORDER BY l.whole_queue DESC",
                    p(1),
                    count = DB::COUNT,
                    live = live("s"),
                    oldest = DB::bigint("COALESCE(MIN(s.started_us), 0)"),
                    now = DB::bigint(&now_us),
                )
                .into()
            },
            // No alias: MariaDB's single-table DELETE takes none.
            prune: format!("DELETE FROM {s} WHERE {scope} AND started_us <= {now_us} - {} AND NOT {}", p(3), live(&s))
                .into(),
            seed: DB::insert_select_ignore(
                &s,
                "whole_queue, group_name, started_us, id, lease",
                &format!(
                    "SELECT {}, {}, 0, id, lease FROM {t} AS q WHERE {} AND lease IS NOT NULL AND lease_until > {} \
                     AND NOT EXISTS (SELECT 1 FROM {s} AS s WHERE s.whole_queue = {} AND s.group_name = {} \
                     AND s.id = q.id AND s.lease = q.lease)",
                    p(1),
                    p(2),
                    scope_of(3),
                    DB::NOW,
                    p(5),
                    p(6)
                ),
            )
            .into(),
            any: format!("SELECT {} FROM {l} WHERE whole_queue = 1 OR group_name = {}", DB::COUNT, p(1)).into(),
            claims: Mutex::default(),
            limits: l,
            starts: s,
            db: PhantomData,
        }
    }
}

/// Limits: their tables and the conditions claims carry.
pub trait Limiting: Naming {
    /// The time a start is written at and the rate's window ends at: the time of the
    /// statement, not of its transaction's start (a claim may wait for the limits row's
    /// lock, and a start written at the time it began waiting would leave the window
    /// early).
    const CLOCK: &'static str = Self::NOW;

    /// The queue's limits table and start log (see [`LimitSql`]), if missing.
    fn create_limits(table: &QueueTable) -> Vec<String>;

    /// A condition true while no limit applies to the group in `group` (the claim's
    /// placeholder, or its candidate's column): one probe of the limits table, carried by
    /// every claim.
    fn not_limited(table: &QueueTable, group: &str) -> String {
        format!(
            "NOT EXISTS (SELECT 1 FROM {} WHERE whole_queue = 1 OR group_name = {group})",
            quoted::<Self>(table, LIMITS_SUFFIX)
        )
    }

    /// The claim's key condition with `n` (at least 2) messages of a key at once rather
    /// than one: true for a row without a key, or with fewer than `n` earlier messages of
    /// its key in the table. `n` is written into the statement, an integer (a claim's
    /// binds are fixed by its database's shape).
    fn key_within(table: &QueueTable, n: i64) -> String {
        format!(
            "(q.msg_key IS NULL OR NOT EXISTS (SELECT 1 FROM {} AS e WHERE e.msg_key = q.msg_key AND e.id < q.id \
             LIMIT 1 OFFSET {}))",
            quoted::<Self>(table, ""),
            n - 1
        )
    }

    /// The [`not_limited`](Self::not_limited) condition as the claim statement writes it.
    fn not_limited_in_claim(table: &QueueTable) -> String;
}

impl<DB: Limiting> LimitSql<DB> {
    /// Whether [`counts`](Self::counts) locks what it reads as well: where the claim's
    /// transaction holds the database's write lock from its start (SQLite), it takes the
    /// place of [`lock`](Self::lock). Elsewhere the counts must be read by a statement
    /// that starts once the lock is held: a statement's snapshot is taken at its start
    /// (PostgreSQL's read committed, InnoDB's read view), and one that waited for the
    /// lock would count without the starts of the claim it waited for.
    pub const COUNTS_LOCK: bool = DB::FOR_UPDATE.is_empty();

    /// The lease claim of a limited group with `per_key` messages of a key at once
    /// (0 or 1: one), built once per `per_key`.
    /// `build` makes it (see `Claiming::limited_claim_sql`).
    pub fn claim(&self, per_key: i64, build: impl FnOnce(i64) -> String) -> Arc<str> {
        let per_key = per_key.max(1);
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims.entry(per_key).or_insert_with(|| build(per_key).into()).clone()
    }

    /// A start per message claimed, each at its own time. Binds per message: whole_queue,
    /// group, started_us, id, lease.
    pub fn record_at(&self, ids: usize) -> Arc<str> {
        self.starts_insert(ids, None)
    }

    /// A start per message claimed, now. Binds per message: whole_queue, group, id, lease.
    pub fn record(&self, ids: usize) -> Arc<str> {
        self.starts_insert(ids, Some(DB::micros_of(DB::CLOCK)))
    }

    /// The INSERT of `ids` starts, each row's `started_us` the expression `now_us`, or a
    /// bind of its own between the group and the id.
    fn starts_insert(&self, ids: usize, now_us: Option<String>) -> Arc<str> {
        let per_row = if now_us.is_some() { 4 } else { 5 };
        let rows: Vec<String> = (0..ids)
            .map(|i| {
                let b: Vec<String> = (1..=per_row).map(|k| DB::param(per_row * i + k)).collect();
                match &now_us {
                    Some(now) => format!("({}, {}, {now}, {}, {})", b[0], b[1], b[2], b[3]),
                    None => format!("({})", b.join(", ")),
                }
            })
            .collect();
        format!(
            "INSERT INTO {} (whole_queue, group_name, started_us, id, lease) VALUES {}",
            self.starts,
            rows.join(", ")
        )
        .into()
    }
}
