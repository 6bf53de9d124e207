//! The three databases rowbus speaks, and the one place a database named at run time
//! (by a URL, or by the pool it gave) becomes a type.

use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database};

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
        let backend = match scheme.as_deref() {
            Some("postgres" | "postgresql") => Backend::Postgres,
            Some("mysql" | "mariadb") => Backend::MySql,
            Some("sqlite") => Backend::Sqlite,
            _ => {
                return Err(Error::InvalidUrl {
                    url: redact(url),
                    reason: "expected a postgres://, mysql://, mariadb:// or sqlite: URL".into(),
                });
            }
        };
        if backend != Backend::Postgres && through_pgbouncer(url)?.1 {
            return Err(Error::InvalidUrl {
                url: redact(url),
                reason: format!("{PGBOUNCER}=true is for PostgreSQL URLs (PgBouncer pools PostgreSQL only)"),
            });
        }
        Ok(backend)
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

/// The query parameter that says a PostgreSQL URL goes through PgBouncer in transaction
/// pooling mode (`?pgbouncer=true`, as Prisma spells it): no named prepared statements, and
/// no session of its own for LISTEN.
pub const PGBOUNCER: &str = "pgbouncer";

/// Whether `url` says it goes through PgBouncer in transaction pooling mode
/// (`pgbouncer=true`): what needs a session of its own (listening) must then be given
/// another, direct URL.
///
/// ```
/// assert!(rowbus::uses_pgbouncer("postgres://app@bouncer:6432/app?pgbouncer=true").unwrap());
/// assert!(!rowbus::uses_pgbouncer("postgres://app@db:5432/app").unwrap());
/// ```
pub fn uses_pgbouncer(url: &str) -> Result<bool, Error> {
    Ok(through_pgbouncer(url)?.1)
}

/// `url` without its [`PGBOUNCER`] parameter, and whether that said `true` (`false`, or
/// none, is a direct connection). Any other value is refused.
pub(crate) fn through_pgbouncer(url: &str) -> Result<(String, bool), Error> {
    let Some((base, query)) = url.split_once('?') else { return Ok((url.to_owned(), false)) };
    let mut pooled = false;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((PGBOUNCER, value)) => {
                pooled = match value.to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(Error::InvalidUrl {
                            url: redact(url),
                            reason: format!("{PGBOUNCER}={value}: rowbus takes `true` or `false`"),
                        });
                    }
                }
            }
            _ if pair == PGBOUNCER => {
                return Err(Error::InvalidUrl {
                    url: redact(url),
                    reason: format!("{PGBOUNCER} without a value: write {PGBOUNCER}=true"),
                });
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((url, pooled))
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

/// A connection pool on any of the three databases, set up the way rowbus needs it
/// (strict `sql_mode` and READ COMMITTED on MySQL/MariaDB, WAL and a busy timeout on
/// SQLite). Run code written for any [`Db`](crate::Db) on it with [`run`](Self::run).
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
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(sqlx::PgPool),
    /// A MySQL/MariaDB pool.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    MySql(sqlx::MySqlPool),
    /// A SQLite pool.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(sqlx::SqlitePool),
}

impl DbPool {
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
    fn the_pgbouncer_parameter_is_taken_out() {
        let pooled = |url| through_pgbouncer(url).unwrap();
        assert_eq!(pooled("postgres://h:6432/db?pgbouncer=true"), ("postgres://h:6432/db".into(), true));
        assert_eq!(
            pooled("postgres://h/db?sslmode=disable&pgbouncer=TRUE&application_name=x"),
            ("postgres://h/db?sslmode=disable&application_name=x".into(), true)
        );
        assert_eq!(pooled("postgres://h/db?pgbouncer=false"), ("postgres://h/db".into(), false));
        assert_eq!(
            pooled("postgres://h/db?sslmode=disable"),
            ("postgres://h/db?sslmode=disable".into(), false)
        );
        assert_eq!(pooled("postgres://h/db"), ("postgres://h/db".into(), false));
        for bad in
            ["postgres://h/db?pgbouncer=yes", "postgres://h/db?pgbouncer", "postgres://h/db?pgbouncer="]
        {
            assert!(matches!(through_pgbouncer(bad), Err(Error::InvalidUrl { .. })), "{bad}");
        }
        assert!(Backend::from_url("postgres://h/db?pgbouncer=true").is_ok());
        for other in ["mysql://root@h/test?pgbouncer=true", "sqlite://x.db?pgbouncer=true"] {
            assert!(matches!(Backend::from_url(other), Err(Error::InvalidUrl { .. })), "{other}");
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
