//! A queue's event counters, `<table>_count`: one row per kind of event (`snoozed`,
//! `cancelled`, `timed_out`, `lease_lost`), its count since the queue was deployed, so that
//! other processes (`rowbus stats`, the dashboard) see what consumers did. Each event adds
//! to its row in one upsert; nothing else writes the table.

use std::marker::PhantomData;
use std::sync::Arc;

use super::{Naming, quoted};
use crate::names::QueueTable;

/// The suffix of a queue's counts table: `jobs_count`. Six characters, so that the
/// longest table name (57) still fits PostgreSQL's 63 with it.
pub(crate) const COUNTS_SUFFIX: &str = "_count";

/// The counts table's statements for one queue.
#[derive(Debug)]
pub struct CountsSql<DB> {
    /// The counts table, quoted.
    pub quoted: String,
    /// Binds: name, n. Adds n to the counter `name`, creating it at n.
    pub add: Arc<str>,
    /// No binds: each counter as (name, n).
    pub list: Arc<str>,
    db: PhantomData<fn() -> DB>,
}

impl<DB: Counting> CountsSql<DB> {
    pub fn new(table: &QueueTable) -> Self {
        let c = quoted::<DB>(table, COUNTS_SUFFIX);
        let values = format!("{}, {}", DB::param(1), DB::param(2));
        CountsSql {
            add: DB::upsert_add(&c, "name, n", &values, "name", "n").into(),
            list: format!("SELECT name, {} FROM {c}", DB::bigint("n")).into(),
            quoted: c,
            db: PhantomData,
        }
    }
}

/// Counting: the counts table.
pub trait Counting: Naming {
    /// The queue's counts table (see [`CountsSql`]), if missing: `name` (text, the key)
    /// and `n` (a BIGINT, what the driver reads as `i64`).
    fn create_counts(table: &QueueTable) -> String;
}
