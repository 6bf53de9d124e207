//! A queue's schedules: `<table>_sched`, one row per schedule, and `<table>_ticks`, one
//! row per tick published, whose key `(schedule_name, tick_us)` makes each tick publish
//! once however many brokers run it.
//!
//! Times are BIGINT microseconds since the Unix epoch in both tables: the due-tick
//! arithmetic is done in the process on integers, and the same column type serves the
//! three databases. `since_us` is the database's clock when the schedule was added or
//! last changed; `version` a random number a change replaces, which the tick insert
//! checks so that a broker still holding an older definition publishes nothing.

use std::marker::PhantomData;
use std::sync::Arc;

use super::{Naming, quoted};
use crate::names::QueueTable;

/// The suffix of a queue's schedule table: `jobs_sched`. Six characters, as the pause
/// table's, so that the longest table name (57) still fits PostgreSQL's 63 with it.
pub(crate) const SCHED_SUFFIX: &str = "_sched";
/// The suffix of a queue's tick table: `jobs_ticks`.
pub(crate) const TICKS_SUFFIX: &str = "_ticks";

/// The schedule and tick tables' statements for one queue.
#[derive(Debug)]
pub struct ScheduleSql<DB> {
    /// The schedule table, quoted.
    pub sched: String,
    /// The tick table, quoted.
    pub ticks: String,
    /// Binds: name, cron, payload, group, every µs, version. Adds the schedule or
    /// replaces its definition, `since_us` set to the database's now.
    pub upsert: Arc<str>,
    /// Binds: name. The schedule's row: as [`list`](Self::list), without the last tick.
    pub get: Arc<str>,
    /// No binds: every schedule (name, cron, payload, group; every µs, since µs,
    /// version, last tick µs or NULL), by name.
    pub list: Arc<str>,
    /// Binds: name. Removes the schedule.
    pub delete: Arc<str>,
    /// Binds: name. Removes the schedule's ticks.
    pub delete_ticks: Arc<str>,
    /// Binds: name, tick µs, name, version. Records the tick unless it is recorded
    /// already or the schedule is gone or changed: one row inserted means "publish it".
    pub tick: Arc<str>,
    /// Binds: name, before µs. The tick [`CLEANUP_BATCH`] rows above the oldest of the
    /// schedule's ticks before `before`, if there are that many.
    pub cleanup_bound: Arc<str>,
    /// Binds: name, before µs. Deletes the schedule's ticks before `before`.
    pub cleanup: Arc<str>,
    /// No binds: the database's now, µs since the epoch.
    pub now: Arc<str>,
    db: PhantomData<fn() -> DB>,
}

/// Most tick rows one cleanup statement deletes.
pub(crate) const CLEANUP_BATCH: usize = 1000;

impl<DB: Scheduling> ScheduleSql<DB> {
    pub fn new(table: &QueueTable) -> Self {
        let s = quoted::<DB>(table, SCHED_SUFFIX);
        let k = quoted::<DB>(table, TICKS_SUFFIX);
        let p = DB::param;
        let now = DB::micros_of(DB::NOW);
        let columns = "name, cron, payload, group_name, every_us, version, since_us";
        let values = format!("{}, {}, {}, {}, {}, {}, {now}", p(1), p(2), p(3), p(4), p(5), p(6));
        let updates = ["cron", "payload", "group_name", "every_us", "version", "since_us"];
        let fields = "s.name, s.cron, s.payload, s.group_name, s.every_us, s.since_us, s.version";
        ScheduleSql {
            upsert: DB::upsert(&s, columns, &values, "name", &updates).into(),
            get: format!("SELECT {fields} FROM {s} s WHERE s.name = {}", p(1)).into(),
            list: format!(
                "SELECT {fields}, (SELECT MAX(k.tick_us) FROM {k} k WHERE k.schedule_name = s.name) \
                 FROM {s} s ORDER BY s.name"
            )
            .into(),
            delete: format!("DELETE FROM {s} WHERE name = {}", p(1)).into(),
            delete_ticks: format!("DELETE FROM {k} WHERE schedule_name = {}", p(1)).into(),
            tick: DB::insert_select_ignore(
                &k,
                "schedule_name, tick_us",
                &format!("SELECT {}, {} FROM {s} WHERE name = {} AND version = {}", p(1), p(2), p(3), p(4)),
            )
            .into(),
            cleanup_bound: format!(
                "SELECT tick_us FROM {k} WHERE schedule_name = {} AND tick_us < {} \
                 ORDER BY tick_us LIMIT 1 OFFSET {CLEANUP_BATCH}",
                p(1),
                p(2)
            )
            .into(),
            cleanup: format!("DELETE FROM {k} WHERE schedule_name = {} AND tick_us < {}", p(1), p(2)).into(),
            now: format!("SELECT {now}").into(),
            sched: s,
            ticks: k,
            db: PhantomData,
        }
    }
}

/// Schedules: the schedule and tick tables.
pub trait Scheduling: Naming {
    /// The queue's schedule table and tick table (see [`ScheduleSql`]), if missing:
    /// `<table>_sched` (`name` the key, `cron`, `payload`, `group_name`, `every_us`,
    /// `since_us`, `version`) and `<table>_ticks` (`schedule_name`, `tick_us`,
    /// `published_at`; the key `(schedule_name, tick_us)`).
    fn create_schedules(table: &QueueTable) -> Vec<String>;
}
