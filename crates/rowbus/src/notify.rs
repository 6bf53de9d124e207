//! Sending notifications, on any executor of any of the three databases.

use std::future::Future;
use std::sync::OnceLock;

use notify_table::{Config, NotifyTable};
use sqlx::{Executor, Pool};

use crate::backend::{DbPool, OnPool};
use crate::db::{Db, args_of};
use crate::error::{Error, is_missing_table};

/// Longest PostgreSQL channel name in bytes (an identifier: `NAMEDATALEN - 1`).
pub const PG_MAX_CHANNEL_BYTES: usize = 63;
/// PostgreSQL payloads must be shorter than this many bytes.
pub const PG_PAYLOAD_LIMIT_BYTES: usize = 8000;

/// Checks a channel name against PostgreSQL's limits before the server sees it.
pub fn check_pg_channel(channel: &str) -> Result<(), Error> {
    if channel.is_empty() {
        return Err(Error::PgChannelEmpty);
    }
    if channel.len() > PG_MAX_CHANNEL_BYTES {
        return Err(Error::PgChannelTooLong { channel: channel.to_owned(), bytes: channel.len() });
    }
    Ok(())
}

/// Checks a payload against PostgreSQL's limit before the server sees it.
pub fn check_pg_payload(payload: &str) -> Result<(), Error> {
    if payload.len() >= PG_PAYLOAD_LIMIT_BYTES {
        return Err(Error::PgPayloadTooLarge { bytes: payload.len() });
    }
    Ok(())
}

/// Sends notifications: `pg_notify` on PostgreSQL, an INSERT into the notify table on
/// MySQL/MariaDB and SQLite. Limits are checked before anything reaches the server.
///
/// On PostgreSQL a [`durable`](Self::durable) notifier does both: the row, for durable
/// listeners, and `pg_notify`, which wakes them and reaches plain LISTENers as before.
///
/// Run it inside a transaction to have the notification delivered when that
/// transaction commits, and never if it rolls back.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool) -> Result<(), rowbus::Error> {
/// use rowbus::{NotifyConfig, Notifier};
/// let notifier = Notifier::new(NotifyConfig { table: "app_notify".into(), ..Default::default() })?;
/// let mut tx = pool.begin().await?;
/// notifier.notify(&mut *tx, "jobs", "42").await?;
/// tx.commit().await?; // delivered now
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Notifier {
    /// The notify-table core in MySQL's dialect.
    #[cfg(feature = "mysql")]
    pub(crate) mysql: NotifyTable,
    /// The notify-table core in SQLite's dialect.
    #[cfg(feature = "sqlite")]
    pub(crate) sqlite: NotifyTable,
    /// The notify-table core in PostgreSQL's dialect, in durable mode only.
    #[cfg(feature = "postgres")]
    pub(crate) postgres: Option<NotifyTable>,
    /// The configuration, checked.
    config: Config,
}

impl Notifier {
    /// A notifier writing to the notify table `config` names.
    pub fn new(config: Config) -> Result<Self, Error> {
        config.validate()?;
        Ok(Notifier {
            #[cfg(feature = "mysql")]
            mysql: NotifyTable::new(config.clone(), notify_table::Dialect::MySql)?,
            #[cfg(feature = "sqlite")]
            sqlite: NotifyTable::new(
                config.clone(),
                notify_table::Dialect::Sqlite { pid: std::process::id() },
            )?,
            #[cfg(feature = "postgres")]
            postgres: None,
            config,
        })
    }

    /// A notifier in PostgreSQL's durable mode: each notification is also a row of the
    /// notify table `config` names (deploy it with
    /// [`DbPool::deploy_durable_notify_table`] or `rowbus deploy --durable`), written in
    /// the caller's transaction, so that durable listeners
    /// ([`Listener::listen_durable`](crate::Listener::listen_durable)) miss nothing sent
    /// while they were away; the `pg_notify` it sends as well wakes them at once. Plain
    /// LISTENers get the notification as from [`new`](Self::new). On MySQL/MariaDB and
    /// SQLite every notifier writes the row: the same as `new`.
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), rowbus::Error> {
    /// let notifier = rowbus::Notifier::durable(rowbus::NotifyConfig::default())?;
    /// let mut tx = pool.begin().await?;
    /// notifier.notify(&mut *tx, "jobs", "42").await?;
    /// tx.commit().await?; // a durable listener named "mailer" gets it, even after a restart
    /// # Ok(()) }
    /// ```
    pub fn durable(config: Config) -> Result<Self, Error> {
        #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
        let mut notifier = Self::new(config)?;
        #[cfg(feature = "postgres")]
        {
            notifier.postgres =
                Some(NotifyTable::new(notifier.config.clone(), notify_table::Dialect::Postgres)?);
        }
        Ok(notifier)
    }

    /// The notify table's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The notifier for the default notify table (`rowbus_notify`).
    pub fn default_table() -> &'static Notifier {
        static DEFAULT: OnceLock<Notifier> = OnceLock::new();
        DEFAULT.get_or_init(|| Notifier::new(Config::default()).expect("the default configuration is valid"))
    }

    /// Sends `payload` on `channel` through `executor`: a pool, a connection, or a
    /// transaction (`&mut *tx`).
    pub fn notify<'c, E>(
        &self,
        executor: E,
        channel: &str,
        payload: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'c
    where
        E: Executor<'c> + 'c,
        E::Database: Db,
    {
        notify_on(self, executor, channel, payload)
    }
}

/// Sends `payload` on `channel` through `executor` (a pool, a connection, or `&mut *tx`
/// to have it delivered on commit), using the default notify table on MySQL/MariaDB
/// and SQLite.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), rowbus::Error> {
/// rowbus::notify(&pool, "jobs", "wake up").await?;
/// # Ok(()) }
/// ```
pub fn notify<'c, E>(
    executor: E,
    channel: &str,
    payload: &str,
) -> impl Future<Output = Result<(), Error>> + Send + 'c
where
    E: Executor<'c> + 'c,
    E::Database: Db,
{
    Notifier::default_table().notify(executor, channel, payload)
}

impl DbPool {
    /// Sends a notification on the default notify table (see [`notify`]).
    pub async fn notify(&self, channel: &str, payload: &str) -> Result<(), Error> {
        self.notify_with(Notifier::default_table(), channel, payload).await
    }

    /// Sends a notification with `notifier`.
    pub async fn notify_with(&self, notifier: &Notifier, channel: &str, payload: &str) -> Result<(), Error> {
        struct Send<'a>(&'a Notifier, &'a str, &'a str);
        impl OnPool for Send<'_> {
            type Output = Result<(), Error>;
            async fn run<DB: Db>(self, pool: Pool<DB>) -> Self::Output {
                let stmt = DB::notify_sql(self.0, self.1, self.2)?;
                let mut conn = pool.acquire().await?;
                let sent = DB::execute(&mut conn, &stmt.sql, &args_of(&stmt)).await;
                sent.map(drop).map_err(|e| failed(DB::notify_table(self.0).map(missing), e))
            }
        }
        self.run(Send(notifier, channel, payload)).await
    }
}

/// Checks the notification and builds its statement at once; the future it returns holds
/// only the driver's boxed (`Send`) future. An `async fn` generic over the executor would
/// carry its higher-ranked `Executor` bound into its future, which the compiler then
/// cannot prove `Send`: a spawned task that notified in a transaction did not compile.
fn notify_on<'c, DB, E>(
    notifier: &Notifier,
    executor: E,
    channel: &str,
    payload: &str,
) -> impl Future<Output = Result<(), Error>> + Send + 'c
where
    DB: Db,
    E: Executor<'c, Database = DB> + 'c,
{
    let sent = DB::notify_sql(notifier, channel, payload).map(|stmt| executor.execute(DB::statement(&stmt)));
    // Built now: the future must not borrow the notifier.
    let missing_table = DB::notify_table(notifier).map(missing);
    async move { sent?.await.map(drop).map_err(|e| failed(missing_table, e)) }
}

/// A notification's failure: the notify table's own error when the driver says it is
/// missing (`missing_table`, where the database uses one).
fn failed(missing_table: Option<Error>, e: sqlx::Error) -> Error {
    match missing_table {
        Some(missing) if is_missing_table(&e) => missing,
        _ => Error::Database(e),
    }
}

pub(crate) fn missing(table: &NotifyTable) -> Error {
    Error::MissingNotifyTable { table: table.config().table.clone() }
}
