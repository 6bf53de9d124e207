//! Rotation and floors: how a queue keeps its size and its claims' cost while something
//! else holds the database's horizon open, where that needs statements of its own.
//!
//! Under MVCC every claim and every acknowledgement leaves a dead row version, which only
//! VACUUM removes, and only once no transaction that could still see it is open. One
//! long transaction anywhere in the database (a report at REPEATABLE READ, `pg_dump`, a
//! replica's feedback) keeps them all: the table grows without end, and a claim, which
//! walks its index in order, steps over every dead entry in front of the first ready row.
//!
//! Two things answer that, each a statement set of the dialect's:
//!
//! - [`RotationSql`]: the queue table is a ring of partitions by a `slot` column whose
//!   default follows the clock, so publishes fill one partition for a few seconds, then the
//!   next. A partition no publish fills any more is emptied by `TRUNCATE`, which frees its
//!   space whatever holds the horizon, once what it still holds is moved to the partition
//!   publishes fill now (a few messages in flight or waiting for a retry; a partition
//!   holding a backlog waits until it drained).
//! - [`Floor`]: where a claim's scan of the ready index starts. Every ready or waiting
//!   row of a group lies at or after it, so the dead entries before it, most of what a
//!   draining queue leaves, are never read. Each broker computes it now and then for the
//!   groups it claims from (`broker::upkeep`).

use std::sync::Arc;

use super::Naming;
use crate::names::QueueTable;

/// Where a claim of a group starts reading its ready index: the priority most of its
/// waiting messages have, and times no waiting message of the group is visible before.
///
/// Rows a claim could take lie at or after `(priority, visible_us)` in claim order, or, at
/// another priority, at or after `others_us`; a claim reads the index from there. What
/// becomes claimable behind a floor after it was computed (a lease that expired, a message
/// given back, a transaction that committed long after it inserted) is found when the
/// floor is computed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Floor {
    /// The priority the claim's scan starts at (`i16::MIN`: from the first).
    pub priority: i16,
    /// Microseconds since the Unix epoch before which no claimable row of the group at
    /// `priority` is visible (0: none known).
    pub visible_us: i64,
    /// The same for the group's rows at every priority (at most `visible_us`).
    pub others_us: i64,
    /// Whether rows at other priorities than `priority` may wait: a claim that reads its
    /// priorities apart skips the others while none do.
    pub others: bool,
}

impl Floor {
    /// No floor: a claim reads its group's index from the start.
    pub const NONE: Floor = Floor { priority: i16::MIN, visible_us: 0, others_us: 0, others: true };
}

impl Default for Floor {
    fn default() -> Self {
        Floor::NONE
    }
}

/// One queue's ring of partitions: how many, and the statements that retire one.
#[derive(Debug)]
pub struct RotationSql {
    /// The partitions, `slot` 0 to `slots - 1`.
    pub slots: usize,
    /// How a retiring transaction begins: it waits only briefly for its lock.
    pub begin: &'static str,
    /// No binds. One row: the slot publishes fill now, then each partition's size in
    /// bytes, in slot order.
    pub look: Arc<str>,
    /// What retires each partition, in slot order.
    pub retire: Vec<Retire>,
}

/// The statements that retire one partition, run in one transaction begun with
/// [`RotationSql::begin`]: [`lock`](Self::lock), [`count`](Self::count), and when the
/// partition still holds something and no more than the caller's limit waits in it,
/// [`moves`](Self::moves) and [`truncate`](Self::truncate).
#[derive(Debug)]
pub struct Retire {
    /// No binds. Takes the partition's exclusive lock, or fails after a short wait.
    pub lock: Arc<str>,
    /// Binds: a limit. One row: the partition's size in bytes, and its rows counted up
    /// to the limit.
    pub count: Arc<str>,
    /// No binds. Moves every row of the partition to the one publishes fill now, as it
    /// is (id, lease and all).
    pub moves: Arc<str>,
    /// No binds. Empties the partition, giving its space back.
    pub truncate: Arc<str>,
}

/// Rotation, claim floors and log checkpoints, on the databases that need them.
pub trait Rotating: Naming {
    /// The ring of partitions of queue `table`, where queue tables rotate.
    fn rotation(table: &QueueTable) -> Option<RotationSql> {
        let _ = table;
        None
    }

    /// Where claims of a group start ([`Floor`]), where claims take one: a query
    /// (binds: group) returning, for each priority with messages of the group that are not
    /// held by an unexpired lease, a row `(priority, ready count, oldest visible_at µs)`,
    /// and one row `(NULL, NULL, now µs)` by the database's clock; where steps come between
    /// ([`floor_step_sql`](Self::floor_step_sql)), each row has a fourth column, the
    /// priority's earliest lease end of the rows held by a lease (NULL on the row of now),
    /// and a priority with held rows only has NULL for its oldest. It reads every row of
    /// the group.
    fn floor_sql(table: &QueueTable) -> Option<String> {
        let _ = table;
        None
    }

    /// A cheaper step of the floor between two of [`floor_sql`](Self::floor_sql)'s, where
    /// the database has one: a query (binds: group, group, the floor's priority, its
    /// `visible_us`, group, group, priority, group, group, priority) returning one row: the
    /// oldest `visible_at` µs of the priority's rows not held by a lease from there on
    /// (NULL: none), whether one waits at a more urgent priority and at a less urgent one
    /// (1 or NULL), and now µs. It reads from the floor on, and one row each side.
    fn floor_step_sql(table: &QueueTable) -> Option<String> {
        let _ = table;
        None
    }

    /// With [`floor_step_sql`](Self::floor_step_sql): a query (binds: group, group,
    /// priority, from µs, to µs) returning one row: the earliest lease end (µs; NULL:
    /// none) of the priority's rows visible from `from` to before `to` that are held by a
    /// lease, the rows a step moved the floor over. When it has passed, the floor is
    /// computed whole, which finds them again.
    fn floor_leases_sql(table: &QueueTable) -> Option<String> {
        let _ = table;
        None
    }

    /// Where the database keeps a log that a reader's transaction held elsewhere stops
    /// from being reset (SQLite's WAL): a statement, no binds, that copies what it can of
    /// the log into the database without waiting for anyone, returning one row `(busy,
    /// frames in the log, frames copied)`. Frames left behind are what a reader holds.
    fn checkpoint_sql() -> Option<&'static str> {
        None
    }
}
