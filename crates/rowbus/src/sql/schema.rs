//! The schema: the DDL of a queue's tables, what brings an older queue up to date, and the
//! lock that makes deploys of one queue run one at a time.

use futures::future::BoxFuture;

use super::Naming;
use super::{OLD_CLAIM, quoted};
use crate::error::Error;
use crate::names::QueueTable;

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
