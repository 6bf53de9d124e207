//! The task behind a [`Listener`](super::Listener): one session at a time, commands,
//! events, and reconnecting with capped exponential backoff.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use notify_table::Notification;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use super::{Event, ListenerOptions};
use crate::error::Error;

/// What the handle asks of the task.
#[derive(Debug)]
pub(crate) enum Command {
    Listen { channel: String, reply: oneshot::Sender<Result<(), Error>> },
    Unlisten { channel: String, reply: oneshot::Sender<()> },
}

/// Why a session's wait ended.
pub(crate) enum Wake {
    Notifications(Vec<Notification>),
    /// A command to run on the session; `None` when the handle is gone.
    Command(Option<Command>),
}

/// The listener's bookkeeping that outlives a session.
pub(crate) struct Control {
    pub commands: mpsc::UnboundedReceiver<Command>,
    /// The channels listened on: what a new session listens on again.
    pub channels: BTreeSet<String>,
    /// Listens that wait for the session to be free (or back).
    pub deferred: Vec<(String, oneshot::Sender<Result<(), Error>>)>,
}

impl Control {
    /// Answers an unlisten at once: local bookkeeping.
    pub fn forget(&mut self, channel: &str) {
        self.channels.remove(channel);
    }
}

/// One connection, listening. Dropped with its connection.
pub(crate) trait Session: Sized + Send + 'static {
    fn connect(url: &str, options: &ListenerOptions) -> impl Future<Output = Result<Self, Error>> + Send;
    fn session_id(&mut self) -> impl Future<Output = Result<Option<u64>, Error>> + Send;
    /// Returns once the subscription is in effect.
    fn listen(&mut self, channel: &str) -> impl Future<Output = Result<(), Error>> + Send;
    fn unlisten(&mut self, channel: &str) -> impl Future<Output = Result<(), Error>> + Send;
    /// Waits for notifications or a command. An error means the session is lost.
    fn next(&mut self, control: &mut Control) -> impl Future<Output = Result<Wake, Error>> + Send;
}

pub struct Driver {
    url: String,
    options: ListenerOptions,
    control: Control,
    events: mpsc::Sender<Event>,
    session_id: watch::Sender<Option<u64>>,
}

impl Driver {
    pub(crate) fn new(
        url: String,
        options: ListenerOptions,
        commands: mpsc::UnboundedReceiver<Command>,
        events: mpsc::Sender<Event>,
        session_id: watch::Sender<Option<u64>>,
    ) -> Self {
        let control = Control { commands, channels: BTreeSet::new(), deferred: Vec::new() };
        Driver { url, options, control, events, session_id }
    }

    /// Connects the first session (its failure is the caller's) and spawns the task.
    pub(crate) async fn start<S: Session>(self) -> Result<tokio::task::JoinHandle<()>, Error> {
        let mut session = S::connect(&self.url, &self.options).await?;
        let id = session.session_id().await?;
        self.session_id.send_replace(id);
        Ok(tokio::spawn(self.run(session)))
    }

    async fn run<S: Session>(mut self, session: S) {
        let mut session = Some(session);
        loop {
            let Some(live) = session.as_mut() else {
                match self.reconnect::<S>().await {
                    Some(s) => session = Some(s),
                    None => return,
                }
                continue;
            };
            let outcome = match self.listen_deferred(live).await {
                Err(e) => Err(e),
                Ok(()) => match live.next(&mut self.control).await {
                    Ok(Wake::Notifications(batch)) => {
                        for n in batch {
                            if self.events.send(Event::Notification(n)).await.is_err() {
                                return;
                            }
                        }
                        Ok(())
                    }
                    Ok(Wake::Command(None)) => return,
                    Ok(Wake::Command(Some(command))) => self.command(live, command).await,
                    Err(e) => Err(e),
                },
            };
            if let Err(error) = outcome {
                warn!(%error, "listener connection lost; reconnecting");
                session = None;
                self.session_id.send_replace(None);
                if self.events.send(Event::Disconnected(error)).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Runs a command on a live session; an error means the session is lost.
    async fn command<S: Session>(&mut self, session: &mut S, command: Command) -> Result<(), Error> {
        match command {
            Command::Listen { channel, reply } => {
                self.control.deferred.push((channel, reply));
                self.listen_deferred(session).await
            }
            Command::Unlisten { channel, reply } => {
                self.control.forget(&channel);
                let result = session.unlisten(&channel).await;
                let _ = reply.send(());
                result
            }
        }
    }

    /// Listens on the channels waiting for it; a connection error keeps the rest (and the
    /// failed one) waiting for the next session, any other error goes to its caller.
    async fn listen_deferred<S: Session>(&mut self, session: &mut S) -> Result<(), Error> {
        while let Some((channel, reply)) = self.control.deferred.pop() {
            if self.control.channels.contains(&channel) {
                let _ = reply.send(Ok(()));
                continue;
            }
            match session.listen(&channel).await {
                Ok(()) => {
                    debug!(channel, "listening");
                    self.control.channels.insert(channel);
                    let _ = reply.send(Ok(()));
                }
                Err(e) if e.is_connection_error() => {
                    self.control.deferred.push((channel, reply));
                    return Err(e);
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        Ok(())
    }

    /// Connects a new session and listens again on every channel, waiting with capped
    /// exponential backoff between attempts. `None` when the handle went away.
    async fn reconnect<S: Session>(&mut self) -> Option<S> {
        let mut delay = self.options.reconnect_min;
        loop {
            if !self.wait_disconnected(delay).await {
                return None;
            }
            delay = (delay * 2).min(self.options.reconnect_max);
            match self.resume::<S>().await {
                Ok(session) => {
                    info!(channels = self.control.channels.len(), "listener reconnected");
                    if self.events.send(Event::Reconnected).await.is_err() {
                        return None;
                    }
                    return Some(session);
                }
                Err(error) => warn!(%error, retry_in = ?delay, "listener reconnect failed"),
            }
        }
    }

    async fn resume<S: Session>(&mut self) -> Result<S, Error> {
        let mut session = S::connect(&self.url, &self.options).await?;
        for channel in &self.control.channels {
            session.listen(channel).await?;
        }
        let id = session.session_id().await?;
        self.session_id.send_replace(id);
        Ok(session)
    }

    /// Waits `delay` with no session, answering what can be answered without one.
    /// `false` when the handle went away.
    async fn wait_disconnected(&mut self, delay: Duration) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => return true,
                command = self.control.commands.recv() => match command {
                    None => return false,
                    Some(Command::Unlisten { channel, reply }) => {
                        self.control.forget(&channel);
                        // A listen still waiting for the session is answered and undone.
                        for (_, waiting) in self.control.deferred.extract_if(.., |(c, _)| *c == channel) {
                            let _ = waiting.send(Ok(()));
                        }
                        let _ = reply.send(());
                    }
                    Some(Command::Listen { channel, reply }) => self.control.deferred.push((channel, reply)),
                },
            }
        }
    }
}
