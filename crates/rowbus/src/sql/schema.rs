//! The schema: the DDL of a queue's tables, what brings an older queue up to date, and the
//! lock that makes deploys of one queue run one at a time.

use futures::future::BoxFuture;

use super::COUNTS_SUFFIX;
use super::Naming;
use super::{EVENTS_SUFFIX, STEPS_SUFFIX, WORKFLOWS_SUFFIX};
use super::{HISTORY_SUFFIX, KEEP_SUFFIX, PAUSE_SUFFIX, SCHED_SUFFIX, TICKS_SUFFIX};
use super::{LIMITS_SUFFIX, STARTS_SUFFIX};
use super::{OLD_CLAIM, quoted};
use crate::error::Error;
use crate::names::QueueTable;

/// The suffixes of the names every database's deploy of a queue takes, the queue table's
/// own (`""`) first: its dead-letter, pause, schedule, tick, history and counts tables,
/// then its limits table and start log, and the workflow tables a queue's workflows
/// deploy beside it (`Workflows::deploy`).
pub(crate) const QUEUE_NAMES: [&str; 13] = [
    "",
    "_dead",
    PAUSE_SUFFIX,
    SCHED_SUFFIX,
    TICKS_SUFFIX,
    HISTORY_SUFFIX,
    KEEP_SUFFIX,
    COUNTS_SUFFIX,
    LIMITS_SUFFIX,
    STARTS_SUFFIX,
    WORKFLOWS_SUFFIX,
    STEPS_SUFFIX,
    EVENTS_SUFFIX,
];

/// A queue's tables: made, upgraded and deployed one deploy at a time.
pub trait Schema: Naming {
    /// What a queue's statements keep on this database beside the shared ones (the
    /// statements and counters of tables of its own); `()` where there is nothing.
    type TableState: std::fmt::Debug + Send + Sync + 'static;

    /// The [`TableState`](Self::TableState) of queue `table`.
    fn table_state(table: &QueueTable) -> Self::TableState;

    /// The queue table, its claim index and its dead-letter table, if missing.
    fn create_queue(table: &QueueTable) -> Vec<String>;

    /// The type and constraints of a column a deploy adds to an older queue or
    /// dead-letter table (one of [`FEATURE_COLUMNS`]).
    fn column_def(column: &str) -> &'static str;

    /// The statements that bring a queue table made by an older rowbus up to date, run
    /// before [`create_queue`](Self::create_queue)'s (which then add the indexes):
    /// `missing` are the [`FEATURE_COLUMNS`] the queue table lacks, `dead_missing` the
    /// [`DEAD_FEATURE_COLUMNS`] its dead-letter table lacks (both empty for a new table).
    fn migrate_queue(table: &QueueTable, missing: &[&str], dead_missing: &[&str]) -> Vec<String> {
        let (t, dead) = (quoted::<Self>(table, ""), quoted::<Self>(table, "_dead"));
        let add = |table: &str, column: &str| {
            format!("ALTER TABLE {table} ADD COLUMN {} {}", Self::quote(column), Self::column_def(column))
        };
        let mut statements: Vec<String> = missing.iter().map(|c| add(&t, c)).collect();
        statements.extend(dead_missing.iter().map(|c| add(&dead, c)));
        if missing.contains(&"priority") {
            statements.push(format!("DROP INDEX IF EXISTS {}", quoted::<Self>(table, OLD_CLAIM)));
        }
        statements
    }

    /// The tables of a queue besides those every database gives it (dropped with it),
    /// quoted.
    fn side_tables(_table: &QueueTable) -> Vec<String> {
        Vec::new()
    }

    /// The suffixes of every name a deployed queue takes among its schema's table names:
    /// [`QUEUE_NAMES`], then those of its [`side_tables`](Self::side_tables) and of its
    /// indexes where they share the tables' names. Two queues must take no name in common: a
    /// deploy refuses a queue whose names another queue's take
    /// ([`Error::QueueNameCollides`]).
    fn queue_names() -> Vec<&'static str> {
        QUEUE_NAMES.to_vec()
    }

    /// Whether the database matches table names without regard to case.
    const NAMES_FOLD_CASE: bool = false;

    /// What brings an older queue table's indexes up to date, run by a deploy after the
    /// columns ([`migrate_queue`](Self::migrate_queue)): for each change, a query returning
    /// one integer, non-zero when the table needs it (its binds are texts), and the
    /// statements that make it.
    fn index_upgrades(_table: &QueueTable) -> Vec<(String, Vec<String>, Vec<String>)> {
        Vec::new()
    }

    /// How a deploy's transaction begins: the check of what exists and the `CREATE`s run
    /// in it, on one connection.
    const DEPLOY_BEGIN: &'static str = "BEGIN";

    /// Takes, on `conn` inside the deploy's transaction, the lock that makes deploys of
    /// `table` run one at a time (every replica of an app may deploy at start-up): its
    /// name or key is a bind value. A lock of its own waits at most `DEPLOY_LOCK_WAIT`,
    /// then fails with [`Error::DeployLocked`].
    fn lock_deploy<'c>(conn: &'c mut Self::Connection, table: &'c str) -> BoxFuture<'c, Result<(), Error>>;

    /// Releases that lock before the transaction ends, where its end does not release it.
    fn unlock_deploy<'c>(
        _conn: &'c mut Self::Connection,
        _table: &'c str,
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        Box::pin(async { Ok(()) })
    }
}
