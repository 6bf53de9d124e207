//! Pools of any of the three databases: the [`DbPool`] that holds one, the way from a
//! URL chosen at run time to code written once for every [`Db`] ([`OnPool`], and
//! [`ForBackend`] inside the crate), and, inside the crate, transactions begun on a pool
//! that are safe to drop part way ([`begin`], [`Finishing`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use sqlx::{ColumnIndex, Decode, Encode, Executor, Pool, Transaction, Type};

use super::Db;
use crate::backend::{Backend, DbPool, redact};
use crate::error::Error;

/// Code written once for the three databases, run for the one a [`Backend`] names.
pub(crate) trait ForBackend {
    type Output;
    fn run<DB: Db>(self) -> Self::Output;
}

impl Backend {
    /// Runs `f` for this backend's database: the one place a run-time choice of database
    /// becomes a type. Refuses a database this build left out (its cargo feature is off).
    pub(crate) fn on<F: ForBackend>(self, f: F) -> Result<F::Output, Error> {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres => Ok(f.run::<sqlx::Postgres>()),
            #[cfg(feature = "mysql")]
            Backend::MySql => Ok(f.run::<sqlx::MySql>()),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => Ok(f.run::<sqlx::Sqlite>()),
            #[allow(unreachable_patterns)]
            other => Err(Error::InvalidUrl {
                url: String::new(),
                reason: format!(
                    "this build of rowbus has no {} support (its cargo feature is off)",
                    other.name()
                ),
            }),
        }
    }
}

/// Code written once for the three databases, generic over [`Db`], run on the database
/// a [`DbPool`] holds: the way from a URL chosen at run time to typed code, without a
/// `match` on the pool.
///
/// ```no_run
/// # async fn f() -> Result<(), rowbus::Error> {
/// use rowbus::{Broker, BrokerOptions, Db, DbPool, Message, OnPool};
///
/// struct PublishHello;
///
/// impl OnPool for PublishHello {
///     type Output = Result<rowbus::Published, rowbus::Error>;
///
///     async fn run<DB: Db>(self, pool: rowbus::sqlx::Pool<DB>) -> Self::Output {
///         let broker = Broker::new(pool, BrokerOptions::default()).await?;
///         let jobs = broker.queue("jobs")?;
///         jobs.deploy().await?;
///         jobs.publish(Message::text("hello")).await
///     }
/// }
///
/// let db = DbPool::connect(&std::env::var("DATABASE_URL").unwrap()).await?;
/// db.run(PublishHello).await?;
/// # Ok(()) }
/// ```
pub trait OnPool {
    /// What it returns.
    type Output;
    /// Runs on `pool`. The bounds are those sqlx's own generic code needs (a pool or a
    /// connection as an executor; integers, text and bytes bound and decoded; columns by
    /// index): every rowbus database has them, so an implementation may use any of them
    /// (repeat the ones it uses on its `run`).
    fn run<DB: Db>(self, pool: Pool<DB>) -> impl Future<Output = Self::Output>
    where
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
        for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
        for<'q> &'q str: Encode<'q, DB> + Type<DB>,
        for<'q> String: Decode<'q, DB> + Type<DB>,
        for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
        for<'q> Vec<u8>: Decode<'q, DB> + Type<DB>,
        usize: ColumnIndex<DB::Row>;
}

/// A pool of database `DB` on `url` (a URL of that database), set up as
/// [`DbPool::connect_with_size`] sets up its pools: for code that knows its database. A
/// missing SQLite file is an error ([`Error::MissingDatabase`]); [`connect_creating`]
/// makes it.
///
/// ```no_run
/// # async fn f() -> Result<(), rowbus::Error> {
/// let pool = rowbus::connect::<rowbus::sqlx::MySql>("mysql://root@127.0.0.1/test", 8).await?;
/// # Ok(()) }
/// ```
pub async fn connect<DB: Db>(url: &str, max: u32) -> Result<Pool<DB>, Error> {
    connect_typed(url, max, false).await
}

/// [`connect`], making the database first when it is a SQLite file that does not exist
/// (the servers' databases are never created): for the code that deploys.
///
/// ```no_run
/// # async fn f() -> Result<(), rowbus::Error> {
/// let pool = rowbus::connect_creating::<rowbus::sqlx::Sqlite>("sqlite://app.sqlite", 4).await?;
/// # Ok(()) }
/// ```
pub async fn connect_creating<DB: Db>(url: &str, max: u32) -> Result<Pool<DB>, Error> {
    connect_typed(url, max, true).await
}

async fn connect_typed<DB: Db>(url: &str, max: u32, create: bool) -> Result<Pool<DB>, Error> {
    let backend = Backend::from_url(url)?;
    if backend != DB::BACKEND {
        return Err(Error::InvalidUrl {
            url: redact(url),
            reason: format!("a {} URL where a {} one was expected", backend.name(), DB::BACKEND.name()),
        });
    }
    DB::connect_pool(url, max, create).await
}

/// Connects a pool of one database.
struct Connect<'a> {
    url: &'a str,
    max: u32,
    create: bool,
}

impl<'a> ForBackend for Connect<'a> {
    type Output = BoxFuture<'a, Result<DbPool, Error>>;

    fn run<DB: Db>(self) -> Self::Output {
        Box::pin(async move { Ok(DB::wrap(DB::connect_pool(self.url, self.max, self.create).await?)) })
    }
}

impl DbPool {
    /// Connects a pool of up to 8 connections (4 on SQLite) and checks that one works. A
    /// missing SQLite file is an error ([`Error::MissingDatabase`]), whatever the URL's
    /// `mode`: [`connect_creating`](Self::connect_creating) makes it. A PostgreSQL URL with
    /// `pgbouncer=true` ([`PGBOUNCER`](crate::PGBOUNCER)) goes through PgBouncer in
    /// transaction pooling mode: no named statements, and listening on it is refused
    /// ([`Error::NeedsSession`]).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with_size(url, 8).await
    }

    /// Connects a pool of up to `max` connections (at most 4 on SQLite) and checks that
    /// one works. A missing SQLite file is an error, as with [`connect`](Self::connect).
    pub async fn connect_with_size(url: &str, max: u32) -> Result<Self, Error> {
        Backend::from_url(url)?.on(Connect { url, max, create: false })?.await
    }

    /// [`connect_with_size`](Self::connect_with_size), making the database first when it
    /// is a SQLite file that does not exist (the servers' databases are never created):
    /// for the code that deploys.
    pub async fn connect_creating(url: &str, max: u32) -> Result<Self, Error> {
        Backend::from_url(url)?.on(Connect { url, max, create: true })?.await
    }

    /// Runs `f` on the pool, typed: see [`OnPool`].
    pub async fn run<F: OnPool>(&self, f: F) -> F::Output {
        match self.clone() {
            #[cfg(feature = "postgres")]
            DbPool::Postgres(pool) => f.run(pool).await,
            #[cfg(feature = "mysql")]
            DbPool::MySql(pool) => f.run(pool).await,
            #[cfg(feature = "sqlite")]
            DbPool::Sqlite(pool) => f.run(pool).await,
        }
    }

    /// Closes every connection of the pool.
    pub async fn close(&self) {
        struct Close;
        impl OnPool for Close {
            type Output = ();
            async fn run<DB: Db>(self, pool: Pool<DB>) {
                pool.close().await
            }
        }
        self.run(Close).await
    }
}

/// Begins a transaction with `statement` on a connection of `pool`, safe to drop part way
/// (a `select!` that took another branch, a timeout, an aborted task). sqlx counts a
/// transaction only once its `BEGIN` has answered: a begin dropped while its statement was
/// on the way put the connection back into the pool inside a transaction that nothing
/// would end. Later statements on that connection then ran uncommitted, and on PostgreSQL
/// one failure among them failed every one after it (25P02). Here a begin dropped before it finished runs on to its end
/// on a task of its own, and the transaction it began is rolled back as a dropped one is.
pub(crate) fn begin<DB: Db>(
    pool: &Pool<DB>,
    statement: &'static str,
) -> impl Future<Output = Result<Transaction<'static, DB>, sqlx::Error>> + Send + 'static {
    let pool = pool.clone();
    Finishing::new(|_| async move { pool.begin_with(statement).await })
}

/// A future that, dropped before it finished, finishes on a task of its own, so that
/// statements are never cut off half way: sqlx's drivers do not all recover a connection
/// whose statement was dropped while its answer was on the way (dropped claims on MariaDB
/// left connections the pool never got back). What it returns then goes nowhere: the future learns so from its [`Abandoned`]
/// and can undo what it did.
pub(crate) struct Finishing<T: Send + 'static> {
    future: Option<BoxFuture<'static, T>>,
    abandoned: Abandoned,
}

/// Whether a [`Finishing`] future was dropped before it finished (set from then on).
#[derive(Clone, Default)]
pub(crate) struct Abandoned(Arc<AtomicBool>);

impl Abandoned {
    /// Whether nobody waits for the future's output any more.
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl<T: Send + 'static> Finishing<T> {
    /// The future `make` returns, given the flag it reads at its end.
    pub(crate) fn new<F>(make: impl FnOnce(Abandoned) -> F) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        let abandoned = Abandoned::default();
        Finishing { future: Some(Box::pin(make(abandoned.clone()))), abandoned }
    }
}

impl<T: Send + 'static> Future for Finishing<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let inner = self.future.as_mut().expect("polled after it finished");
        let out = std::task::ready!(inner.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for Finishing<T> {
    fn drop(&mut self) {
        if let (Some(unfinished), Ok(runtime)) = (self.future.take(), tokio::runtime::Handle::try_current()) {
            self.abandoned.0.store(true, Ordering::Release);
            runtime.spawn(unfinished);
        }
    }
}
