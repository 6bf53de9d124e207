//! The three databases rowbus speaks, and the one place a database named at run time
//! (by a URL, or by the pool it gave) becomes a type.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::pool::PoolOptions;
use sqlx::{ColumnIndex, Connection, Database, Decode, Encode, Executor, Pool, Type};

use crate::db::Db;
use crate::error::Error;

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// PostgreSQL: native LISTEN/NOTIFY.
    Postgres,
    /// MySQL 8.0+ or MariaDB 10.6+: the notify table.
    MySql,
    /// SQLite: the notify table.
    Sqlite,
}

impl Backend {
    /// The backend a URL's scheme names: `postgres://` or `postgresql://`, `mysql://` or
    /// `mariadb://`, `sqlite:`.
    ///
    /// ```
    /// use rowbus::Backend;
    /// assert_eq!(Backend::from_url("mariadb://root@127.0.0.1/test").unwrap(), Backend::MySql);
    /// assert!(Backend::from_url("redis://localhost").is_err());
    /// ```
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let scheme = url.split_once(':').map(|(scheme, _)| scheme.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => Ok(Backend::Postgres),
            Some("mysql" | "mariadb") => Ok(Backend::MySql),
            Some("sqlite") => Ok(Backend::Sqlite),
            _ => Err(Error::InvalidUrl {
                url: redact(url),
                reason: "expected a postgres://, mysql://, mariadb:// or sqlite: URL".into(),
            }),
        }
    }

    /// The backend's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "PostgreSQL",
            Backend::MySql => "MySQL/MariaDB",
            Backend::Sqlite => "SQLite",
        }
    }
}

/// The URL with any password replaced by `***`, fit for messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// How long a pooled connection may sit idle and still be handed out untested.
///
/// sqlx pings every idle connection it hands out by default: a round trip before each
/// statement of a single publish or an acknowledgement, as many round trips as the work
/// itself. A connection that came back less than this long ago answered its last
/// statement then; if the server went away since, its next statement fails as one in
/// flight would have (HikariCP skips its alive check likewise, for 500 ms).
pub(crate) const UNTESTED_IDLE: Duration = Duration::from_secs(1);

/// The pool options of every pool rowbus connects: up to `max` connections, a 10 s
/// acquire timeout, a ping only for connections idle [`UNTESTED_IDLE`] or longer.
pub(crate) fn pool_options<DB: Database>(max: u32) -> PoolOptions<DB> {
    PoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(false)
        .before_acquire(|conn: &mut DB::Connection, meta| {
            Box::pin(async move {
                if meta.idle_for >= UNTESTED_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

pub(crate) fn invalid_url(url: &str, e: sqlx::Error) -> Error {
    Error::InvalidUrl { url: redact(url), reason: e.to_string() }
}

pub(crate) fn connect_error(url: &str) -> impl FnOnce(sqlx::Error) -> Error + '_ {
    move |source| Error::Connect { target: redact(url), source }
}

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

/// A connection pool on any of the three databases, set up the way rowbus needs it
/// (strict `sql_mode` and READ COMMITTED on MySQL/MariaDB, WAL and a busy timeout on
/// SQLite). Run code written for any [`Db`] on it with [`run`](Self::run).
///
/// ```no_run
/// # async fn f() -> Result<(), rowbus::Error> {
/// let db = rowbus::DbPool::connect_creating("sqlite://app.sqlite", 4).await?;
/// db.deploy_notify_table(&rowbus::NotifyConfig::default()).await?;
/// db.notify("jobs", "wake up").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub enum DbPool {
    /// A PostgreSQL pool.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// A MySQL/MariaDB pool.
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    /// A SQLite pool.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
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
    /// `mode`: [`connect_creating`](Self::connect_creating) makes it.
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

    /// Which database this pool talks to.
    pub fn backend(&self) -> Backend {
        match self {
            #[cfg(feature = "postgres")]
            DbPool::Postgres(_) => Backend::Postgres,
            #[cfg(feature = "mysql")]
            DbPool::MySql(_) => Backend::MySql,
            #[cfg(feature = "sqlite")]
            DbPool::Sqlite(_) => Backend::Sqlite,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_from_scheme() {
        assert_eq!(Backend::from_url("postgres://localhost/test").unwrap(), Backend::Postgres);
        assert_eq!(Backend::from_url("postgresql://localhost/test").unwrap(), Backend::Postgres);
        assert_eq!(Backend::from_url("mysql://root@localhost/test").unwrap(), Backend::MySql);
        assert_eq!(Backend::from_url("MariaDB://root@localhost/test").unwrap(), Backend::MySql);
        assert_eq!(Backend::from_url("sqlite://x.db").unwrap(), Backend::Sqlite);
        assert_eq!(Backend::from_url("sqlite:x.db").unwrap(), Backend::Sqlite);
        for bad in ["", "localhost", "http://x", "redis://x"] {
            assert!(matches!(Backend::from_url(bad), Err(Error::InvalidUrl { .. })), "{bad}");
        }
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(redact("mysql://root:secret@db:3306/test"), "mysql://root:***@db:3306/test");
        assert_eq!(redact("mysql://root@db/test"), "mysql://root@db/test");
        assert_eq!(redact("postgres://u:p@h"), "postgres://u:***@h");
        assert_eq!(redact("sqlite://a.db"), "sqlite://a.db");
    }
}
