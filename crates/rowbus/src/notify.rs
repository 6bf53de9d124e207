//! Sending notifications, on any executor of any of the three databases.

use std::future::Future;

use notify_table::NotifyTable;
use sqlx::{Executor, Pool};

use crate::driver::args_of;
use crate::error::{Error, is_missing_table};
use crate::sql::{Db, Notifier};
use crate::sql::{DbPool, OnPool};

impl Notifier {
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
