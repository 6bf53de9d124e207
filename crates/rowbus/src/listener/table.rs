//! MySQL/MariaDB and SQLite: the notify-table core driven on one connection (each
//! database's [`TableConn`] is in its `crate::sql` module).

use std::future::Future;

use notify_table::{Dialect, NotifyTable, Row, Statement};
use tokio::time::{Interval, MissedTickBehavior};
use tracing::{debug, warn};

use super::ListenerOptions;
use super::driver::{Command, Control, Session, Wake};
use crate::error::{Error, is_missing_table};
use crate::notify::missing;

/// A connection the notify-table core can run its statements on.
pub(crate) trait TableConn: Send + Sized + 'static {
    fn dialect() -> Dialect;
    fn open(url: &str) -> impl Future<Output = Result<Self, Error>> + Send;
    fn session_id(&mut self) -> impl Future<Output = Result<Option<u64>, Error>> + Send;
    fn fetch(&mut self, stmt: &Statement) -> impl Future<Output = Result<Vec<Row>, sqlx::Error>> + Send;
    fn execute(&mut self, stmt: &Statement) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    /// The first column of every row, as ids.
    fn fetch_ids(&mut self, stmt: &Statement) -> impl Future<Output = Result<Vec<u64>, sqlx::Error>> + Send;
}

/// One listen connection and its own core object: a new connection starts a new core,
/// with new marks, as a new PostgreSQL session would.
pub(crate) struct TableSession<C> {
    conn: C,
    table: NotifyTable,
    ticker: Interval,
}

/// Awaits `statement` while answering the listener's commands: an unlisten is bookkeeping
/// and takes effect on the rows in flight; a listen waits for the connection. `None` when
/// the handle is gone.
async fn answering<T>(
    statement: impl std::future::Future<Output = T>,
    table: &mut NotifyTable,
    control: &mut Control,
) -> Option<T> {
    tokio::pin!(statement);
    loop {
        tokio::select! {
            biased;
            done = &mut statement => return Some(done),
            command = control.commands.recv() => match command {
                Some(Command::Unlisten { channel, reply }) => {
                    table.unsubscribe(&channel);
                    control.forget(&channel);
                    let _ = reply.send(());
                }
                Some(Command::Listen { channel, reply }) => control.deferred.push((channel, reply)),
                None => return None,
            },
        }
    }
}

impl<C: TableConn> Session for TableSession<C> {
    async fn connect(url: &str, options: &ListenerOptions) -> Result<Self, Error> {
        let table = NotifyTable::new(options.notify_table.clone(), C::dialect())?;
        let conn = C::open(url).await?;
        let mut ticker = tokio::time::interval(table.config().poll_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ok(TableSession { conn, table, ticker })
    }

    async fn session_id(&mut self) -> Result<Option<u64>, Error> {
        self.conn.session_id().await
    }

    async fn listen(&mut self, channel: &str) -> Result<(), Error> {
        let stmt = self.table.subscribe_sql(channel)?;
        let rows = match self.conn.fetch(&stmt).await {
            Ok(rows) => rows,
            Err(e) if is_missing_table(&e) => return Err(missing(&self.table)),
            Err(e) => return Err(e.into()),
        };
        Ok(self.table.subscribed(channel, rows)?)
    }

    async fn unlisten(&mut self, channel: &str) -> Result<(), Error> {
        self.table.unsubscribe(channel);
        Ok(())
    }

    async fn next(&mut self, control: &mut Control) -> Result<Wake, Error> {
        tokio::select! {
            biased;
            command = control.commands.recv() => return Ok(Wake::Command(command)),
            _ = self.ticker.tick() => {}
        }
        let Some((stmt, token)) = self.table.poll_sql() else {
            return Ok(Wake::Notifications(Vec::new()));
        };
        let Some(rows) = answering(self.conn.fetch(&stmt), &mut self.table, control).await else {
            return Ok(Wake::Command(None));
        };
        let notifications = self.table.polled(token, rows?)?;
        if let Some(select) = self.table.cleanup_sql() {
            // The cleanup, too, answers commands while it waits (a table lock stalls it).
            let deleted = match answering(self.conn.fetch_ids(&select), &mut self.table, control).await {
                Some(Ok(expired)) => match self.table.delete_sql(&expired) {
                    Some(delete) => answering(self.conn.execute(&delete), &mut self.table, control).await,
                    None => Some(Ok(0)),
                },
                other => other.map(|result| result.map(|_| 0)),
            };
            match deleted {
                Some(Ok(deleted)) => {
                    debug!(deleted, "notify table cleanup");
                    self.table.cleaned(Some(deleted));
                }
                Some(Err(error)) => {
                    warn!(%error, "notify table cleanup failed; retrying in a minute of polling");
                    self.table.cleaned(None);
                }
                // The handle is gone: deliver what was polled; the next wait ends the task.
                None => {}
            }
        }
        Ok(Wake::Notifications(notifications))
    }
}
