//! One listening API over PostgreSQL's LISTEN/NOTIFY and the notify table.

mod driver;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
mod table;

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use notify_table::{Config, Notification};
use tokio::sync::{mpsc, oneshot, watch};

use crate::backend::{Backend, ForBackend};
use crate::db::Db;
use crate::error::Error;
use driver::Command;
pub(crate) use driver::Driver as ListenerTask;
#[cfg(feature = "postgres")]
pub(crate) use pg::PgSession;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) use table::{TableConn, TableSession};

/// How a [`Listener`] listens and reconnects.
#[derive(Debug, Clone)]
pub struct ListenerOptions {
    /// The notify table and its polling (MySQL/MariaDB and SQLite; unused on PostgreSQL).
    pub notify_table: Config,
    /// First wait before reconnecting after the connection was lost.
    pub reconnect_min: Duration,
    /// Longest wait between two reconnect attempts; the wait doubles up to it.
    pub reconnect_max: Duration,
    /// Events held for the caller before the listener stops reading from the server.
    pub buffer: usize,
}

impl Default for ListenerOptions {
    fn default() -> Self {
        ListenerOptions {
            notify_table: Config::default(),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            buffer: 4096,
        }
    }
}

/// What a [`Listener`] yields.
#[derive(Debug)]
pub enum Event {
    /// A notification on a channel this listener listens on.
    Notification(Notification),
    /// The connection was lost: notifications sent from now until [`Event::Reconnected`]
    /// are not delivered. The listener reconnects by itself with capped exponential
    /// backoff; resynchronise from the database after it has.
    Disconnected(Error),
    /// The listener has a new connection and listens again on every channel (with new
    /// marks, as a new PostgreSQL session would); what follows is delivered again.
    Reconnected,
}

/// Listens for notifications on one dedicated connection: PostgreSQL's own LISTEN, or
/// the notify table polled every `poll_interval` on MySQL/MariaDB and SQLite.
///
/// A background task owns the connection; the `Listener` is its handle and stops it when
/// dropped. Notifications arrive in order through [`recv`](Self::recv) or as a
/// [`Stream`]. A lost connection is reported as [`Event::Disconnected`], then
/// reconnected, listened again and reported as [`Event::Reconnected`].
///
/// ```no_run
/// # async fn f() -> Result<(), rowbus::Error> {
/// use futures::StreamExt;
/// let mut listener = rowbus::Listener::connect("mysql://root@127.0.0.1/test").await?;
/// listener.listen("jobs").await?;
/// while let Some(event) = listener.next().await {
///     println!("{event:?}");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Listener {
    backend: Backend,
    check_channel: fn(&str) -> Result<(), Error>,
    commands: mpsc::UnboundedSender<Command>,
    events: mpsc::Receiver<Event>,
    session: watch::Receiver<Option<u64>>,
    task: tokio::task::JoinHandle<()>,
}

impl Listener {
    /// Connects a listener with the default options.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, ListenerOptions::default()).await
    }

    /// Connects a listener. Fails at once on a bad URL, an unreachable server or an
    /// invalid configuration; later connection losses are events, not errors.
    pub async fn connect_with(url: &str, options: ListenerOptions) -> Result<Self, Error> {
        let backend = Backend::from_url(url)?;
        options.notify_table.validate()?;
        let (commands_tx, commands) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::channel(options.buffer.max(1));
        let (session_tx, session) = watch::channel(None);
        let task = ListenerTask::new(url.to_owned(), options, commands, events_tx, session_tx);
        let (start, check_channel) = backend.on(Start(task))?;
        let task = start.await?;
        Ok(Listener { backend, check_channel, commands: commands_tx, events, session, task })
    }

    /// Which database this listener listens on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Starts listening on `channel`; returns once the subscription is in effect (on the
    /// notify table: once the mark is taken), so anything committed afterwards is
    /// delivered. Listening on a channel twice is a no-op. While the connection is lost,
    /// waits until it is back.
    pub async fn listen(&self, channel: &str) -> Result<(), Error> {
        self.handle().listen(channel).await
    }

    /// Stops listening on `channel`. Rows of a poll already in flight for it are dropped.
    pub async fn unlisten(&self, channel: &str) -> Result<(), Error> {
        self.handle().unlisten(channel).await
    }

    /// A handle that listens and unlistens on this listener from elsewhere (another task),
    /// while this one receives.
    pub fn handle(&self) -> ListenerHandle {
        ListenerHandle {
            check_channel: self.check_channel,
            commands: self.commands.clone(),
            session: self.session.clone(),
        }
    }

    /// The next event, in order. Fails only when the listener's task has stopped.
    pub async fn recv(&mut self) -> Result<Event, Error> {
        self.events.recv().await.ok_or(Error::ListenerClosed)
    }

    /// The server's id of the listener's current session (`pg_backend_pid()`,
    /// `CONNECTION_ID()`); `None` on SQLite or while disconnected. For monitoring, or to
    /// terminate the session from an administrative connection.
    pub fn session_id(&self) -> Option<u64> {
        *self.session.borrow()
    }

    /// Waits until the listener has a session whose id differs from `previous`, and
    /// returns it (see [`session_id`](Self::session_id)).
    pub async fn wait_for_session(&mut self, previous: Option<u64>) -> Result<u64, Error> {
        let session = self
            .session
            .wait_for(|id| id.is_some() && *id != previous)
            .await
            .map_err(|_| Error::ListenerClosed)?;
        Ok(session.unwrap_or_default())
    }
}

/// Listens and unlistens on a [`Listener`] from another task; see [`Listener::handle`].
#[derive(Debug, Clone)]
pub struct ListenerHandle {
    check_channel: fn(&str) -> Result<(), Error>,
    commands: mpsc::UnboundedSender<Command>,
    session: watch::Receiver<Option<u64>>,
}

impl ListenerHandle {
    /// See [`Listener::session_id`].
    pub fn session_id(&self) -> Option<u64> {
        *self.session.borrow()
    }

    /// See [`Listener::listen`].
    pub async fn listen(&self, channel: &str) -> Result<(), Error> {
        (self.check_channel)(channel)?;
        let (reply, done) = oneshot::channel();
        self.commands
            .send(Command::Listen { channel: channel.to_owned(), reply })
            .map_err(|_| Error::ListenerClosed)?;
        done.await.map_err(|_| Error::ListenerClosed)?
    }

    /// See [`Listener::unlisten`].
    pub async fn unlisten(&self, channel: &str) -> Result<(), Error> {
        let (reply, done) = oneshot::channel();
        self.commands
            .send(Command::Unlisten { channel: channel.to_owned(), reply })
            .map_err(|_| Error::ListenerClosed)?;
        done.await.map_err(|_| Error::ListenerClosed)
    }
}

/// Starts a listener's task for the database of its URL; with the database's channel check.
struct Start(ListenerTask);

type Started = (
    futures::future::BoxFuture<'static, Result<tokio::task::JoinHandle<()>, Error>>,
    fn(&str) -> Result<(), Error>,
);

impl ForBackend for Start {
    type Output = Started;

    fn run<DB: Db>(self) -> Started {
        (DB::start_listener(self.0), DB::check_channel)
    }
}

impl Stream for Listener {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.events.poll_recv(cx)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}
