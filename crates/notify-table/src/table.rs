//! The listener's state machine: marks, gaps, first windows and the cleanup cadence.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::channel::{check_channel, check_payload};
use crate::config::Config;
use crate::dialect::{Dialect, Sql, id_to_int};
use crate::error::{ConfigError, Error};
use crate::position::{Ahead, Gaps, MAX_GAPS, Position, Window, probes};
use crate::statement::{Notification, Row, Statement, Value};

/// Most channels one [`NotifyTable`] subscribes, so that a poll statement's bind
/// parameters stay under every server's limit (MySQL: 65,535 at 3 per channel beside
/// [`MAX_GAPS`] gap ranges at 2; SQLite: 32,766 at 2 per channel).
pub const MAX_CHANNELS: usize = 9_000;

/// Most channels [`NotifyTable::cleanup_sql_holding`] keeps rows for one by one.
pub const MAX_HELD_CHANNELS: usize = 64;

/// How much further back than `lookback` a subscribe statement reads the window's ids, and
/// takes the row its first window starts above. Ids follow the INSERTs' times only to
/// within the time between an INSERT's start (its `created_at`) and the moment it takes
/// its id; the margin keeps an id open at subscribe and inserted just inside the window
/// from falling below the first window's floor. It costs a second's rows, once.
const SEED_MARGIN: Duration = Duration::from_secs(1);

/// Names the poll statement a [`NotifyTable::poll_sql`] call built: hand it back to
/// [`NotifyTable::polled`] with that statement's rows.
///
/// It records which subscriptions the statement was built for, so that rows of a channel
/// unsubscribed (or subscribed again) while the statement was in flight are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a poll's rows must be folded with the token of the statement that read them"]
pub struct PollToken {
    seq: u64,
    generation: u64,
}

/// One channel's subscription (see [`Position`] for what each part means).
#[derive(Debug)]
struct Subscription {
    /// Unique across the object's life: a channel subscribed again gets a new one.
    generation: u64,
    channel: Arc<str>,
    /// Every id up to here was read, except those in `gaps` and the first window's; rises only.
    mark: u64,
    /// Server time minus lookback, as of the channel's previous statement; rises only.
    cutoff: Arc<str>,
    gaps: Gaps,
    /// Ids above `mark` already delivered, with the time each was first read (only while
    /// the gaps are at their bound).
    ahead: BTreeMap<u64, Option<Arc<str>>>,
    window: Option<Window>,
}

impl Subscription {
    fn position(&self) -> Position {
        Position {
            mark: self.mark,
            cutoff: self.cutoff.to_string(),
            gaps: self.gaps.snapshot(),
            ahead: self
                .ahead
                .iter()
                .map(|(&id, read_at)| Ahead { id, read_at: read_at.as_deref().map(str::to_owned) })
                .collect(),
            first_window: self.window.as_ref().map(Window::snapshot),
        }
    }
}

/// The sans-I/O LISTEN/NOTIFY emulation over a notify table, for one listen connection.
///
/// `NotifyTable` builds SQL with bind values and folds the rows a statement returned; it
/// never runs a statement, reads a clock or waits. The transport that owns it (one object
/// per listen connection, dropped with the connection) drives it:
///
/// 1. **listen**: run [`subscribe_sql`](Self::subscribe_sql), hand its rows to
///    [`subscribed`](Self::subscribed); only then is the subscription in effect (the mark
///    is taken there). **unlisten**: [`unsubscribe`](Self::unsubscribe), no statement.
/// 2. **every `poll_interval`**: [`poll_sql`](Self::poll_sql) (nothing to run when no
///    channel is subscribed); run it; hand its rows and token to
///    [`polled`](Self::polled) and deliver what it returns, in order. A failed poll
///    statement means a dead connection: drop this object with it and start a new one.
/// 3. **after a poll**: if [`cleanup_sql`](Self::cleanup_sql) returns a statement, run it:
///    it selects the ids of expired rows. Hand them to [`delete_sql`](Self::delete_sql),
///    run the DELETE it returns, and report the deleted rows to [`cleaned`](Self::cleaned)
///    (`Some(0)` when there was nothing to delete, `None` when a statement failed; a failed
///    cleanup is no reason to drop the connection).
///
/// [`notify_sql`](Self::notify_sql) may run on any connection, inside any transaction:
/// the notification is delivered when that transaction commits.
///
/// ```
/// use notify_table::{Config, Dialect, NotifyTable, Row};
///
/// let mut nt = NotifyTable::new(Config::default(), Dialect::MySql)?;
/// // listen: the subscribe statement returned the mark row (highest id 7) only.
/// let _stmt = nt.subscribe_sql("jobs")?;
/// nt.subscribed("jobs", vec![Row::cutoff(7, "2026-11-29 12:00:00.000000")])?;
///
/// // a tick: run the poll, fold its rows.
/// let (_stmt, token) = nt.poll_sql().expect("a channel is subscribed");
/// let rows = vec![
///     Row::cutoff(0, "2026-11-29 12:00:01.000000"),
///     Row::notification(8, "jobs", "wake up", 42),
/// ];
/// for n in nt.polled(token, rows)? {
///     assert_eq!((n.channel.as_str(), n.payload.as_str(), n.pid), ("jobs", "wake up", 42));
/// }
///
/// // then the cleanup, when one is due (the first poll makes it due).
/// if let Some(_select) = nt.cleanup_sql() {
///     let expired = [3, 4];                      // the ids the SELECT returned
///     let _delete = nt.delete_sql(&expired);     // Some: there is something to delete
///     nt.cleaned(Some(2));                       // rows the DELETE affected
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct NotifyTable {
    config: Config,
    sql: Sql,
    subscriptions: HashMap<Arc<str>, Subscription>,
    generation: u64,
    /// Poll statement texts by gap slots, kept while the number of channels stays the same.
    poll_texts: (usize, HashMap<usize, Arc<str>>),
    /// Gaps kept open over all channels at most.
    max_gaps: usize,
    poll_seq: u64,
    folded_seq: u64,
    polls: u64,
    next_cleanup: u64,
}

impl NotifyTable {
    /// A notify table for `dialect`, with the configuration validated (on PostgreSQL the
    /// table's name is at most [`PG_MAX_TABLE_LEN`](crate::PG_MAX_TABLE_LEN) characters).
    pub fn new(config: Config, dialect: Dialect) -> Result<Self, ConfigError> {
        config.validate()?;
        if dialect == Dialect::Postgres && config.table.len() > crate::PG_MAX_TABLE_LEN {
            return Err(ConfigError::Invalid {
                key: "table",
                value: config.table.clone(),
                rule: "must be at most 52 characters on PostgreSQL (its index names add 11 to the 63 an identifier may have)",
            });
        }
        Ok(NotifyTable {
            sql: Sql::new(dialect, &config.table),
            config,
            subscriptions: HashMap::new(),
            generation: 0,
            poll_texts: (0, HashMap::new()),
            max_gaps: MAX_GAPS,
            poll_seq: 0,
            folded_seq: 0,
            polls: 0,
            next_cleanup: 1,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.sql.dialect
    }

    /// The table name, backtick-quoted, as it appears in every statement.
    pub fn quoted_table(&self) -> &str {
        &self.sql.quoted
    }

    /// The statements that create the table and its indexes if they do not exist (one on
    /// MySQL, four on SQLite and PostgreSQL). Nothing runs them implicitly; MySQL commits around DDL, so
    /// run them outside any transaction.
    pub fn create_table_sql(&self) -> Vec<Statement> {
        self.sql.create.iter().map(|sql| Statement { sql: sql.clone(), binds: Vec::new() }).collect()
    }

    /// `DROP TABLE IF EXISTS` the table.
    pub fn drop_table_sql(&self) -> Statement {
        Statement { sql: self.sql.drop.clone(), binds: Vec::new() }
    }

    /// The INSERT of one notification, delivered when the transaction it runs in commits.
    /// Refuses a channel [`check_channel`] refuses and a payload over 65,535 bytes; an
    /// absent payload is the empty string.
    pub fn notify_sql(&self, channel: &str, payload: &str) -> Result<Statement, Error> {
        let channel = check_channel(channel)?;
        let payload = check_payload(payload)?;
        let mut binds = vec![Value::Text(Arc::from(channel)), Value::Text(Arc::from(payload))];
        if let Dialect::Sqlite { pid } = self.sql.dialect {
            binds.push(Value::Int(i64::from(pid)));
        }
        Ok(Statement { sql: self.sql.notify.clone(), binds })
    }

    /// The statement that takes `channel`'s mark: its highest id, the current cutoff and
    /// the server's time in the head row, then (not on SQLite) the ids of every channel
    /// inside the lookback window, which seed the subscription's first window (see
    /// [`FirstWindow`](crate::FirstWindow)).
    /// Hand its rows to [`subscribed`](Self::subscribed).
    pub fn subscribe_sql(&self, channel: &str) -> Result<Statement, Error> {
        let channel = check_channel(channel)?;
        self.check_room_for(channel)?;
        let channel = Value::Text(Arc::from(channel));
        let lookback = self.sql.age_bind(self.config.lookback);
        let seed = self.sql.age_bind(self.config.lookback.saturating_add(SEED_MARGIN));
        let binds = match self.sql.dialect {
            Dialect::MySql => vec![channel.clone(), channel, lookback, seed.clone(), seed],
            Dialect::Postgres => vec![channel, lookback, seed],
            Dialect::Sqlite { .. } => vec![channel, lookback],
        };
        Ok(Statement { sql: self.sql.subscribe.clone(), binds })
    }

    /// Folds the rows of [`subscribe_sql`](Self::subscribe_sql): from now on `channel` is
    /// polled, and only what was not visible to that statement is delivered. Replaces an
    /// earlier subscription of the channel.
    ///
    /// On MySQL and PostgreSQL the subscription starts with its first window (see
    /// [`FirstWindow`](crate::FirstWindow)): the ids below the mark that the statement did
    /// not read, above the last row inserted before its window (its lowest id row), may be
    /// transactions open at subscribe. Without such rows every id up to the mark is watched.
    pub fn subscribed(&mut self, channel: &str, rows: Vec<Row>) -> Result<(), Error> {
        let channel = check_channel(channel)?;
        self.check_room_for(channel)?;
        let mut head = None;
        let mut read = Vec::with_capacity(rows.len());
        for row in rows {
            match row.cutoff {
                Some(cutoff) => head = Some((row.id, cutoff, row.at)),
                None => read.push(row.id),
            }
        }
        let (mark, cutoff, at) = head.ok_or_else(|| Error::MissingMarkRow { channel: channel.to_owned() })?;
        let window = match self.sql.dialect {
            Dialect::MySql | Dialect::Postgres if mark > 0 => {
                read.sort_unstable();
                Window::seeded(mark, at.map(Arc::from), &read)
            }
            // SQLite: one writer, ids visible in commit order; nothing below the mark
            // can appear later. No row on the channel: nothing below 0.
            _ => None,
        };
        self.install(channel, mark, Arc::from(cutoff), Gaps::default(), BTreeMap::new(), window);
        Ok(())
    }

    /// The statement a resume runs before [`resumed`](Self::resumed): its head row
    /// carries, as its cutoff, the server's time minus `retention` (the oldest a row can
    /// be and still be sure to be in the table).
    pub fn resume_sql(&self) -> Statement {
        Statement { sql: self.sql.resume.clone(), binds: vec![self.sql.age_bind(self.config.retention)] }
    }

    /// Subscribes `channel` from a stored `position` (one [`position`](Self::position)
    /// returned, on this connection or another, in this process or another), folding the
    /// rows of [`resume_sql`](Self::resume_sql): the next poll reads every row the
    /// position had not read, so nothing committed since is missed while it is still in
    /// the table. Replaces an earlier subscription of the channel.
    ///
    /// Returns whether a row the position had not read may be gone: its cutoff is older
    /// than the retention (the cleanup may have deleted such a row), so the caller should
    /// resynchronise. Always `false` when retention is zero (cleanup off). Refuses a
    /// position that is not one a subscription of this dialect can be in.
    ///
    /// ```
    /// use notify_table::{Config, Dialect, NotifyTable, Row};
    ///
    /// let mut old = NotifyTable::new(Config::default(), Dialect::MySql)?;
    /// let _ = old.subscribe_sql("jobs")?;
    /// old.subscribed("jobs", vec![Row::head(7, "2026-11-29 11:59:00.000000", "2026-11-29 12:00:00.000000")])?;
    /// let stored = old.position("jobs").expect("subscribed");
    ///
    /// // Later, on a new connection: resume where the old one was.
    /// let mut new = NotifyTable::new(Config::default(), Dialect::MySql)?;
    /// let _stmt = new.resume_sql();
    /// let head = Row::head(0, "2026-11-29 11:30:00.000000", "2026-11-29 12:30:00.000000");
    /// let may_have_lost = new.resumed("jobs", stored.clone(), vec![head])?;
    /// assert!(!may_have_lost, "nothing it had not read is past the retention");
    /// assert_eq!(new.position("jobs"), Some(stored));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resumed(&mut self, channel: &str, position: Position, rows: Vec<Row>) -> Result<bool, Error> {
        let channel = check_channel(channel)?;
        self.check_room_for(channel)?;
        position
            .check(self.sql.dialect.ordered())
            .map_err(|reason| Error::InvalidPosition { channel: channel.to_owned(), reason })?;
        let head = rows.into_iter().find(|row| row.cutoff.is_some()).ok_or(Error::MissingCutoffRow)?;
        let expired = head.cutoff.as_deref().expect("found with a cutoff");
        let may_have_lost = !self.config.retention.is_zero() && *position.cutoff < *expired;
        let Position { mark, cutoff, gaps, ahead, first_window } = position;
        let gaps = Gaps::from_snapshot(gaps);
        let ahead = ahead.into_iter().map(|a| (a.id, a.read_at.map(Arc::from))).collect();
        let window = first_window.map(Window::from_snapshot);
        self.install(channel, mark, Arc::from(cutoff), gaps, ahead, window);
        Ok(may_have_lost)
    }

    fn install(
        &mut self,
        channel: &str,
        mark: u64,
        cutoff: Arc<str>,
        gaps: Gaps,
        ahead: BTreeMap<u64, Option<Arc<str>>>,
        window: Option<Window>,
    ) {
        self.generation += 1;
        let channel: Arc<str> = Arc::from(channel);
        self.subscriptions.insert(
            channel.clone(),
            Subscription { generation: self.generation, channel, mark, cutoff, gaps, ahead, window },
        );
    }

    /// Where the subscription of `channel` stands (see [`Position`]); `None` when it is
    /// not subscribed.
    pub fn position(&self, channel: &str) -> Option<Position> {
        self.subscriptions.get(channel).map(Subscription::position)
    }

    /// Whether the subscription of `channel` is past `id`: a poll read it (or let it go),
    /// or it was already visible when the channel was subscribed. `false` for an id a poll
    /// may still deliver (above the mark, in a gap, or watched by the first window) and
    /// for a channel not subscribed. A transport that learns of a committed row by other
    /// means (a replica's stream of the server's commits) asks this after a poll, to know
    /// whether the poll came too early for it.
    pub fn has_read(&self, channel: &str, id: u64) -> bool {
        let Some(sub) = self.subscriptions.get(channel) else { return false };
        if id > sub.mark {
            return sub.ahead.contains_key(&id);
        }
        !sub.gaps.contains(id) && !sub.window.as_ref().is_some_and(|w| w.missing.contains(id))
    }

    /// Sets the most gaps kept open over all channels, at most (and by default)
    /// [`MAX_GAPS`]; `0` keeps none, so after a run of missing ids every poll re-reads the
    /// rows above it until the run fills or is a lookback old.
    /// A tuning and testing knob: at the bound the poll costs what the old lookback window
    /// did, never exactness.
    pub fn set_max_gaps(&mut self, max_gaps: usize) {
        self.max_gaps = max_gaps.min(MAX_GAPS);
    }

    /// Gaps open over all channels.
    pub fn open_gaps(&self) -> usize {
        self.subscriptions.values().map(|sub| sub.gaps.len()).sum()
    }

    /// Stops polling `channel`; returns whether it was subscribed. Local bookkeeping, no
    /// statement: rows for it that a poll already in flight returns are dropped.
    pub fn unsubscribe(&mut self, channel: &str) -> bool {
        self.subscriptions.remove(channel).is_some()
    }

    /// Stops polling every channel.
    pub fn unsubscribe_all(&mut self) {
        self.subscriptions.clear();
    }

    /// Whether `channel` is subscribed.
    pub fn is_subscribed(&self, channel: &str) -> bool {
        self.subscriptions.contains_key(channel)
    }

    /// How many channels are subscribed.
    pub fn channel_count(&self) -> usize {
        self.subscriptions.len()
    }

    /// The subscribed channels, sorted.
    pub fn channels(&self) -> Vec<&str> {
        let mut channels: Vec<&str> = self.subscriptions.keys().map(|c| &**c).collect();
        channels.sort_unstable();
        channels
    }

    /// The poll statement over every subscribed channel, in one statement, and the token
    /// to fold its rows with; `None` when nothing is subscribed.
    ///
    /// It reads each channel's rows above its mark and (not on SQLite) the open gaps and
    /// first windows' ids of every channel as primary-key ranges: what is new plus what may
    /// still arrive late, not the whole lookback window.
    pub fn poll_sql(&mut self) -> Option<(Statement, PollToken)> {
        let n = self.subscriptions.len();
        if n == 0 {
            return None;
        }
        let ranges: Vec<(u64, u64)> = self
            .subscriptions
            .values()
            .flat_map(|sub| sub.gaps.ranges().chain(sub.window.iter().flat_map(|w| w.missing.ranges())))
            .collect();
        let probes = probes(ranges, MAX_GAPS);
        // Slots come in powers of two so that the statement texts stay few.
        let slots = if probes.is_empty() { 0 } else { probes.len().next_power_of_two().min(MAX_GAPS) };
        if self.poll_texts.0 != n {
            self.poll_texts = (n, HashMap::new());
        }
        let sql =
            self.poll_texts.1.entry(slots).or_insert_with(|| Arc::from(self.sql.poll(n, slots))).clone();
        let mut binds = Vec::with_capacity(1 + slots * 2 + n * 3);
        binds.push(self.sql.age_bind(self.config.lookback));
        for i in 0..slots {
            // An unused slot binds the empty range 1..=0.
            let (first, last) = probes.get(i).copied().unwrap_or((1, 0));
            binds.extend([Value::Int(id_to_int(first)), Value::Int(id_to_int(last))]);
        }
        for sub in self.subscriptions.values() {
            self.sql.poll_binds(&mut binds, &sub.channel, sub.mark);
        }
        self.poll_seq += 1;
        Some((Statement { sql, binds }, PollToken { seq: self.poll_seq, generation: self.generation }))
    }

    /// Folds the rows of the poll statement `token` names and returns the notifications
    /// new to this listener, in id order. Counts one poll towards the next cleanup.
    ///
    /// Rows are matched to channels exactly (MySQL's collation pads trailing spaces, so
    /// the statement returns `'jobs '` for `jobs`); rows of a channel unsubscribed or
    /// subscribed again since the statement was built are dropped with their bookkeeping.
    /// Every row read, of any channel, closes the gaps its id was in. Fails, changing
    /// nothing, on rows without the cutoff row or on a token older than one already folded.
    pub fn polled(&mut self, token: PollToken, rows: Vec<Row>) -> Result<Vec<Notification>, Error> {
        if token.seq <= self.folded_seq {
            return Err(Error::StaleToken { token: token.seq, last: self.folded_seq });
        }
        let head = rows.iter().filter(|row| row.cutoff.is_some()).max_by(|a, b| a.cutoff.cmp(&b.cutoff));
        let Some(head) = head else { return Err(Error::MissingCutoffRow) };
        let cutoff: Arc<str> = Arc::from(head.cutoff.as_deref().expect("filtered on it"));
        let at: Option<Arc<str>> = head.at.as_deref().map(Arc::from);
        self.folded_seq = token.seq;
        self.polls += 1;

        // One entry per id (a row may come back from several branches), with the
        // `created_at` a gap probe's copy carries.
        let mut data: Vec<Row> = Vec::with_capacity(rows.len());
        let mut index: HashMap<u64, usize> = HashMap::with_capacity(rows.len());
        for row in rows {
            if row.cutoff.is_some() {
                continue;
            }
            match index.get(&row.id) {
                Some(&i) => {
                    if data[i].at.is_none() {
                        data[i].at = row.at;
                    }
                }
                None => {
                    index.insert(row.id, data.len());
                    data.push(row);
                }
            }
        }
        data.sort_unstable_by_key(|row| row.id);
        let read: Vec<u64> = data.iter().map(|row| row.id).collect();

        let current = |sub: &Subscription| sub.generation <= token.generation;
        // Rows above each mark, per channel, to move the mark and open gaps below them.
        let mut above: HashMap<Arc<str>, Vec<u64>> = HashMap::new();
        let mut fresh: Vec<(u64, Notification)> = Vec::new();
        let watching: Vec<Arc<str>> = self
            .subscriptions
            .values()
            .filter(|sub| current(sub) && (!sub.gaps.is_empty() || sub.window.is_some()))
            .map(|sub| sub.channel.clone())
            .collect();
        for row in data {
            // A row read closes its id in every other channel's gaps: it is not theirs.
            for channel in watching.iter().filter(|c| ***c != *row.channel) {
                if let Some(sub) = self.subscriptions.get_mut(channel) {
                    sub.gaps.take(row.id);
                    if let Some(window) = &mut sub.window {
                        window.missing.take(row.id);
                    }
                }
            }
            let Some(sub) = self.subscriptions.get_mut(row.channel.as_str()) else { continue };
            if !current(sub) {
                continue;
            }
            let new = if row.id > sub.mark {
                above.entry(sub.channel.clone()).or_default().push(row.id);
                !sub.ahead.contains_key(&row.id)
            } else if sub.gaps.take(row.id) {
                true
            } else if sub.window.as_mut().is_some_and(|window| window.missing.take(row.id)) {
                // Open at subscribe, below its mark: delivered when inserted no earlier
                // than the cutoff this poll was built with, as a re-read of the window
                // (`created_at >= cutoff`) would have found it; otherwise let go.
                row.at.as_deref().is_none_or(|created_at| *created_at >= *sub.cutoff)
            } else {
                // Read before: history, or delivered, or a gap that aged out.
                false
            };
            if new {
                fresh.push((
                    row.id,
                    Notification { channel: row.channel, payload: row.payload, pid: row.pid },
                ));
            }
        }

        let ordered = self.sql.dialect.ordered();
        let mut room = self.max_gaps.saturating_sub(self.open_gaps());
        for sub in self.subscriptions.values_mut() {
            if !current(sub) {
                continue;
            }
            if *cutoff > *sub.cutoff {
                sub.cutoff = cutoff.clone();
            }
            sub.gaps.age_out(&cutoff);
            if sub.window.as_ref().is_some_and(|window| {
                window.missing.is_empty() || window.until.as_deref().is_some_and(|until| *cutoff > *until)
            }) {
                sub.window = None;
            }
            let ids = above.remove(&sub.channel).unwrap_or_default();
            if ids.is_empty() && sub.ahead.is_empty() {
                continue;
            }
            if ordered {
                // Ids visible in commit order: nothing below the highest can come later.
                sub.mark = sub.mark.max(ids.iter().copied().max().unwrap_or(0));
                continue;
            }
            room = advance(sub, ids, &read, at.as_ref(), &cutoff, room);
        }
        fresh.sort_unstable_by_key(|(id, _)| *id);
        Ok(fresh.into_iter().map(|(_, n)| n).collect())
    }

    /// The first half of the retention cleanup, when one is due: the SELECT of the ids of
    /// rows older than `retention`, oldest first, at most `cleanup_limit` of them. Due after
    /// the first poll, then once a minute of polling (counted in polls), and on the very next
    /// poll while the last run deleted a whole batch. `None` when none is due or retention is
    /// zero. Hand the ids it returns to [`delete_sql`](Self::delete_sql).
    ///
    /// The ids are read first, without locks, because a range `DELETE` walking the
    /// `created_at` index waits for a notifier transaction still open at its end, and would
    /// stall this listener's polls for as long.
    pub fn cleanup_sql(&self) -> Option<Statement> {
        if self.config.retention.is_zero() || self.polls < self.next_cleanup {
            return None;
        }
        let binds =
            vec![self.sql.age_bind(self.config.retention), Value::Int(i64::from(self.config.cleanup_limit))];
        Some(Statement { sql: self.sql.cleanup.clone(), binds })
    }

    /// Whether a cleanup is due after the next poll: the last run deleted a whole batch (or
    /// a period of polls is about to end). A transport that polls only when told of a
    /// commit polls anyway when this is true, so that a backlog is worked off.
    pub fn cleanup_due_next_poll(&self) -> bool {
        !self.config.retention.is_zero() && self.polls + 1 >= self.next_cleanup
    }

    /// [`cleanup_sql`](Self::cleanup_sql) that also keeps every row with an id at or
    /// above `floor`: the lowest [`Position::first_unread`] of the positions stored for
    /// listeners that must not lose what they have not read yet (`None`: no floor).
    pub fn cleanup_sql_below(&self, floor: Option<u64>) -> Option<Statement> {
        let Some(floor) = floor else { return self.cleanup_sql() };
        let mut stmt = self.cleanup_sql()?;
        stmt.sql = self.sql.cleanup_below.clone();
        stmt.binds.insert(1, Value::Int(id_to_int(floor)));
        Some(stmt)
    }

    /// [`cleanup_sql`](Self::cleanup_sql) that also keeps, for each `(channel, id)` of
    /// `held`, the channel's rows at or above the id: what the listeners that must not
    /// lose anything have not read yet (the lowest [`Position::first_unread`] stored per
    /// channel). Other channels' rows go as they expire. With more than
    /// [`MAX_HELD_CHANNELS`] channels, every row at or above the lowest of the ids is kept
    /// (the statement stays small; nothing owed is lost).
    pub fn cleanup_sql_holding(&self, held: &[(&str, u64)]) -> Option<Statement> {
        if held.len() > MAX_HELD_CHANNELS {
            return self.cleanup_sql_below(held.iter().map(|&(_, id)| id).min());
        }
        let mut stmt = self.cleanup_sql()?;
        if held.is_empty() {
            return Some(stmt);
        }
        stmt.sql = Arc::from(self.sql.cleanup_holding(held.len()));
        let limit = stmt.binds.pop().expect("the cleanup binds its limit last");
        for &(channel, id) in held {
            stmt.binds.extend([Value::Text(Arc::from(channel)), Value::Int(id_to_int(id))]);
        }
        stmt.binds.push(limit);
        Some(stmt)
    }

    /// The second half of the cleanup: the DELETE of the expired rows `ids` by primary key;
    /// `None` when there are none (report `cleaned(Some(0))`). Report the rows it deleted
    /// to [`cleaned`](Self::cleaned).
    pub fn delete_sql(&self, ids: &[u64]) -> Option<Statement> {
        if ids.is_empty() {
            return None;
        }
        let binds = ids.iter().map(|&id| Value::Int(id_to_int(id))).collect();
        Some(Statement { sql: Arc::from(self.sql.delete(ids.len())), binds })
    }

    /// Records a cleanup run: `Some(rows deleted)`, or `None` when the statement failed.
    /// A whole batch makes the next poll clean up again; anything else waits a period.
    pub fn cleaned(&mut self, affected: Option<u64>) {
        let full = matches!(affected, Some(n) if n >= u64::from(self.config.cleanup_limit));
        self.next_cleanup =
            if full { self.polls + 1 } else { self.polls + self.config.cleanup_period_polls() };
    }

    fn check_room_for(&self, channel: &str) -> Result<(), Error> {
        if self.subscriptions.len() >= MAX_CHANNELS && !self.subscriptions.contains_key(channel) {
            return Err(Error::TooManyChannels { max: MAX_CHANNELS });
        }
        Ok(())
    }
}

/// Moves `sub`'s mark up over the ids `ids` read above it (and those read before, in
/// `ahead`), opening a gap for each run of ids between them that this poll did not read
/// (`read`, sorted, holds every id it did, of any channel). A run's ids were handed out
/// before the id above it was first read, so it ages from that poll's time `at`; one whose
/// time the `cutoff` has passed needs no gap. `room` is how many more gaps may open; when
/// it runs out the mark stops below the first run that did not fit and the ids above it
/// wait in `ahead`, each with the time it was first read, until the run fits or ages out.
/// Returns the room left.
fn advance(
    sub: &mut Subscription,
    ids: Vec<u64>,
    read: &[u64],
    at: Option<&Arc<str>>,
    cutoff: &str,
    mut room: usize,
) -> usize {
    let mut known = std::mem::take(&mut sub.ahead);
    for id in ids {
        known.entry(id).or_insert_with(|| at.cloned());
    }
    let mut ahead = BTreeMap::new();
    let mut cur = sub.mark;
    for (id, read_at) in known {
        if !ahead.is_empty() {
            ahead.insert(id, read_at);
            continue;
        }
        // The ids in cur+1..id that no branch of this poll read, as runs.
        let mut runs = Vec::new();
        let mut from = cur + 1;
        let start = read.partition_point(|&r| r < from);
        for &r in read[start..].iter().take_while(|&&r| r < id) {
            if r > from {
                runs.push((from, r - 1));
            }
            from = r + 1;
        }
        if from < id {
            runs.push((from, id - 1));
        }
        let aged = read_at.as_deref().is_some_and(|t| cutoff > t);
        if !runs.is_empty() && !aged {
            if runs.len() > room {
                ahead.insert(id, read_at);
                continue;
            }
            room -= runs.len();
            for (first, last) in runs {
                sub.gaps.open(first, last, read_at.clone());
            }
        }
        cur = id;
    }
    sub.mark = cur;
    sub.ahead = ahead;
    room
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_refuses_a_table_name_its_index_names_would_truncate() {
        let named = |len: usize| Config { table: "n".repeat(len), ..Config::default() };
        assert!(NotifyTable::new(named(crate::PG_MAX_TABLE_LEN), Dialect::Postgres).is_ok());
        let refused = NotifyTable::new(named(crate::PG_MAX_TABLE_LEN + 1), Dialect::Postgres).unwrap_err();
        assert!(matches!(refused, ConfigError::Invalid { key: "table", .. }), "{refused:?}");
        assert!(NotifyTable::new(named(crate::PG_MAX_TABLE_LEN + 1), Dialect::MySql).is_ok());
    }
}
