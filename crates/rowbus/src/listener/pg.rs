//! PostgreSQL: native LISTEN/NOTIFY on sqlx's `PgListener`.

use std::time::Duration;

use notify_table::{Notification, Position};
use sqlx::postgres::{PgListener, PgNotification};

use super::ListenerOptions;
use super::driver::{Claimed, Control, Session, Wake};
use crate::backend::redact;
use crate::error::Error;
use crate::notify::check_pg_channel;
use crate::sql::postgres::first_host;

pub(crate) struct PgSession {
    listener: PgListener,
}

fn notification(n: PgNotification) -> Notification {
    Notification {
        channel: n.channel().to_owned(),
        payload: n.payload().to_owned(),
        pid: u64::from(n.process_id()),
    }
}

impl Session for PgSession {
    async fn connect(url: &str, _: &ListenerOptions) -> Result<Self, Error> {
        // PgListener connects through a pool, which retries a refused connection until its
        // acquire timeout and then reports only the timeout: a direct connection to each
        // host first fails fast, with the real cause, and picks the host. Every reconnect
        // comes here, so it goes through the host list again.
        let host = first_host(url).await?;
        let mut listener = PgListener::connect(&host)
            .await
            .map_err(|source| Error::Connect { target: redact(&host), source })?;
        // A lost connection ends this session; the driver reconnects and reports it.
        listener.eager_reconnect(false);
        Ok(PgSession { listener })
    }

    async fn session_id(&mut self) -> Result<Option<u64>, Error> {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut self.listener).await?;
        Ok(u64::try_from(pid).ok())
    }

    async fn listen(&mut self, channel: &str) -> Result<(), Error> {
        check_pg_channel(channel)?;
        Ok(self.listener.listen(channel).await?)
    }

    async fn unlisten(&mut self, channel: &str) -> Result<(), Error> {
        Ok(self.listener.unlisten(channel).await?)
    }

    /// LISTEN keeps no position: a new session listens from now on, and what was sent
    /// meanwhile may be gone.
    async fn resume(&mut self, channel: &str, _: Position) -> Result<bool, Error> {
        self.listen(channel).await.map(|()| true)
    }

    fn position(&self, _: &str) -> Option<Position> {
        None
    }

    async fn claim(&mut self, _: &str, _: &str, _: i64, _: Duration) -> Result<Claimed, Error> {
        Err(Error::DurableUnsupported)
    }

    async fn store(&mut self, _: &str, _: &str, _: i64, _: Option<&Position>) -> Result<bool, Error> {
        Err(Error::DurableUnsupported)
    }

    async fn release(&mut self, _: &str, _: &str, _: i64) -> Result<(), Error> {
        Err(Error::DurableUnsupported)
    }

    async fn next(&mut self, control: &mut Control) -> Result<Wake, Error> {
        let received = tokio::select! {
            biased;
            command = control.commands.recv() => return Ok(Wake::Command(command)),
            received = self.listener.try_recv() => received?,
        };
        let Some(first) = received else {
            return Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the PostgreSQL listening connection was closed",
            ))));
        };
        let mut batch = vec![notification(first)];
        while let Some(n) = self.listener.next_buffered() {
            batch.push(notification(n));
        }
        // Notifications already on the wire for a channel unlistened since are dropped.
        batch.retain(|n| control.channels.contains(&n.channel));
        Ok(Wake::Notifications(batch))
    }
}
