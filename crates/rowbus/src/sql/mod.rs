//! The dialects: everything rowbus says to a database, one module per database
//! (`postgres`, `mysql`, `sqlite`), each implementing the same small traits, one per
//! concept:
//!
//! - [`Naming`]: quoting, placeholders, times, and the statement forms the others build on;
//! - [`Schema`]: a queue's DDL, its upgrades, the deploy lock;
//! - [`Publishing`]: storing messages, deduplication ids and ordering keys;
//! - [`Claiming`]: claims, the transactions they begin, the handler's savepoint;
//! - [`Waking`]: notifications and the wake-ups publishes send;
//! - [`Connecting`]: pools, and the connection a listener runs on;
//! - [`Catalog`]: finding queue tables, and the figures of `stats`;
//! - [`Rotating`]: partitions emptied by `TRUNCATE`, and where claims start ([`Floor`]);
//! - [`Horizon`]: dead rows, size on disk and what holds the horizon (a queue's health);
//! - beside their features: [`Keeping`] (kept history), [`Pausing`], [`Scheduling`],
//!   [`Positions`] (durable listeners), [`Counting`] (a queue's event counters), [`Limiting`],
//!   [`Workflowing`] (a queue's workflow tables).
//!
//! [`Db`] is all of them at once: the broker and the listener are written once against
//! it and never ask which database they run on. A trait's provided methods are the
//! statements whose text only differs in the primitives; a database overrides one where
//! its shape differs. [`TableSql`] is one queue table's statements, built once from the
//! dialect.

mod catalog;
mod claims;
mod connect;
mod control;
mod counts;
mod dead;
mod history;
mod horizon;
mod limits;
mod messages;
#[cfg(feature = "mysql")]
mod mysql;
mod naming;
mod pause;
mod pool;
mod positions;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod publish;
pub(crate) mod push;
mod rotation;
mod schedule;
mod schema;
#[cfg(feature = "sqlite")]
mod sqlite;
mod statements;
mod table;
mod wake;
mod workflows;

use crate::backend::Backend;

pub use crate::backend::DbPool;
pub use catalog::Catalog;
pub use claims::{ACK_BATCH, Claiming};
pub use connect::{Connecting, TableConn};
pub use counts::Counting;
pub(crate) use counts::{COUNTS_SUFFIX, CountsSql};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use history::HISTORY_INDEX_SUFFIX;
pub use history::Keeping;
pub(crate) use history::{HISTORY_SUFFIX, HistorySql, KEEP_SUFFIX, Moved};
pub use horizon::Horizon;
pub(crate) use horizon::kind;
pub use limits::Limiting;
pub(crate) use limits::{LimitSql, PRUNE_SLACK, RATE_GUARD};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use naming::DEPLOY_LOCK_WAIT;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use naming::READY;
pub use naming::{ById, Naming};
pub(crate) use naming::{
    DEDUP, KEYS, LIMITS_SUFFIX, OLD_CLAIM, STARTS_SUFFIX, pairs_filter_from, placeholders, quoted,
};
pub use pause::Pausing;
pub(crate) use pause::{PAUSE_SUFFIX, PauseSql};
pub(crate) use pool::{Finishing, ForBackend, begin};
pub use pool::{OnPool, connect, connect_creating};
pub use positions::Positions;
pub(crate) use positions::{POSITIONS_SUFFIX, PositionsSql, micros, text};
pub use publish::Publishing;
pub use rotation::{Floor, Retire, Rotating, RotationSql};
pub use schedule::Scheduling;
pub(crate) use schedule::{SCHED_SUFFIX, ScheduleSql, TICKS_SUFFIX};
pub(crate) use schema::QUEUE_NAMES;
pub use schema::Schema;
pub(crate) use statements::{InsertForm, TableSql};
pub(crate) use table::{DEAD_FEATURE_COLUMNS, FEATURE_COLUMNS, LIMITS_FEATURE_COLUMNS, QUEUE_COLUMNS};
pub use wake::{
    Notifier, PG_MAX_CHANNEL_BYTES, PG_PAYLOAD_LIMIT_BYTES, Waking, check_pg_channel, check_pg_payload,
};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use workflows::EVENTS_INDEX;
pub use workflows::Workflowing;
pub(crate) use workflows::{EVENTS_SUFFIX, STEPS_SUFFIX, WORKFLOWS_SUFFIX, WorkflowSql};

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
    + Limiting
    + Scheduling
    + Positions
    + Counting
    + Rotating
    + Horizon
    + Workflowing
{
    /// Which backend this is.
    const BACKEND: Backend;
}
