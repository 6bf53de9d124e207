//! The task behind a [`Listener`](super::Listener): one session at a time, commands,
//! events, reconnecting with capped exponential backoff and resuming where it was.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use notify_table::Position;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use super::event::{Event, Item, Resume};
use super::options::ListenerOptions;
use super::wake::WakeCounters;
use crate::error::Error;

/// What the handle asks of the task.
#[derive(Debug)]
pub(crate) enum Command {
    Listen {
        channel: String,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    ListenDurable {
        channel: String,
        name: String,
        reply: oneshot::Sender<Result<Resume, Error>>,
    },
    Unlisten {
        channel: String,
        reply: oneshot::Sender<()>,
    },
    /// The caller has received `upto` notifications on the durable channel.
    Ack {
        channel: String,
        upto: u64,
        reply: oneshot::Sender<Result<(), Error>>,
    },
}

/// Why a session's wait ended.
pub(crate) enum Wake {
    /// [`Event::Notification`]s, and [`Event::Transient`]s on PostgreSQL.
    Notifications(Vec<Event>),
    /// A command to run on the session; `None` when the handle is gone.
    Command(Option<Command>),
}

/// What a durable name's row held when a session took it.
pub(crate) struct Claimed {
    /// The stored position; `None` before the first store.
    pub position: Option<Position>,
    /// Time since the previous owner's (or this listener's) last check-in.
    pub since: Duration,
}

/// Positions after polls kept for acknowledgements at most, per durable channel: past
/// it the oldest go, and an acknowledgement that falls among them stores nothing new
/// (its notifications may come again after a restart, never go missing).
const MAX_PENDING: usize = 4096;

/// A durable channel: its name, its owner token, and what is acknowledged.
#[derive(Debug)]
pub(crate) struct Durable {
    name: String,
    token: i64,
    /// Notifications on the channel sent to the caller.
    sent: u64,
    /// Of those, how many the caller acknowledged.
    acked: u64,
    /// The position after each poll that delivered on the channel, with `sent` as of it.
    pending: VecDeque<(u64, Position)>,
    /// Acknowledgements waiting for their position to be stored.
    waiting: Vec<oneshot::Sender<Result<(), Error>>>,
}

impl Durable {
    fn record(&mut self, position: Position) {
        match self.pending.back_mut() {
            Some((sent, last)) if *sent == self.sent => *last = position,
            _ => self.pending.push_back((self.sent, position)),
        }
        if self.pending.len() > MAX_PENDING {
            self.pending.pop_front();
        }
    }

    /// The latest position all of whose notifications were acknowledged, taken off the
    /// list: storing it never skips one that was not.
    fn acknowledged(&mut self) -> Option<Position> {
        let mut latest = None;
        while self.pending.front().is_some_and(|(sent, _)| *sent <= self.acked) {
            latest = self.pending.pop_front().map(|(_, p)| p);
        }
        latest
    }

    fn answer(&mut self, result: impl Fn() -> Result<(), Error>) {
        for reply in self.waiting.drain(..) {
            let _ = reply.send(result());
        }
    }
}

/// The listener's bookkeeping that outlives a session.
pub(crate) struct Control {
    pub commands: mpsc::UnboundedReceiver<Command>,
    /// The channels listened on: what a new session listens on again.
    pub channels: BTreeSet<String>,
    /// Listens that wait for the session to be free (or back).
    pub deferred: Vec<(String, oneshot::Sender<Result<(), Error>>)>,
    /// Durable listens and acknowledgements that wait for the session.
    pub later: Vec<Command>,
    /// The durable channels.
    durable: HashMap<String, Durable>,
    /// Durable names given up, to release on the session: (channel, name, token).
    released: Vec<(String, String, i64)>,
    /// Unlistens answered once the names are released (the caller may exit next).
    pub after_release: Vec<oneshot::Sender<()>>,
}

impl Control {
    /// An unlisten's local bookkeeping: whether the channel was durable, its name then
    /// to be released on the session.
    pub fn forget(&mut self, channel: &str) -> bool {
        self.channels.remove(channel);
        let Some(mut durable) = self.durable.remove(channel) else { return false };
        durable.answer(|| Err(Error::NotDurable { channel: channel.to_owned() }));
        self.released.push((channel.to_owned(), durable.name, durable.token));
        true
    }
}

/// One connection, listening. Dropped with its connection.
pub(crate) trait Session: Sized + Send + 'static {
    /// A session on a new connection, reporting how it learns of commits to `wake`.
    fn connect(
        url: &str,
        options: &ListenerOptions,
        wake: &Arc<WakeCounters>,
    ) -> impl Future<Output = Result<Self, Error>> + Send;
    fn session_id(&mut self) -> impl Future<Output = Result<Option<u64>, Error>> + Send;
    /// Returns once the subscription is in effect.
    fn listen(&mut self, channel: &str) -> impl Future<Output = Result<(), Error>> + Send;
    /// Listens on `channel` from now such that its [`position`](Self::position) can be
    /// kept: on the notify table. The same as `listen` where every channel is read from it.
    fn listen_table(&mut self, channel: &str) -> impl Future<Output = Result<(), Error>> + Send {
        self.listen(channel)
    }
    fn unlisten(&mut self, channel: &str) -> impl Future<Output = Result<(), Error>> + Send;
    /// Listens from `position` (one [`position`](Self::position) gave): whether
    /// notifications it had not read may be gone.
    fn resume(
        &mut self,
        channel: &str,
        position: Position,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    /// Where the subscription of `channel` stands; `None` where nothing is kept.
    fn position(&self, channel: &str) -> Option<Position>;
    /// Takes durable name `name` of `channel` for `token`, unless another owner checked
    /// in within `lease`.
    fn claim(
        &mut self,
        channel: &str,
        name: &str,
        token: i64,
        lease: Duration,
    ) -> impl Future<Output = Result<Claimed, Error>> + Send;
    /// Stores `position` (or only checks in); `false` when `token` no longer owns the name.
    fn store(
        &mut self,
        channel: &str,
        name: &str,
        token: i64,
        position: Option<&Position>,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    /// Gives the name up.
    fn release(
        &mut self,
        channel: &str,
        name: &str,
        token: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send;
    /// Waits for notifications or a command. An error means the session is lost.
    fn next(&mut self, control: &mut Control) -> impl Future<Output = Result<Wake, Error>> + Send;
}

pub struct Driver {
    url: String,
    options: ListenerOptions,
    control: Control,
    events: mpsc::Sender<Item>,
    session_id: watch::Sender<Option<u64>>,
    /// Where each channel stood when the last session was lost.
    positions: HashMap<String, Position>,
    next_check_in: Instant,
    wake: Arc<WakeCounters>,
}

/// The error that ends a session after a command whose caller got the real one.
fn lost(what: &str) -> Error {
    Error::Database(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        what.to_owned(),
    )))
}

/// A new owner token: random, positive.
fn new_token() -> i64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    i64::try_from(hasher.finish() >> 1).unwrap_or(1).max(1)
}

impl Driver {
    pub(crate) fn new(
        url: String,
        options: ListenerOptions,
        commands: mpsc::UnboundedReceiver<Command>,
        events: mpsc::Sender<Item>,
        session_id: watch::Sender<Option<u64>>,
        wake: Arc<WakeCounters>,
    ) -> Self {
        let control = Control {
            commands,
            channels: BTreeSet::new(),
            deferred: Vec::new(),
            later: Vec::new(),
            durable: HashMap::new(),
            released: Vec::new(),
            after_release: Vec::new(),
        };
        Driver {
            url,
            options,
            control,
            events,
            session_id,
            positions: HashMap::new(),
            next_check_in: Instant::now(),
            wake,
        }
    }

    /// Connects the first session (its failure is the caller's) and spawns the task.
    pub(crate) async fn start<S: Session>(self) -> Result<tokio::task::JoinHandle<()>, Error> {
        let mut session = S::connect(&self.url, &self.options, &self.wake).await?;
        let id = session.session_id().await?;
        self.session_id.send_replace(id);
        Ok(tokio::spawn(self.run(session)))
    }

    async fn send(&self, event: Event) -> bool {
        self.events.send(Item::Event(event)).await.is_ok()
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
            match self.step(live).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(error) => {
                    warn!(%error, "listener connection lost; reconnecting");
                    for channel in &self.control.channels {
                        if let Some(position) = live.position(channel) {
                            self.positions.insert(channel.clone(), position);
                        }
                    }
                    session = None;
                    self.session_id.send_replace(None);
                    if !self.send(Event::Disconnected(error)).await {
                        return;
                    }
                }
            }
        }
    }

    /// One wait of a live session and what follows it; `Ok(false)` when the handle or
    /// the receiver is gone, an error when the session is lost.
    async fn step<S: Session>(&mut self, live: &mut S) -> Result<bool, Error> {
        self.listen_deferred(live).await?;
        if !self.run_later(live).await? {
            return Ok(false);
        }
        match live.next(&mut self.control).await? {
            Wake::Notifications(batch) => {
                if !self.deliver(live, batch).await? {
                    return Ok(false);
                }
                self.check_in(live, false).await
            }
            Wake::Command(None) => Ok(false),
            Wake::Command(Some(command)) => self.command(live, command).await,
        }
    }

    /// Sends a poll's notifications, counting those of durable channels, then records
    /// where each durable channel stands after them. While the receiver's buffer is full
    /// it answers commands: a caller that acknowledges between receives must not wait for
    /// a task that waits for it. `Ok(false)` when the receiver or the handle is gone.
    async fn deliver<S: Session>(&mut self, live: &mut S, batch: Vec<Event>) -> Result<bool, Error> {
        // A handle of its own: a permit must not borrow `self`, which a command needs.
        let events = self.events.clone();
        for event in batch {
            if !self.control.durable.is_empty()
                && let Event::Notification(n) = &event
                && let Some(durable) = self.control.durable.get_mut(&n.channel)
            {
                durable.sent += 1;
            }
            let permit = loop {
                let waited = tokio::select! {
                    biased;
                    permit = events.reserve() => Ok(permit),
                    command = self.control.commands.recv() => Err(command),
                };
                match waited {
                    Ok(Ok(permit)) => break permit,
                    Ok(Err(_)) | Err(None) => return Ok(false),
                    Err(Some(command)) => {
                        if !self.while_delivering(live, command).await? {
                            return Ok(false);
                        }
                    }
                }
            };
            permit.send(Item::Event(event));
        }
        for (channel, durable) in &mut self.control.durable {
            if let Some(position) = live.position(channel) {
                durable.record(position);
            }
        }
        Ok(true)
    }

    /// A command that came while notifications wait for room: an acknowledgement stores
    /// what it covers of the polls before; the rest waits for the batch to go out.
    async fn while_delivering<S: Session>(&mut self, live: &mut S, command: Command) -> Result<bool, Error> {
        match command {
            Command::Ack { channel, upto, reply } => self.ack(live, channel, upto, reply).await,
            Command::Listen { channel, reply } => {
                self.control.deferred.push((channel, reply));
                Ok(true)
            }
            Command::Unlisten { channel, reply } => {
                let unlistened = live.unlisten(&channel).await;
                if self.control.forget(&channel) {
                    self.control.after_release.push(reply);
                } else {
                    let _ = reply.send(());
                }
                unlistened.map(|()| true)
            }
            command @ Command::ListenDurable { .. } => {
                self.control.later.push(command);
                Ok(true)
            }
        }
    }

    /// Stores each durable channel's acknowledged position (or checks in) when due, or
    /// at once with `now`; `Ok(false)` when the receiver is gone.
    async fn check_in<S: Session>(&mut self, live: &mut S, now: bool) -> Result<bool, Error> {
        if self.control.durable.is_empty() || (!now && Instant::now() < self.next_check_in) {
            return Ok(true);
        }
        self.next_check_in = Instant::now() + self.options.durable_lease / 3;
        let channels: Vec<String> = self.control.durable.keys().cloned().collect();
        for channel in channels {
            if !self.store(live, &channel).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Stores `channel`'s acknowledged position, or checks in when there is none new, and
    /// answers the acknowledgements waiting for it. `Ok(false)` when the receiver is gone.
    async fn store<S: Session>(&mut self, live: &mut S, channel: &str) -> Result<bool, Error> {
        let Some(durable) = self.control.durable.get_mut(channel) else { return Ok(true) };
        let position = durable.acknowledged();
        let (name, token) = (durable.name.clone(), durable.token);
        if live.store(channel, &name, token, position.as_ref()).await? {
            if let Some(durable) = self.control.durable.get_mut(channel) {
                durable.answer(|| Ok(()));
            }
            return Ok(true);
        }
        // Another process took the name over: this one stops reading the channel.
        warn!(channel, name, "durable listener's name taken over by another process; stopped listening");
        live.unlisten(channel).await?;
        self.control.channels.remove(channel);
        if let Some(mut durable) = self.control.durable.remove(channel) {
            let error = || Error::DurableNameLost { channel: channel.to_owned(), name: name.clone() };
            durable.answer(|| Err(error()));
            return Ok(self.send(Event::Stopped { channel: channel.to_owned(), error: error() }).await);
        }
        Ok(true)
    }

    /// Runs a command on a live session; an error means the session is lost.
    async fn command<S: Session>(&mut self, session: &mut S, command: Command) -> Result<bool, Error> {
        match command {
            Command::Listen { channel, reply } => {
                self.control.deferred.push((channel, reply));
                self.listen_deferred(session).await?;
                Ok(true)
            }
            Command::Unlisten { channel, reply } => {
                self.control.forget(&channel);
                // A durable name is released before the answer: the caller may exit next.
                let result = match session.unlisten(&channel).await {
                    Ok(()) => self.run_later(session).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(());
                result
            }
            command @ (Command::ListenDurable { .. } | Command::Ack { .. }) => {
                self.control.later.push(command);
                self.run_later(session).await
            }
        }
    }

    /// Runs the durable listens, acknowledgements and releases that waited for the
    /// session. `Ok(false)` when the receiver is gone.
    async fn run_later<S: Session>(&mut self, live: &mut S) -> Result<bool, Error> {
        while let Some((channel, name, token)) = self.control.released.pop() {
            if let Err(error) = live.release(&channel, &name, token).await {
                if error.is_connection_error() {
                    self.control.released.push((channel, name, token));
                    return Err(error);
                }
                warn!(%error, channel, name, "releasing the durable name failed; it is free once its lease runs out");
            }
        }
        for reply in self.control.after_release.drain(..) {
            let _ = reply.send(());
        }
        let later = std::mem::take(&mut self.control.later);
        let mut commands = later.into_iter();
        while let Some(command) = commands.next() {
            let done = match command {
                Command::ListenDurable { channel, name, reply } => {
                    match self.listen_durable(live, &channel, &name).await {
                        Ok(resume) => {
                            let _ = reply.send(Ok(resume));
                            Ok(true)
                        }
                        Err(error) if error.is_connection_error() => {
                            let _ = reply.send(Err(error));
                            Err(lost("the connection was lost while listening durably"))
                        }
                        Err(error) => {
                            let _ = reply.send(Err(error));
                            Ok(true)
                        }
                    }
                }
                Command::Ack { channel, upto, reply } => self.ack(live, channel, upto, reply).await,
                other => {
                    self.control.later.push(other);
                    Ok(true)
                }
            };
            match done {
                Ok(true) => {}
                other => {
                    // Whatever is left waits for the next session.
                    self.control.later.extend(commands);
                    return other;
                }
            }
        }
        Ok(true)
    }

    /// Acknowledges `upto` notifications of durable `channel`: stores what that covers
    /// and answers `reply` once it is stored.
    async fn ack<S: Session>(
        &mut self,
        live: &mut S,
        channel: String,
        upto: u64,
        reply: oneshot::Sender<Result<(), Error>>,
    ) -> Result<bool, Error> {
        let Some(durable) = self.control.durable.get_mut(&channel) else {
            let _ = reply.send(Err(Error::NotDurable { channel }));
            return Ok(true);
        };
        durable.acked = durable.acked.max(upto.min(durable.sent));
        durable.waiting.push(reply);
        self.store(live, &channel).await
    }

    /// Takes the durable name and listens on `channel` from its stored position (or
    /// from now, storing that), then tells the receiver to count its notifications.
    async fn listen_durable<S: Session>(
        &mut self,
        live: &mut S,
        channel: &str,
        name: &str,
    ) -> Result<Resume, Error> {
        if self.control.channels.contains(channel) {
            return match self.control.durable.get(channel) {
                Some(durable) if durable.name == name => Ok(Resume::Resumed),
                _ => Err(Error::AlreadyListening { channel: channel.to_owned() }),
            };
        }
        let (lease, poll_interval) = (self.options.durable_lease, self.options.notify_table.poll_interval);
        if lease < poll_interval * 3 {
            return Err(Error::DurableLeaseTooShort { lease, poll_interval });
        }
        let token = new_token();
        let claimed = live.claim(channel, name, token, self.options.durable_lease).await?;
        let listened = async {
            match claimed.position {
                Some(position) => {
                    let may_have_lost = live.resume(channel, position).await?;
                    Ok(if may_have_lost && claimed.since > self.options.durable_live {
                        Resume::Gap
                    } else {
                        Resume::Resumed
                    })
                }
                None => {
                    live.listen_table(channel).await?;
                    let position = live.position(channel);
                    live.store(channel, name, token, position.as_ref()).await?;
                    Ok::<_, Error>(Resume::New)
                }
            }
        }
        .await;
        let resume = match listened {
            Ok(resume) => resume,
            Err(error) => {
                let _ = live.unlisten(channel).await;
                if !error.is_connection_error() {
                    let _ = live.release(channel, name, token).await;
                }
                return Err(error);
            }
        };
        debug!(channel, name, ?resume, "listening durably");
        self.control.channels.insert(channel.to_owned());
        let durable = Durable {
            name: name.to_owned(),
            token,
            sent: 0,
            acked: 0,
            pending: VecDeque::new(),
            waiting: Vec::new(),
        };
        self.control.durable.insert(channel.to_owned(), durable);
        // Before any of its notifications: the receiver counts from here.
        let _ = self.events.send(Item::Durable(channel.to_owned())).await;
        Ok(resume)
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

    /// Connects a new session and resumes every channel, waiting with capped exponential
    /// backoff between attempts. `None` when the handle went away.
    async fn reconnect<S: Session>(&mut self) -> Option<S> {
        let mut delay = self.options.reconnect_min;
        loop {
            if !self.wait_disconnected(delay).await {
                return None;
            }
            delay = (delay * 2).min(self.options.reconnect_max);
            match self.resume::<S>().await {
                Ok((mut session, missed, stopped)) => {
                    info!(
                        channels = self.control.channels.len(),
                        missed = missed.len(),
                        "listener reconnected"
                    );
                    if !self.send(Event::Reconnected { missed }).await {
                        return None;
                    }
                    for (channel, error) in stopped {
                        if !self.send(Event::Stopped { channel, error }).await {
                            return None;
                        }
                    }
                    // Store what was acknowledged meanwhile, and answer those waiting.
                    match self.check_in(&mut session, true).await {
                        Ok(true) => {
                            self.positions.clear();
                            return Some(session);
                        }
                        Ok(false) => return None,
                        Err(error) => {
                            // Lost again: the next session resumes from where this one was.
                            for channel in &self.control.channels {
                                if let Some(position) = session.position(channel) {
                                    self.positions.insert(channel.clone(), position);
                                }
                            }
                            warn!(%error, retry_in = ?delay, "listener reconnect failed");
                        }
                    }
                }
                Err(error) => warn!(%error, retry_in = ?delay, "listener reconnect failed"),
            }
        }
    }

    /// A new session listening on every channel again, from where each stood (durable
    /// names taken again); the channels on which notifications may have been missed, and
    /// the durable channels another process took over meanwhile.
    async fn resume<S: Session>(&mut self) -> Result<(S, Vec<String>, Vec<(String, Error)>), Error> {
        let mut session = S::connect(&self.url, &self.options, &self.wake).await?;
        let (mut missed, mut stopped) = (Vec::new(), Vec::new());
        let channels: Vec<String> = self.control.channels.iter().cloned().collect();
        for channel in channels {
            let mut since = None;
            if let Some(durable) = self.control.durable.get(&channel) {
                match session.claim(&channel, &durable.name, durable.token, self.options.durable_lease).await
                {
                    Ok(claimed) => since = Some(claimed.since),
                    Err(error @ Error::DurableNameTaken { .. }) => {
                        self.control.channels.remove(&channel);
                        if let Some(mut durable) = self.control.durable.remove(&channel) {
                            let name = durable.name.clone();
                            durable.answer(|| {
                                Err(Error::DurableNameLost { channel: channel.clone(), name: name.clone() })
                            });
                        }
                        stopped.push((channel, error));
                        continue;
                    }
                    Err(error) => return Err(error),
                }
            }
            let may_have_lost = match self.positions.get(&channel) {
                Some(position) => session.resume(&channel, position.clone()).await?,
                None => {
                    session.listen(&channel).await?;
                    true
                }
            };
            // A durable channel's rows were kept for it while it checked in recently.
            if may_have_lost && since.is_none_or(|since| since > self.options.durable_live) {
                missed.push(channel);
            }
        }
        let id = session.session_id().await?;
        self.session_id.send_replace(id);
        Ok((session, missed, stopped))
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
                        self.positions.remove(&channel);
                        // A listen still waiting for the session is answered and undone.
                        for (_, waiting) in self.control.deferred.extract_if(.., |(c, _)| *c == channel) {
                            let _ = waiting.send(Ok(()));
                        }
                        let _ = reply.send(());
                    }
                    Some(Command::Listen { channel, reply }) => self.control.deferred.push((channel, reply)),
                    Some(command) => self.control.later.push(command),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(mark: u64) -> Position {
        Position { mark, cutoff: String::new(), gaps: Vec::new(), ahead: Vec::new(), first_window: None }
    }

    fn durable() -> Durable {
        Durable {
            name: "n".into(),
            token: 1,
            sent: 0,
            acked: 0,
            pending: VecDeque::new(),
            waiting: Vec::new(),
        }
    }

    /// What is stored after an acknowledgement is the position of the last poll all of
    /// whose notifications were acknowledged, never one past an unacknowledged one.
    #[test]
    fn an_acknowledgement_stores_the_last_poll_it_covers_whole() {
        let mut d = durable();
        d.record(at(1)); // an empty poll
        d.sent += 2;
        d.record(at(5)); // a poll delivering two
        d.record(at(6)); // then an empty one: replaces it, still after two
        d.sent += 1;
        d.record(at(9));
        d.acked = 1; // the first of the poll of two
        assert_eq!(d.acknowledged(), Some(at(1)));
        assert_eq!(d.acknowledged(), None, "taken");
        d.acked = 2;
        assert_eq!(d.acknowledged(), Some(at(6)));
        d.acked = 3;
        assert_eq!(d.acknowledged(), Some(at(9)));
        assert!(d.pending.is_empty());
    }

    #[test]
    fn pending_positions_are_bounded_dropping_the_oldest() {
        let mut d = durable();
        for i in 0..(MAX_PENDING as u64 + 10) {
            d.sent += 1;
            d.record(at(i));
        }
        assert_eq!(d.pending.len(), MAX_PENDING);
        d.acked = 5; // among the dropped: nothing to store
        assert_eq!(d.acknowledged(), None);
        d.acked = d.sent;
        assert_eq!(d.acknowledged(), Some(at(MAX_PENDING as u64 + 9)));
    }

    #[test]
    fn owner_tokens_are_positive_and_differ() {
        let (a, b) = (new_token(), new_token());
        assert!(a > 0 && b > 0 && a != b);
    }
}
