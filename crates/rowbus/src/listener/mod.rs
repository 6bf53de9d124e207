//! One listening API over PostgreSQL's LISTEN/NOTIFY and the notify table.

mod driver;
mod durable;
mod event;
mod options;
#[cfg(feature = "postgres")]
mod pg;
mod table;
mod wake;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::sync::{mpsc, oneshot, watch};

use crate::backend::{Backend, uses_pgbouncer};
use crate::error::Error;
use crate::names::check_durable_name;
use crate::sql::Db;
use crate::sql::ForBackend;
use driver::Command;
use driver::Driver as ListenerTask;
pub use durable::{DurableListener, durable_listeners, forget_durable_listener};
pub(crate) use event::Item;
pub use event::{Event, Resume};
pub use options::ListenerOptions;
#[cfg(feature = "postgres")]
use pg::PgSession;
use table::TableSession;
use wake::WakeCounters;
pub use wake::{WakePath, WakeStats};

/// How often a durable listener waiting for a name held by another tries to take it: a
/// name given up is taken this soon.
const WAIT_STEP: Duration = Duration::from_millis(200);
/// How much later than first seen an owner's lease may run out before the owner counts as
/// alive (it checked in): more than the round trips between two looks.
const OWNER_CHECKED_IN: Duration = Duration::from_millis(250);
/// How long past the owner's lease as first seen a waiting listener goes on trying.
const WAIT_GRACE: Duration = Duration::from_secs(1);

/// Listens for notifications on one dedicated connection: PostgreSQL's own LISTEN, or
/// the notify table on MySQL/MariaDB and SQLite, read when a push path reports a commit
/// (the binary log; a watch on SQLite's files) or, without one, every `poll_interval`
/// ([`wake_stats`](Self::wake_stats) says which).
///
/// A background task owns the connection; the `Listener` is its handle and stops it when
/// dropped. Notifications arrive in order through [`recv`](Self::recv) or as a
/// [`Stream`]. A lost connection is reported as [`Event::Disconnected`], then
/// reconnected, listened again and reported as [`Event::Reconnected`].
///
/// A *durable* listener ([`listen_durable`](Self::listen_durable); on PostgreSQL with
/// [`Notifier::durable`](crate::Notifier::durable) notifiers) keeps its position in the
/// database under a name, advanced by
/// [`ack`](Self::ack): a process restarted with the same name resumes after what it
/// acknowledged, and the notify table's cleanup keeps the rows it has not read.
///
/// ```no_run
/// # async fn f() -> Result<(), rowbus::Error> {
/// use rowbus::{Event, Listener};
/// use rowbus::durable::Resume;
/// let mut listener = Listener::connect("mysql://root@127.0.0.1/test").await?;
/// if listener.listen_durable("jobs", "mailer").await? == Resume::Gap {
///     // rows it had not read may have been cleaned up: resynchronise
/// }
/// while let Event::Notification(n) = listener.recv().await? {
///     println!("{}", n.payload);         // handle it, then:
///     listener.ack("jobs").await?;      // a restart resumes after it
/// }
/// # Ok(()) }
/// ```
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
    events: mpsc::Receiver<Item>,
    session: watch::Receiver<Option<u64>>,
    wake: Arc<WakeCounters>,
    task: tokio::task::JoinHandle<()>,
    /// Notifications received per durable channel.
    received: HashMap<String, u64>,
}

impl Listener {
    /// Connects a listener with the default options.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, ListenerOptions::default()).await
    }

    /// Connects a listener. Fails at once on a bad URL, an unreachable server or an
    /// invalid configuration; later connection losses are events, not errors. A URL
    /// through PgBouncer in transaction pooling mode (`pgbouncer=true`) is refused
    /// ([`Error::NeedsSession`]): LISTEN needs a session, give a direct URL.
    pub async fn connect_with(url: &str, options: ListenerOptions) -> Result<Self, Error> {
        let backend = Backend::from_url(url)?;
        if uses_pgbouncer(url)? {
            return Err(Error::NeedsSession { feature: "listening" });
        }
        options.notify_table.validate()?;
        let (commands_tx, commands) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::channel(options.buffer.max(1));
        let (session_tx, session) = watch::channel(None);
        let wake = Arc::new(WakeCounters::default());
        let task = ListenerTask::new(url.to_owned(), options, commands, events_tx, session_tx, wake.clone());
        let (start, check_channel) = backend.on(Start(task))?;
        let task = start.await?;
        Ok(Listener {
            backend,
            check_channel,
            commands: commands_tx,
            events,
            session,
            wake,
            task,
            received: HashMap::new(),
        })
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

    /// Starts listening on `channel` durably, under `name`: from the position stored
    /// under `(channel, name)` when there is one, so that nothing committed since is
    /// missed, and from now (storing that) when there is none. Acknowledge what was
    /// handled with [`ack`](Self::ack): a listener restarted with the same name resumes
    /// after it. Every notification committed is delivered at least once per name; again
    /// only one delivered but not acknowledged before a restart; a rolled-back one never.
    ///
    /// The name is this listener's while it checks in (every third of
    /// [`ListenerOptions::durable_lease`]). When another listener holds it, this one waits
    /// at most until that owner's lease runs out as it stands now (a crashed owner's
    /// name is taken once its lease has run out; one given up, at once), and is refused
    /// with [`Error::DurableNameTaken`] when the owner checked in meanwhile, still
    /// alive, or holds the name still when that time is up. Of several waiting for one
    /// name, one takes it and the others are refused. [`try_listen_durable`](Self::try_listen_durable)
    /// refuses at once instead. Needs the positions table, which deploying the notify
    /// table creates.
    ///
    /// On PostgreSQL the channel is read from the notify table as well, woken by LISTEN:
    /// deploy it with `rowbus deploy --durable`
    /// ([`DbPool::deploy_durable_notify_table`](crate::DbPool::deploy_durable_notify_table)),
    /// and send with a [`Notifier::durable`](crate::Notifier::durable) (`rowbus notify
    /// --durable`). A plain `pg_notify` on the channel, which has no row, is delivered while
    /// the listener is connected as [`Event::Transient`]: not acknowledged, not resumed.
    pub async fn listen_durable(&mut self, channel: &str, name: &str) -> Result<Resume, Error> {
        // When the owner's lease runs out as first seen.
        let mut deadline: Option<Instant> = None;
        loop {
            let (refused, expires_in) = match self.try_listen_durable(channel, name).await {
                Err(error @ Error::DurableNameTaken { expires_in, .. }) => (error, expires_in),
                other => return other,
            };
            let now = Instant::now();
            let runs_out = now + expires_in;
            let first = *deadline.get_or_insert(runs_out);
            // The owner checked in since (or another listener took the name): it lives.
            if runs_out > first + OWNER_CHECKED_IN || now > first + WAIT_GRACE {
                return Err(refused);
            }
            tracing::debug!(channel, name, ?expires_in, "waiting for the durable name's lease to run out");
            let wait = runs_out.saturating_duration_since(now).min(WAIT_STEP).max(Duration::from_millis(10));
            tokio::time::sleep(wait).await;
        }
    }

    /// [`listen_durable`](Self::listen_durable), refused at once with
    /// [`Error::DurableNameTaken`] (which says when the owner's lease runs out) when
    /// another listener holds the name.
    pub async fn try_listen_durable(&mut self, channel: &str, name: &str) -> Result<Resume, Error> {
        (self.check_channel)(channel)?;
        check_durable_name(name)?;
        let (reply, done) = oneshot::channel();
        let command = Command::ListenDurable { channel: channel.to_owned(), name: name.to_owned(), reply };
        self.commands.send(command).map_err(|_| Error::ListenerClosed)?;
        done.await.map_err(|_| Error::ListenerClosed)?
    }

    /// Acknowledges every notification on durable `channel` that this listener has
    /// returned so far; returns once the position after them is stored (after a
    /// reconnect, when the connection is lost meanwhile). A notification that arrived in
    /// the same poll as one not returned yet is stored with it, at its acknowledgement.
    pub async fn ack(&self, channel: &str) -> Result<(), Error> {
        let upto = self.received.get(channel).copied().unwrap_or(0);
        let (reply, done) = oneshot::channel();
        self.commands
            .send(Command::Ack { channel: channel.to_owned(), upto, reply })
            .map_err(|_| Error::ListenerClosed)?;
        done.await.map_err(|_| Error::ListenerClosed)?
    }

    /// Counts a durable channel's notification; `None` for bookkeeping items.
    fn received(&mut self, item: Item) -> Option<Event> {
        match item {
            Item::Event(event) => {
                if !self.received.is_empty()
                    && let Event::Notification(n) = &event
                    && let Some(count) = self.received.get_mut(&n.channel)
                {
                    *count += 1;
                }
                Some(event)
            }
            Item::Durable(channel) => {
                self.received.insert(channel, 0);
                None
            }
        }
    }

    /// A handle that listens and unlistens on this listener from elsewhere (another task),
    /// while this one receives.
    pub fn handle(&self) -> ListenerHandle {
        ListenerHandle {
            check_channel: self.check_channel,
            commands: self.commands.clone(),
            session: self.session.clone(),
            wake: self.wake.clone(),
        }
    }

    /// The next event, in order. Fails only when the listener's task has stopped.
    pub async fn recv(&mut self) -> Result<Event, Error> {
        loop {
            let item = self.events.recv().await.ok_or(Error::ListenerClosed)?;
            if let Some(event) = self.received(item) {
                return Ok(event);
            }
        }
    }

    /// How this listener learns of new notifications (LISTEN, a push path, or polling and
    /// why), and what that has cost so far: polls, pushed commits, `data_version` reads.
    pub fn wake_stats(&self) -> WakeStats {
        self.wake.snapshot()
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
    wake: Arc<WakeCounters>,
}

impl ListenerHandle {
    /// See [`Listener::wake_stats`].
    pub fn wake_stats(&self) -> WakeStats {
        self.wake.snapshot()
    }

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
        (start::<DB>(self.0), DB::check_channel)
    }
}

/// Connects a listener's first session on database `DB` and starts its task: PostgreSQL's
/// own LISTEN where the database has it, the notify table on its listen connection
/// otherwise.
fn start<DB: Db>(
    task: ListenerTask,
) -> futures::future::BoxFuture<'static, Result<tokio::task::JoinHandle<()>, Error>> {
    #[cfg(feature = "postgres")]
    if DB::NATIVE_LISTEN {
        return Box::pin(task.start::<PgSession>());
    }
    Box::pin(task.start::<TableSession<DB::ListenConn>>())
}

impl Stream for Listener {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        loop {
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(item)) => {
                    if let Some(event) = self.received(item) {
                        return Poll::Ready(Some(event));
                    }
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}
