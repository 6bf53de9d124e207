//! A queue's pause table, `<table>_pause`: one row per pause, read by every claim.
//!
//! A row `(whole_queue = 1, group_name = '')` pauses the whole queue; a row
//! `(whole_queue = 0, group_name = G)` pauses group `G`. The flag rather than a reserved
//! group name: every string a group may be is a group a publisher may use, and MySQL's
//! collation makes `''` and `' '` the same key. Claims skip a group while either row is
//! there ([`Pausing::not_paused`](crate::sql::Pausing::not_paused)); deploying the queue creates the table.

use std::marker::PhantomData;
use std::sync::Arc;

use super::{Naming, quoted};
use crate::names::QueueTable;

/// The suffix of a queue's pause table: `jobs_pause`. Six characters, so that the longest
/// table name (57) still fits PostgreSQL's 63 with it.
pub(crate) const PAUSE_SUFFIX: &str = "_pause";

/// The pause table's statements for one queue.
#[derive(Debug)]
pub struct PauseSql<DB> {
    /// The pause table, quoted.
    pub quoted: String,
    /// No binds: pauses the whole queue (nothing when it already is).
    pub pause_queue: Arc<str>,
    /// Binds: group. Pauses one group (nothing when it already is).
    pub pause_group: Arc<str>,
    /// No binds: lifts every pause of the queue, its groups' included.
    pub resume_queue: Arc<str>,
    /// Binds: group. Lifts that group's own pause.
    pub resume_group: Arc<str>,
    /// No binds: each pause as (group, whole_queue).
    pub list: Arc<str>,
    db: PhantomData<fn() -> DB>,
}

impl<DB: Pausing> PauseSql<DB> {
    pub fn new(table: &QueueTable) -> Self {
        let p = quoted::<DB>(table, PAUSE_SUFFIX);
        let columns = "whole_queue, group_name";
        PauseSql {
            pause_queue: DB::insert_ignore(&p, columns, "1, ''").into(),
            pause_group: DB::insert_ignore(&p, columns, &format!("0, {}", DB::param(1))).into(),
            resume_queue: format!("DELETE FROM {p}").into(),
            resume_group: format!("DELETE FROM {p} WHERE whole_queue = 0 AND group_name = {}", DB::param(1))
                .into(),
            list: format!("SELECT group_name, whole_queue FROM {p} ORDER BY whole_queue DESC, group_name")
                .into(),
            quoted: p,
            db: PhantomData,
        }
    }
}

/// Pausing: the pause table and the condition every claim carries.
pub trait Pausing: Naming {
    /// The queue's pause table (see [`PauseSql`]), if missing: `whole_queue` (0 or 1, a
    /// BIGINT where that is what the driver reads as `i64`), `group_name` as the queue
    /// table has it, `paused_at`; the key `(whole_queue, group_name)`.
    fn create_pause(table: &QueueTable) -> String;

    /// A condition true while neither the queue (in table `table`) nor the group in
    /// placeholder `group` is paused: one lookup in the pause table, which the claims
    /// carry.
    fn not_paused(table: &QueueTable, group: &str) -> String {
        format!(
            "NOT EXISTS (SELECT 1 FROM {} WHERE whole_queue = 1 OR group_name = {group})",
            quoted::<Self>(table, PAUSE_SUFFIX)
        )
    }
}
