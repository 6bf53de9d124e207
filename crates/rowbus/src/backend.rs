//! The three databases rowbus speaks, and how it connects to each.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
};
use sqlx::{ConnectOptions, Connection, Executor};

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

fn invalid(url: &str, e: sqlx::Error) -> Error {
    Error::InvalidUrl { url: redact(url), reason: e.to_string() }
}

fn connect_error(url: &str) -> impl FnOnce(sqlx::Error) -> Error + '_ {
    move |source| Error::Connect { target: redact(url), source }
}

/// Strict mode, so the server refuses an over-long value rather than truncating it, and
/// READ COMMITTED, which claims with `SKIP LOCKED` want.
const MYSQL_SESSION: [&str; 2] = [
    "SET SESSION sql_mode = TRIM(BOTH ',' FROM CONCAT(@@SESSION.sql_mode, ',STRICT_ALL_TABLES'))",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
];

async fn mysql_session(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    for statement in MYSQL_SESSION {
        conn.execute(statement).await?;
    }
    Ok(())
}

pub(crate) fn mysql_options(url: &str) -> Result<MySqlConnectOptions, Error> {
    let url = match url.strip_prefix("mariadb:") {
        Some(rest) => format!("mysql:{rest}"),
        None => url.to_owned(),
    };
    MySqlConnectOptions::from_str(&url).map_err(|e| invalid(&url, e))
}

pub(crate) fn sqlite_options(url: &str) -> Result<SqliteConnectOptions, Error> {
    // sqlx leaves the journal mode alone: WAL lets readers run beside the one writer.
    Ok(SqliteConnectOptions::from_str(url)
        .map_err(|e| invalid(url, e))?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10)))
}

/// One MySQL/MariaDB connection in rowbus's session settings.
pub(crate) async fn connect_mysql(url: &str) -> Result<MySqlConnection, Error> {
    let mut conn = mysql_options(url)?.connect().await.map_err(connect_error(url))?;
    mysql_session(&mut conn).await.map_err(connect_error(url))?;
    Ok(conn)
}

/// One SQLite connection (the file is created if missing).
pub(crate) async fn connect_sqlite(url: &str) -> Result<SqliteConnection, Error> {
    SqliteConnection::connect_with(&sqlite_options(url)?).await.map_err(connect_error(url))
}

/// A connection pool on any of the three databases, set up the way rowbus needs it
/// (strict `sql_mode` and READ COMMITTED on MySQL/MariaDB, WAL and a busy timeout on
/// SQLite).
///
/// ```no_run
/// # async fn f() -> Result<(), rowbus::Error> {
/// let db = rowbus::DbPool::connect("sqlite://app.sqlite").await?;
/// db.deploy_notify_table(&rowbus::NotifyConfig::default()).await?;
/// db.notify("jobs", "wake up").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub enum DbPool {
    /// A PostgreSQL pool.
    Postgres(PgPool),
    /// A MySQL/MariaDB pool.
    MySql(MySqlPool),
    /// A SQLite pool.
    Sqlite(SqlitePool),
}

impl DbPool {
    /// Connects a pool of up to 8 connections (4 on SQLite) and checks that one works.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with_size(url, 8).await
    }

    /// Connects a pool of up to `max` connections and checks that one works.
    pub async fn connect_with_size(url: &str, max: u32) -> Result<Self, Error> {
        // A pool retries a refused connection until its acquire timeout and then reports
        // only the timeout: one direct connection first fails fast, with the real cause.
        let on_err = connect_error(url);
        let acquire = Duration::from_secs(10);
        Ok(match Backend::from_url(url)? {
            Backend::Postgres => {
                let options = PgConnectOptions::from_str(url).map_err(|e| invalid(url, e))?;
                options
                    .connect()
                    .await
                    .map_err(connect_error(url))?
                    .close()
                    .await
                    .map_err(connect_error(url))?;
                let pool = PgPoolOptions::new().max_connections(max).acquire_timeout(acquire);
                DbPool::Postgres(pool.connect_with(options).await.map_err(on_err)?)
            }
            Backend::MySql => {
                connect_mysql(url).await?.close().await.map_err(connect_error(url))?;
                let pool = MySqlPoolOptions::new()
                    .max_connections(max)
                    .acquire_timeout(acquire)
                    .after_connect(|conn, _| Box::pin(mysql_session(conn)));
                DbPool::MySql(pool.connect_with(mysql_options(url)?).await.map_err(on_err)?)
            }
            Backend::Sqlite => {
                let pool = SqlitePoolOptions::new().max_connections(max.min(4)).acquire_timeout(acquire);
                DbPool::Sqlite(pool.connect_with(sqlite_options(url)?).await.map_err(on_err)?)
            }
        })
    }

    /// Which database this pool talks to.
    pub fn backend(&self) -> Backend {
        match self {
            DbPool::Postgres(_) => Backend::Postgres,
            DbPool::MySql(_) => Backend::MySql,
            DbPool::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// Closes every connection of the pool.
    pub async fn close(&self) {
        match self {
            DbPool::Postgres(pool) => pool.close().await,
            DbPool::MySql(pool) => pool.close().await,
            DbPool::Sqlite(pool) => pool.close().await,
        }
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
