//! Waking and notifying: the statement that sends a notification, the notify table's
//! statements where a database has one, and the wake-ups a publish sends to other
//! processes' subscriptions.

use std::sync::OnceLock;

use futures::future::BoxFuture;

use notify_table::{Config, NotifyTable, Statement};

use super::Naming;
use crate::driver::args_of;
use crate::error::Error;

/// How a notification is sent and other processes are woken.
pub trait Waking: Naming {
    /// Refuses a channel name this database cannot listen on.
    fn check_channel(channel: &str) -> Result<(), Error>;

    /// The statement that sends `payload` on `channel`.
    fn notify_sql(notifier: &Notifier, channel: &str, payload: &str) -> Result<Statement, Error>;

    /// The notify table's statements, if this database uses one.
    fn notify_table(notifier: &Notifier) -> Option<&NotifyTable>;

    /// Wakes other processes' subscriptions of `channel` and `groups`: a notification
    /// per group, sent on `conn`. A failure is logged: the poll interval still reaches
    /// the rows.
    fn wake<'c>(
        conn: &'c mut Self::Connection,
        notifier: &'c Notifier,
        channel: &'c str,
        groups: &'c [String],
    ) -> BoxFuture<'c, ()> {
        Box::pin(async move {
            for group in groups {
                let sent = match Self::notify_sql(notifier, channel, group) {
                    Ok(stmt) => {
                        Self::execute(conn, &stmt.sql, &args_of(&stmt)).await.map(drop).map_err(Error::from)
                    }
                    Err(e) => Err(e),
                };
                if let Err(error) = sent {
                    tracing::warn!(%error, table = channel, group, "wake-up notification failed; subscriptions elsewhere wait for their poll interval");
                }
            }
        })
    }

    /// Whether other processes' wake-ups go out apart from the rows they announce: after
    /// the rows committed, from the broker's wake-up sender, several in one statement
    /// ([`wakes_sql`](Self::wakes_sql)). PostgreSQL's NOTIFY takes a server-wide lock at
    /// commit, so that notifying transactions commit one at a time. Where it is false, a
    /// wake-up is a notify-table row written right after the rows on their connection (in
    /// their transaction when there is one, which is what makes it exact;
    /// [`wake`](Self::wake)).
    const WAKES_APART: bool = false;

    /// The statement that sends `pairs` wake-ups at once, each bound as (channel, group),
    /// where [`WAKES_APART`](Self::WAKES_APART).
    fn wakes_sql(_pairs: usize) -> Option<String> {
        None
    }

    /// Refuses a wake-up this database could not send, before it joins a statement with
    /// others.
    fn check_wake(channel: &str, _group: &str) -> Result<(), Error> {
        Self::check_channel(channel)
    }
}

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
/// listeners, and `pg_notify`, which wakes them and reaches plain LISTENers too (its
/// payload behind [`PG_DURABLE_MARK`](notify_table::PG_DURABLE_MARK), which a rowbus
/// [`Listener`](crate::Listener) drops).
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
    /// [`DbPool::deploy_durable_notify_table`](super::DbPool::deploy_durable_notify_table) or `rowbus deploy --durable`), written in
    /// the caller's transaction, so that durable listeners
    /// ([`Listener::listen_durable`](crate::Listener::listen_durable)) miss nothing sent
    /// while they were away; the `pg_notify` it sends as well wakes them at once. Plain
    /// rowbus LISTENers get the notification as from [`new`](Self::new) (other programs'
    /// LISTENers see the payload behind [`PG_DURABLE_MARK`](notify_table::PG_DURABLE_MARK)),
    /// and its payload may be 8 bytes shorter. On MySQL/MariaDB and
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
}
