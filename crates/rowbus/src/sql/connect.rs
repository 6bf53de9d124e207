//! Connecting: a pool in rowbus's session settings, and the connection a listener's
//! session runs on ([`TableConn`]) with its push path.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use notify_table::{Dialect, Row, Statement};
use sqlx::Pool;

use super::Positions;
use super::push::PushHandle;
use crate::backend::DbPool;
use crate::driver::TextsAndInts;
use crate::driver::sealed::Driver;
use crate::error::Error;

/// How a database is connected to, for a pool and for a listener.
pub trait Connecting: Driver + Sized {
    /// A pool of up to `max` connections in rowbus's session settings; with `create`, the
    /// database is made first if this database makes them on connecting (a SQLite file).
    fn connect_pool(url: &str, max: u32, create: bool) -> BoxFuture<'static, Result<Pool<Self>, Error>>;

    /// The pool in a [`DbPool`].
    fn wrap(pool: Pool<Self>) -> DbPool;

    /// Whether the database has LISTEN/NOTIFY of its own (PostgreSQL): a listener's
    /// session LISTENs on [`ListenConn`](Self::ListenConn) and reads only durable channels
    /// from the notify table; elsewhere the notify table carries every channel.
    const NATIVE_LISTEN: bool = false;

    /// The connection a listener's session runs on.
    type ListenConn: TableConn;

    /// Whether `pool` was connected through PgBouncer in transaction pooling mode
    /// (`pgbouncer=true`, PostgreSQL only): it has no session of its own to listen on.
    fn through_pgbouncer(_pool: &Pool<Self>) -> bool {
        false
    }
}

/// A connection the notify-table core can run its statements on.
pub trait TableConn: Send + Sized + 'static {
    /// The database, for the positions table's statements.
    type Db: Positions;
    fn dialect() -> Dialect;
    /// Each row's first `texts` columns as text, the rest as integers.
    fn rows(
        &mut self,
        stmt: &Statement,
        texts: usize,
    ) -> impl Future<Output = Result<Vec<TextsAndInts>, sqlx::Error>> + Send;
    /// A connection to `url`, and where it went: the URL of the one server it is on (a URL
    /// may list several), for [`push`](Self::push).
    fn open(url: &str) -> impl Future<Output = Result<(Self, String), Error>> + Send;
    /// Starts the push path of a listener connected at `at` (what [`open`](Self::open)
    /// said) and reading notify table `table`, opened again after a loss with backoff from
    /// `retry.0` to `retry.1`; `None` where the database has none (PostgreSQL: LISTEN).
    fn push(_at: &str, _table: &str, _retry: (Duration, Duration)) -> Option<PushHandle> {
        None
    }
    /// A number that changes when another connection commits, read without reading a
    /// table (SQLite's `PRAGMA data_version`); `None` where the database has none, and
    /// then every tick polls.
    fn data_version(&mut self) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send {
        async { Ok(None) }
    }
    fn session_id(&mut self) -> impl Future<Output = Result<Option<u64>, Error>> + Send;
    fn fetch(&mut self, stmt: &Statement) -> impl Future<Output = Result<Vec<Row>, sqlx::Error>> + Send;
    fn execute(&mut self, stmt: &Statement) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    /// The first column of every row, as ids.
    fn fetch_ids(&mut self, stmt: &Statement) -> impl Future<Output = Result<Vec<u64>, sqlx::Error>> + Send;
}
