//! The notify-table core driven on one connection: every listener on MySQL/MariaDB and
//! SQLite, PostgreSQL's durable channels (each database's [`TableConn`] is in its
//! dialect's module).
//!
//! Where the database has a push path (the binary log, a watch on SQLite's files), the
//! session reads the table when a commit is pushed rather than every poll interval; while
//! the path is refused or lost, it polls as before. On SQLite every read of the table is
//! gated by `PRAGMA data_version`, which costs no page read: an idle listener reads no row.

use std::sync::Arc;
use std::time::{Duration, Instant};

use notify_table::{NotifyTable, Position, Statement, Value};
use tokio::time::{Interval, MissedTickBehavior};
use tracing::{debug, info, warn};

use super::driver::{Claimed, Command, Control, Session, Wake};
use super::event::Event;
use super::options::ListenerOptions;
use super::wake::WakeCounters;
use crate::error::{Error, is_missing_column, is_missing_table};
use crate::notify::missing;
use crate::sql::TableConn;
use crate::sql::push::{PushEvent, PushHandle, PushState, Pushed};
use crate::sql::{POSITIONS_SUFFIX, PositionsSql, micros, text};

/// After a pushed commit whose rows a poll did not find yet (the binary log sends a
/// transaction a moment before other sessions see it; a file write comes before SQLite's
/// commit is visible), the session looks again after these waits, then leaves it to the
/// next tick. Their sum, 15 ms, is far above the moments measured (well under one).
const PUSH_RETRIES: [Duration; 4] =
    [Duration::from_millis(1), Duration::from_millis(2), Duration::from_millis(4), Duration::from_millis(8)];

/// Why a session's wait ended, inside [`TableSession::next`].
enum Woken {
    Command(Option<Command>),
    Push(PushEvent),
    Tick,
}

/// What `push` says next; never, without one.
async fn push_event(push: &mut Option<PushHandle>) -> PushEvent {
    match push {
        Some(push) => push.next().await,
        None => std::future::pending().await,
    }
}

/// One listen connection and its own core object: a new connection starts a new core,
/// resumed from the positions the old one reached.
pub(crate) struct TableSession<C: TableConn> {
    pub(super) conn: C,
    table: NotifyTable,
    /// Every poll interval; on PostgreSQL only a fallback to LISTEN's wake-ups.
    pub(super) ticker: Interval,
    /// The positions table's statements; `None` when the notify table's name leaves no
    /// room for its suffix.
    positions: Option<PositionsSql<C::Db>>,
    /// How recently a durable listener must have checked in for the cleanup to keep
    /// what it has not read.
    durable_live: Duration,
    /// Whether the cleanup found no positions table (an older deploy): it stops asking.
    no_positions_table: bool,
    /// The push path, while there is one.
    push: Option<PushHandle>,
    /// Whether it is open: the table is read when it reports a commit, and every
    /// `pushed_poll` besides.
    live: bool,
    pushed_poll: Duration,
    /// When the table was last read.
    last_poll: Instant,
    /// Whether the database has a `data_version` (SQLite): the table is read only when it
    /// changed.
    versioned: bool,
    /// The last `data_version` read.
    version: Option<i64>,
    /// Whether the next tick reads the table whatever the push or the version say: a
    /// channel resumed, whose position may be behind.
    due: bool,
    wake: Arc<WakeCounters>,
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
                    if control.forget(&channel) {
                        control.after_release.push(reply);
                    } else {
                        let _ = reply.send(());
                    }
                }
                Some(Command::Listen { channel, reply }) => control.deferred.push((channel, reply)),
                Some(command) => control.later.push(command),
                None => return None,
            },
        }
    }
}

impl<C: TableConn> TableSession<C> {
    /// A session on a new connection to `url`; with `push`, its push path started (where
    /// the database has one) and its state reported to `wake`.
    pub(super) async fn open(
        url: &str,
        options: &ListenerOptions,
        wake: &Arc<WakeCounters>,
        push: bool,
    ) -> Result<Self, Error> {
        let table = NotifyTable::new(options.notify_table.clone(), C::dialect())?;
        let (mut conn, at) = C::open(url).await?;
        let version = conn.data_version().await?;
        wake.version_check_if(version.is_some());
        let mut ticker = tokio::time::interval(table.config().poll_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let positions = PositionsSql::new(&table.config().table).ok();
        let poll_interval = table.config().poll_interval;
        let push = match push {
            true if options.push => {
                let started =
                    C::push(&at, &table.config().table, (options.reconnect_min, options.reconnect_max));
                if started.is_none() {
                    wake.polling("this build has no push path for the database".into(), poll_interval);
                }
                started
            }
            true => {
                wake.polling("the push path is turned off (ListenerOptions::push)".into(), poll_interval);
                None
            }
            false => None,
        };
        Ok(TableSession {
            conn,
            table,
            ticker,
            positions,
            durable_live: options.durable_live,
            no_positions_table: false,
            push,
            live: false,
            pushed_poll: options.pushed_poll_interval.max(poll_interval),
            last_poll: Instant::now(),
            versioned: version.is_some(),
            // The first tick polls: the first poll makes the cleanup due.
            version: None,
            due: false,
            wake: wake.clone(),
        })
    }

    /// A new state of the push path: pushed, or polling (said once per reason).
    fn push_state(&mut self, state: Option<PushState>) {
        let poll_interval = self.table.config().poll_interval;
        let via = self.push.as_ref().map_or("", |p| p.via);
        match state {
            Some(PushState::Live) => {
                self.live = true;
                info!(via, "listener pushed: the notify table is read when a commit is reported");
                self.wake.pushed(via);
            }
            Some(PushState::Lost(error)) => {
                if std::mem::take(&mut self.live) {
                    self.wake.push_lost();
                    warn!(%error, via, "listener's push path lost: polling until it is back");
                }
                self.wake.polling(format!("{via} is not open: {error}"), poll_interval);
            }
            Some(PushState::Refused(reason)) => {
                self.live = false;
                self.push = None;
                self.wake.polling(reason, poll_interval);
            }
            Some(PushState::Starting) => {}
            None => {
                self.live = false;
                self.push = None;
            }
        }
    }

    /// Reads `data_version` where the database has one: whether the table may hold
    /// something new (always, where it has none).
    async fn changed_since(&mut self) -> Result<bool, Error> {
        let Some(version) = self.conn.data_version().await? else { return Ok(true) };
        self.wake.version_check();
        Ok(self.version.replace(version) != Some(version))
    }

    /// A tick: poll (gated by `data_version`) unless the push path is open and no
    /// safety poll is due; the driver checks in either way.
    async fn ticked(&mut self, control: &mut Control) -> Result<Wake, Error> {
        if std::mem::take(&mut self.due) {
            self.changed_since().await?;
        } else if (self.live && !self.versioned && self.last_poll.elapsed() < self.pushed_poll)
            || !self.changed_since().await?
        {
            return Ok(Wake::Notifications(Vec::new()));
        }
        self.poll(control).await
    }

    /// A pushed commit: read the table when it may hold something for this listener, and
    /// again after short waits while what the push named is not visible yet.
    async fn on_push(&mut self, pushed: Pushed, control: &mut Control) -> Result<Option<Wake>, Error> {
        self.wake.push();
        let versioned = self.versioned;
        let mine: Vec<(String, u64)> =
            pushed.rows.into_iter().filter(|(channel, _)| self.table.is_subscribed(channel)).collect();
        if !versioned && !pushed.unknown && mine.is_empty() {
            return Ok(None);
        }
        let mut batch = Vec::new();
        let mut retries = PUSH_RETRIES.iter();
        loop {
            let look = !versioned || self.changed_since().await?;
            if look {
                match self.poll(control).await? {
                    Wake::Notifications(read) => batch.extend(read),
                    command => return Ok(Some(command)),
                }
            }
            let waiting = match versioned {
                // Seen: the version moved and the table was read.
                true => !look,
                // The rows named not read yet; rows unnamed and nothing found yet.
                false => {
                    mine.iter().any(|(channel, id)| {
                        self.table.is_subscribed(channel) && !self.table.has_read(channel, *id)
                    }) || (pushed.unknown && mine.is_empty() && batch.is_empty())
                }
            };
            let Some(wait) = retries.next().filter(|_| waiting) else { break };
            tokio::time::sleep(*wait).await;
        }
        Ok(Some(Wake::Notifications(batch)))
    }
}

impl<C: TableConn> Session for TableSession<C> {
    async fn connect(url: &str, options: &ListenerOptions, wake: &Arc<WakeCounters>) -> Result<Self, Error> {
        Self::open(url, options, wake, true).await
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
        self.table.subscribed(channel, rows)?;
        // A commit the push path reported just before the channel was subscribed, and not
        // visible yet to the subscribe (the binary log runs a moment ahead of InnoDB),
        // is above the mark with nothing left to report it: the next tick reads it.
        self.due = true;
        Ok(())
    }

    async fn unlisten(&mut self, channel: &str) -> Result<(), Error> {
        self.table.unsubscribe(channel);
        Ok(())
    }

    async fn resume(&mut self, channel: &str, position: Position) -> Result<bool, Error> {
        let rows = self.conn.fetch(&self.table.resume_sql()).await?;
        // What was committed while it was away: read at the next tick.
        self.due = true;
        Ok(self.table.resumed(channel, position, rows)?)
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
        let sql = self.positions_sql()?;
        let key = || vec![text(channel), text(name)];
        let insert = Statement { sql: sql.insert.clone(), binds: key() };
        let read = Statement { sql: sql.read.clone(), binds: key() };
        let mut take = vec![Value::Int(token), micros(lease)];
        take.extend(key());
        take.extend([Value::Int(token), micros(lease)]);
        let take = Statement { sql: sql.take.clone(), binds: take };
        let table = format!("{}{POSITIONS_SUFFIX}", self.table.config().table);
        match self.conn.execute(&insert).await {
            Err(e) if is_missing_table(&e) => return Err(Error::MissingPositionsTable { table }),
            other => other?,
        };
        let row = match self.conn.rows(&read, 1).await {
            Err(e) if is_missing_column(&e) => return Err(Error::PositionsTableOutdated { table }),
            other => other?.pop().unwrap_or_default(),
        };
        let since = Duration::from_micros(u64::try_from(row.int(1)).unwrap_or(0));
        // The owner's lease; this listener's where an older rowbus stored none.
        let owners = match row.int(2) {
            0 => lease,
            stored => Duration::from_micros(u64::try_from(stored).unwrap_or(0)),
        };
        if self.conn.execute(&take).await? == 0 {
            return Err(Error::DurableNameTaken {
                channel: channel.to_owned(),
                name: name.to_owned(),
                since,
                expires_in: owners.saturating_sub(since),
            });
        }
        let position = match row.text(0) {
            "" => None,
            stored => Some(stored.parse::<Position>()?),
        };
        Ok(Claimed { position, since })
    }

    async fn store(
        &mut self,
        channel: &str,
        name: &str,
        token: i64,
        position: Option<&Position>,
    ) -> Result<bool, Error> {
        let sql = self.positions_sql()?;
        let key = [text(channel), text(name), Value::Int(token)];
        let stmt = match position {
            Some(p) => {
                let first_unread = Value::Int(i64::try_from(p.first_unread()).unwrap_or(i64::MAX));
                let mut binds = vec![text(&p.to_string()), first_unread];
                binds.extend(key);
                Statement { sql: sql.store.clone(), binds }
            }
            None => Statement { sql: sql.check_in.clone(), binds: key.to_vec() },
        };
        Ok(self.conn.execute(&stmt).await? == 1)
    }

    async fn release(&mut self, channel: &str, name: &str, token: i64) -> Result<(), Error> {
        let sql = self.positions_sql()?;
        let binds = vec![text(channel), text(name), Value::Int(token)];
        self.conn.execute(&Statement { sql: sql.release.clone(), binds }).await?;
        Ok(())
    }

    /// Waits for a command, a pushed commit or the next tick.
    async fn next(&mut self, control: &mut Control) -> Result<Wake, Error> {
        loop {
            let woken = tokio::select! {
                biased;
                command = control.commands.recv() => Woken::Command(command),
                event = push_event(&mut self.push) => Woken::Push(event),
                _ = self.ticker.tick() => Woken::Tick,
            };
            match woken {
                Woken::Command(command) => return Ok(Wake::Command(command)),
                Woken::Push(PushEvent::State(state)) => self.push_state(state),
                Woken::Push(PushEvent::Pushed(None)) => self.push_state(None),
                Woken::Push(PushEvent::Pushed(Some(pushed))) => {
                    if let Some(wake) = self.on_push(pushed, control).await? {
                        return Ok(wake);
                    }
                }
                Woken::Tick => return self.ticked(control).await,
            }
        }
    }
}

// What PostgreSQL's session, which reads only some channels from the table, asks.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
impl<C: TableConn> TableSession<C> {
    /// Whether `channel` is read from the table.
    pub(super) fn is_subscribed(&self, channel: &str) -> bool {
        self.table.is_subscribed(channel)
    }

    /// Whether any channel is read from the table.
    pub(super) fn is_polling(&self) -> bool {
        self.table.channel_count() > 0
    }

    /// Polls the table now (then cleans up when due): what was committed since.
    pub(super) async fn poll(&mut self, control: &mut Control) -> Result<Wake, Error> {
        let Some((stmt, token)) = self.table.poll_sql() else {
            return Ok(Wake::Notifications(Vec::new()));
        };
        let Some(rows) = answering(self.conn.fetch(&stmt), &mut self.table, control).await else {
            return Ok(Wake::Command(None));
        };
        let notifications: Vec<Event> =
            self.table.polled(token, rows?)?.into_iter().map(Event::Notification).collect();
        self.last_poll = Instant::now();
        self.wake.poll(notifications.len());
        if self.table.cleanup_sql().is_some() {
            let held = self.held().await;
            self.clean_up(held, control).await;
            // A whole batch deleted: the next tick polls and cleans again, whatever the push
            // path or `data_version` say (this connection's own deletes do not move it).
            self.due |= self.table.cleanup_due_next_poll();
        }
        Ok(Wake::Notifications(notifications))
    }

    fn positions_sql(&self) -> Result<&PositionsSql<C::Db>, Error> {
        self.positions.as_ref().ok_or_else(|| Error::PositionsTableName {
            table: self.table.config().table.clone(),
            max: notify_table::MAX_TABLE_LEN - POSITIONS_SUFFIX.len(),
        })
    }

    /// Per channel, the lowest id a live durable listener of it has not read: the
    /// cleanup keeps those rows. `Err` when that cannot be known: the cleanup waits.
    async fn held(&mut self) -> Result<Vec<(String, u64)>, ()> {
        let Some(sql) = self.positions.as_ref().filter(|_| !self.no_positions_table) else {
            return Ok(Vec::new());
        };
        let stmt = Statement { sql: sql.held.clone(), binds: vec![micros(self.durable_live)] };
        match self.conn.rows(&stmt, 1).await {
            Ok(rows) => Ok(rows
                .iter()
                .map(|r| (r.text(0).to_owned(), u64::try_from(r.int(0)).unwrap_or(0)))
                .collect()),
            Err(e) if is_missing_table(&e) => {
                // Deployed before durable listeners: nothing holds the cleanup back.
                self.no_positions_table = true;
                Ok(Vec::new())
            }
            Err(error) => {
                warn!(%error, "reading the durable listeners' positions failed; the cleanup waits");
                Err(())
            }
        }
    }

    /// Runs the retention cleanup, keeping what `held` holds (`Err`: none this time).
    async fn clean_up(&mut self, held: Result<Vec<(String, u64)>, ()>, control: &mut Control) {
        let Ok(held) = held else {
            self.table.cleaned(None);
            return;
        };
        let held: Vec<(&str, u64)> = held.iter().map(|(channel, id)| (channel.as_str(), *id)).collect();
        if let Some(select) = self.table.cleanup_sql_holding(&held) {
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
    }
}
