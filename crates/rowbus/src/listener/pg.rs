//! PostgreSQL: native LISTEN/NOTIFY on sqlx's `PgListener`; durable channels read the
//! notify table on the same connection, polled when LISTEN wakes them.

use std::sync::Arc;
use std::time::Duration;

use notify_table::{Notification, PG_DURABLE_MARK, Position};
use sqlx::postgres::{PgListener, PgNotification};

use super::driver::{Claimed, Control, Session, Wake};
use super::event::Event;
use super::options::ListenerOptions;
use super::table::TableSession;
use super::wake::{WakeCounters, WakePath};
use crate::error::Error;
use crate::sql::check_pg_channel;

/// One LISTEN connection. A plain channel is LISTEN's alone; a durable one is LISTENed
/// for its wake-ups (a durable notifier sends `pg_notify` with each row, its payload
/// behind [`PG_DURABLE_MARK`]) and read from the notify table by the core, which keeps its
/// position; a plain `pg_notify` on it, unmarked, is delivered as it comes, transient.
pub(crate) struct PgSession {
    table: TableSession<PgListener>,
}

/// The notification as sent: a durable notifier's without its mark.
fn notification(n: &PgNotification) -> Notification {
    let payload = n.payload();
    Notification {
        channel: n.channel().to_owned(),
        payload: payload.strip_prefix(PG_DURABLE_MARK).unwrap_or(payload).to_owned(),
        pid: u64::from(n.process_id()),
    }
}

impl Session for PgSession {
    async fn connect(url: &str, options: &ListenerOptions, wake: &Arc<WakeCounters>) -> Result<Self, Error> {
        let table = TableSession::open(url, options, wake, false).await?;
        wake.set(WakePath::Listen);
        Ok(PgSession { table })
    }

    async fn session_id(&mut self) -> Result<Option<u64>, Error> {
        self.table.session_id().await
    }

    async fn listen(&mut self, channel: &str) -> Result<(), Error> {
        check_pg_channel(channel)?;
        Ok(self.table.conn.listen(channel).await?)
    }

    /// LISTEN first: a notification committed after the mark is taken wakes a poll.
    async fn listen_table(&mut self, channel: &str) -> Result<(), Error> {
        self.listen(channel).await?;
        self.table.listen(channel).await
    }

    async fn unlisten(&mut self, channel: &str) -> Result<(), Error> {
        self.table.unlisten(channel).await?;
        Ok(self.table.conn.unlisten(channel).await?)
    }

    /// A durable channel resumes from its position in the notify table; a plain one
    /// listens afresh, and what was sent meanwhile may be gone.
    async fn resume(&mut self, channel: &str, position: Position) -> Result<bool, Error> {
        self.listen(channel).await?;
        self.table.resume(channel, position).await
    }

    fn position(&self, channel: &str) -> Option<Position> {
        self.table.position(channel)
    }

    async fn claim(
        &mut self,
        channel: &str,
        name: &str,
        token: i64,
        lease: Duration,
    ) -> Result<Claimed, Error> {
        self.table.claim(channel, name, token, lease).await
    }

    async fn store(
        &mut self,
        channel: &str,
        name: &str,
        token: i64,
        position: Option<&Position>,
    ) -> Result<bool, Error> {
        self.table.store(channel, name, token, position).await
    }

    async fn release(&mut self, channel: &str, name: &str, token: i64) -> Result<(), Error> {
        self.table.release(channel, name, token).await
    }

    /// Waits for LISTEN's notifications or, with durable channels, the poll interval (a
    /// fallback: gaps age and the cleanup runs even when nothing is sent). A durable
    /// notifier's wake-up on a durable channel polls the table at once (its payload is not
    /// delivered, the row is); a plain `pg_notify` on it is delivered as it is, transient.
    async fn next(&mut self, control: &mut Control) -> Result<Wake, Error> {
        let polling = self.table.is_polling();
        let received = tokio::select! {
            biased;
            command = control.commands.recv() => return Ok(Wake::Command(command)),
            received = self.table.conn.try_recv() => Some(received?),
            _ = self.table.ticker.tick(), if polling => None,
        };
        let mut batch = Vec::new();
        let mut poll = received.is_none();
        if let Some(received) = received {
            let Some(first) = received else {
                return Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the PostgreSQL listening connection was closed",
                ))));
            };
            let mut next = Some(first);
            while let Some(n) = next {
                if self.table.is_subscribed(n.channel()) {
                    if n.payload().starts_with(PG_DURABLE_MARK) {
                        poll = true;
                    } else {
                        batch.push(Event::Transient(notification(&n)));
                    }
                } else if control.channels.contains(n.channel()) {
                    // Notifications already on the wire for a channel unlistened since
                    // are dropped.
                    batch.push(Event::Notification(notification(&n)));
                }
                next = self.table.conn.next_buffered();
            }
        }
        if poll {
            match self.table.poll(control).await? {
                Wake::Notifications(read) => batch.extend(read),
                command => return Ok(command),
            }
        }
        Ok(Wake::Notifications(batch))
    }
}
