//! The dialects: everything rowbus says to a database, one module per database
//! (`postgres`, `mysql`, `sqlite`), each implementing the same small traits, one per
//! concept:
//!
//! - [`Naming`]: quoting, placeholders, times, and the statement forms the others build on;
//! - [`Schema`]: a queue's DDL, its upgrades, the deploy lock;
//! - [`Publishing`]: storing messages, deduplication ids and ordering keys;
//! - [`Claiming`]: claims, the transactions they begin, the handler's savepoint;
//! - [`Waking`]: notifications and the wake-ups publishes send;
//! - [`Connecting`]: pools, [`DbPool`], and the connection a listener runs on;
//! - [`Catalog`]: finding queue tables, and the figures of `stats`;
//! - beside their features: [`Keeping`] (kept history), [`Pausing`], [`Scheduling`],
//!   [`Positions`] (durable listeners).
//!
//! [`Db`] is all of them at once: the broker and the listener are written once against
//! it and never ask which database they run on. A trait's provided methods are the
//! statements whose text only differs in the primitives; a database overrides one where
//! its shape differs. [`TableSql`] is one queue table's statements, built once from the
//! dialect.

mod catalog;
mod claims;
mod connect;
mod dead;
mod history;
#[cfg(feature = "mysql")]
mod mysql;
mod naming;
mod pause;
mod positions;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod publish;
mod schedule;
mod schema;
#[cfg(feature = "sqlite")]
mod sqlite;
mod table;
mod wake;

use crate::backend::Backend;
use crate::names::QueueTable;

pub use catalog::Catalog;
pub use claims::{ACK_BATCH, Claiming};
pub(crate) use connect::ForBackend;
pub use connect::{Connecting, DbPool, OnPool, TableConn, connect, connect_creating};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use history::HISTORY_INDEX_SUFFIX;
pub use history::Keeping;
pub(crate) use history::{HISTORY_SUFFIX, HistorySql, KEEP_SUFFIX, Moved};
pub use naming::Naming;
pub use pause::Pausing;
pub(crate) use pause::{PAUSE_SUFFIX, PauseSql};
pub use positions::Positions;
pub(crate) use positions::{POSITIONS_SUFFIX, PositionsSql, micros, text};
pub use publish::Publishing;
pub use schedule::Scheduling;
pub(crate) use schedule::{SCHED_SUFFIX, ScheduleSql, TICKS_SUFFIX};
pub use schema::Schema;
pub(crate) use table::{DEAD_FEATURE_COLUMNS, FEATURE_COLUMNS, InsertForm, QUEUE_COLUMNS, TableSql};
pub use wake::{
    Notifier, PG_MAX_CHANNEL_BYTES, PG_PAYLOAD_LIMIT_BYTES, Waking, check_pg_channel, check_pg_payload,
};

/// The name suffix of a queue table's claim index: (group, priority, visible_at, id)
/// (MySQL/MariaDB's claim order is the primary key instead).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const READY: &str = "_ready";
/// The name suffix of the claim index of a queue table made before priorities, which a
/// deploy replaces with [`READY`].
pub(crate) const OLD_CLAIM: &str = "_claim";
/// The name suffix of a queue table's ordering-key index: (key, id).
pub(crate) const KEYS: &str = "_key";
/// The name suffix of a queue table's unique index on deduplication ids.
pub(crate) const DEDUP: &str = "_dedup";

/// How long a deploy waits for another deploy's lock before it gives up: a deploy holds
/// it for a few statements of DDL, so a longer wait means one is stuck. (SQLite's deploys
/// wait for the write lock, as long as its busy timeout.)
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const DEPLOY_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The sqlx databases rowbus works on: [`Postgres`](sqlx::Postgres),
/// [`MySql`](sqlx::MySql) and [`Sqlite`](sqlx::Sqlite), each behind its cargo feature
/// (`postgres`, `mysql`, `sqlite`; all on by default). Sealed: it is every dialect trait
/// of this module at once, implemented in each database's module.
///
/// Write code once for all three as `async fn f<DB: rowbus::Db>(pool: sqlx::Pool<DB>)`,
/// and run it on whichever database a URL names with [`DbPool::run`].
pub trait Db:
    sqlx::Database<Arguments: sqlx::IntoArguments<Self>>
    + Naming
    + Schema
    + Publishing
    + Claiming
    + Waking
    + Connecting
    + Catalog
    + Keeping
    + Pausing
    + Scheduling
    + Positions
{
    /// Which backend this is.
    const BACKEND: Backend;
}

/// `n` placeholders, numbered from `first`.
pub(crate) fn placeholders<DB: Naming>(first: usize, n: usize) -> String {
    (first..first + n).map(DB::param).collect::<Vec<_>>().join(", ")
}

/// A queue table's name with `suffix` (`""`, or `_dead` for its dead-letter table), quoted.
pub(crate) fn quoted<DB: Naming>(table: &QueueTable, suffix: &str) -> String {
    let name = DB::quote(&format!("{}{suffix}", table.name()));
    match table.schema() {
        Some(schema) => format!("{}.{name}", DB::quote(schema)),
        None => name,
    }
}
