//! Wake-ups of other processes sent apart from the transactions that publish, where the
//! database's notification takes a server-wide lock at commit (PostgreSQL's NOTIFY,
//! [`Waking::WAKES_APART`](crate::sql::Waking::WAKES_APART)).
//!
//! A transaction that notifies serialises its commit with every other notifying one:
//! measured with pgbench, 8 clients, a one-row INSERT committed 7,661 times a second and
//! the same with `SELECT pg_notify('q', '')` in its transaction 2,170 (0.28x). So a publish
//! (autocommitted, or a `BrokerTx` once its commit succeeded) hands the (table, group) it
//! wakes to the broker's one [`WakeSender`], and the transaction stays free of it. The
//! sender's task keeps the pending pairs, each once, and sends them with `pg_notify`, all
//! of them in one statement on a pooled connection of the broker: at once when it is idle,
//! otherwise when [`GAP`] has passed since its previous statement began, carrying
//! everything that arrived meanwhile. One notifying commit a millisecond at most, however
//! many publishes.
//!
//! A subscription woken this way claims after the publish committed, as before: the
//! notification is sent only after the commit. In this process a publish still wakes its
//! subscriptions directly, at once. When the broker shuts down, the task sends what is
//! pending and ends; a wake-up asked for after that is sent by its caller, on a pooled
//! connection.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::Pool;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::driver::Arg;
use crate::sql::Db;

/// The least time between the starts of two of the sender's statements. A publish alone
/// is not delayed by it (an idle sender sends at once); under load it bounds the
/// notifying commits to about a thousand a second.
pub(crate) const GAP: Duration = Duration::from_millis(1);

/// The most (table, group) pairs one statement carries (two binds each); more go in the
/// statements right after it.
pub(crate) const PAIRS_PER_STATEMENT: usize = 64;

/// A wake-up to send: the table's channel and the group (empty: every group).
pub(crate) type Pair = (Arc<str>, String);

/// The wake-ups waiting to be sent, and when the next statement may go: the sender's
/// logic, with the time passed in.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// In order of arrival, each once.
    pairs: Vec<Pair>,
    seen: HashSet<Pair>,
    /// When the latest statement began.
    last: Option<Instant>,
}

impl Pending {
    /// Adds a wake-up; false when it is pending already (the next statement carries it).
    pub fn add(&mut self, table: &Arc<str>, group: &str) -> bool {
        let pair = (table.clone(), group.to_owned());
        if !self.seen.insert(pair.clone()) {
            return false;
        }
        self.pairs.push(pair);
        true
    }

    /// How many are pending.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// When the next statement may go: `None` with nothing pending; `now` when no
    /// statement began within [`GAP`]; else [`GAP`] after the latest began.
    pub fn due(&self, now: Instant) -> Option<Instant> {
        if self.pairs.is_empty() {
            return None;
        }
        match self.last {
            Some(last) if now < last + GAP => Some(last + GAP),
            _ => Some(now),
        }
    }

    /// The next statement's wake-ups (at most [`PAIRS_PER_STATEMENT`]) if it is due at
    /// `now`, its start then recorded; empty otherwise. A pair taken may be added again
    /// at once: a publish that commits while the statement is on its way needs a
    /// notification sent after its commit.
    pub fn take(&mut self, now: Instant) -> Vec<Pair> {
        if self.due(now).is_none_or(|due| due > now) {
            return Vec::new();
        }
        let n = self.pairs.len().min(PAIRS_PER_STATEMENT);
        let taken: Vec<Pair> = self.pairs.drain(..n).collect();
        for pair in &taken {
            self.seen.remove(pair);
        }
        // The rest of a long line goes at once after this statement, as one burst.
        if self.pairs.is_empty() {
            self.last = Some(now);
        }
        taken
    }
}

/// What the broker and the sender's task share.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Told when a wake-up is added or the sender stops.
    ready: Notify,
}

#[derive(Debug, Default)]
struct State {
    pending: Pending,
    /// Set at shutdown (or when the broker goes away): the task sends what is pending
    /// and ends, and no wake-up is taken any more.
    stopped: bool,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The broker's sender of wake-ups to other processes (see the module's documentation):
/// one task for the broker's life, ended by [`stop`](Self::stop) or when the broker is
/// dropped.
pub(crate) struct WakeSender {
    shared: Arc<Shared>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for WakeSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("WakeSender")
            .field("pending", &state.pending.len())
            .field("stopped", &state.stopped)
            .finish()
    }
}

impl WakeSender {
    /// Starts the task, which sends on connections of `pool`.
    pub fn start<DB: Db>(pool: Pool<DB>) -> Self {
        let shared = Arc::new(Shared::default());
        let task = tokio::spawn(run(shared.clone(), pool));
        WakeSender { shared, task: Mutex::new(Some(task)) }
    }

    /// Wakes the subscriptions of `pairs` in other processes: queued for the task, or,
    /// once it stopped, sent now on a connection of `pool`. Call it after the rows it
    /// announces committed. A failure is logged: the poll interval still reaches them.
    pub async fn wake<DB: Db>(&self, pool: &Pool<DB>, pairs: &[Pair]) {
        if pairs.is_empty() {
            return;
        }
        let queued = {
            let mut state = self.shared.lock();
            if !state.stopped {
                for (table, group) in pairs {
                    state.pending.add(table, group);
                }
            }
            !state.stopped
        };
        if queued {
            self.shared.ready.notify_one();
            return;
        }
        for chunk in pairs.chunks(PAIRS_PER_STATEMENT) {
            send(pool, chunk, &mut Statements::default()).await;
        }
    }

    /// Stops the sender: what is pending is sent, then the task ends; waits for it at
    /// most `wait` (then ends it). Later wake-ups are sent by their callers.
    pub async fn stop(&self, wait: Duration) {
        self.close();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut task) = task
            && tokio::time::timeout(wait, &mut task).await.is_err()
        {
            warn!("wake-up sender still sending at shutdown; stopped");
            task.abort();
        }
    }

    fn close(&self) {
        self.shared.lock().stopped = true;
        self.shared.ready.notify_one();
    }
}

impl Drop for WakeSender {
    /// The broker is gone: the task sends what is pending and ends.
    fn drop(&mut self) {
        self.close();
    }
}

/// The task: waits for wake-ups, and sends them as [`Pending`] says, until stopped and
/// nothing is left.
async fn run<DB: Db>(shared: Arc<Shared>, pool: Pool<DB>) {
    let mut statements = Statements::default();
    loop {
        let now = Instant::now();
        let (pairs, due) = {
            let mut state = shared.lock();
            let due = state.pending.due(now);
            if due.is_none() && state.stopped {
                return;
            }
            (state.pending.take(now), due)
        };
        if !pairs.is_empty() {
            send(&pool, &pairs, &mut statements).await;
            continue;
        }
        match due {
            Some(at) => tokio::time::sleep_until(at.into()).await,
            // A permit is kept when nobody waits: a wake-up added since the look above
            // is not missed.
            None => shared.ready.notified().await,
        }
    }
}

/// The statements by how many pairs they carry, built once.
#[derive(Default)]
struct Statements(Vec<Arc<str>>);

impl Statements {
    fn carrying<DB: Db>(&mut self, pairs: usize) -> Option<Arc<str>> {
        while self.0.len() < pairs {
            self.0.push(Arc::from(DB::wakes_sql(self.0.len() + 1)?));
        }
        self.0.get(pairs - 1).cloned()
    }
}

/// Sends `pairs` in one statement on a connection of `pool`; a failure is logged.
async fn send<DB: Db>(pool: &Pool<DB>, pairs: &[Pair], statements: &mut Statements) {
    let checked: Vec<&Pair> = pairs
        .iter()
        .filter(|(table, group)| match DB::check_wake(table, group) {
            Ok(()) => true,
            Err(error) => {
                warn!(%error, table = &**table, group, "wake-up notification refused; subscriptions elsewhere wait for their poll interval");
                false
            }
        })
        .collect();
    if checked.is_empty() {
        return;
    }
    let Some(sql) = statements.carrying::<DB>(checked.len()) else { return };
    let args: Vec<Arg<'_>> =
        checked.iter().flat_map(|(table, group)| [Arg::Text(table), Arg::Text(group)]).collect();
    let sent = match pool.acquire().await {
        Ok(mut conn) => DB::execute(&mut conn, &sql, &args).await.map(drop),
        Err(e) => Err(e),
    };
    if let Err(error) = sent {
        warn!(%error, wakeups = checked.len(), "wake-up notifications failed; subscriptions elsewhere wait for their poll interval");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(taken: &[Pair]) -> Vec<(&str, &str)> {
        taken.iter().map(|(t, g)| (&**t, g.as_str())).collect()
    }

    #[test]
    fn an_idle_sender_sends_at_once() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        assert_eq!(p.due(t0), None);
        assert!(p.take(t0).is_empty());
        let jobs: Arc<str> = Arc::from("jobs");
        assert!(p.add(&jobs, "a"));
        assert_eq!(p.due(t0), Some(t0));
        assert_eq!(pairs(&p.take(t0)), [("jobs", "a")]);
        assert_eq!(p.due(t0), None);
        // Long after the latest statement: at once again.
        p.add(&jobs, "a");
        let later = t0 + GAP * 5;
        assert_eq!(p.due(later), Some(later));
        assert_eq!(p.take(later).len(), 1);
    }

    #[test]
    fn within_the_gap_wakeups_gather_each_once() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        let (jobs, mail): (Arc<str>, Arc<str>) = (Arc::from("jobs"), Arc::from("mail"));
        p.add(&jobs, "");
        assert_eq!(p.take(t0).len(), 1);
        // Arrivals during the gap wait for its end, each pair once.
        let soon = t0 + GAP / 4;
        assert!(p.add(&jobs, ""));
        assert!(p.add(&mail, "g"));
        assert!(!p.add(&jobs, ""));
        assert!(p.add(&jobs, "g"));
        assert!(!p.add(&mail, "g"));
        assert_eq!(p.due(soon), Some(t0 + GAP));
        assert!(p.take(soon).is_empty(), "not before the gap has passed");
        assert_eq!(p.len(), 3);
        let taken = p.take(t0 + GAP);
        assert_eq!(pairs(&taken), [("jobs", ""), ("mail", "g"), ("jobs", "g")]);
        assert_eq!(p.due(t0 + GAP), None);
        // Taken, a pair may come again: it goes in the next statement.
        assert!(p.add(&jobs, ""));
        assert_eq!(p.due(t0 + GAP), Some(t0 + GAP * 2));
    }

    #[test]
    fn a_long_line_goes_in_statements_one_after_another() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        let jobs: Arc<str> = Arc::from("jobs");
        for g in 0..PAIRS_PER_STATEMENT * 2 + 1 {
            p.add(&jobs, &g.to_string());
        }
        assert_eq!(p.take(t0).len(), PAIRS_PER_STATEMENT);
        // The rest of the line is due at once, not a gap later.
        assert_eq!(p.due(t0), Some(t0));
        assert_eq!(p.take(t0).len(), PAIRS_PER_STATEMENT);
        let last = p.take(t0);
        assert_eq!(pairs(&last), [("jobs", "128")]);
        assert_eq!(p.len(), 0);
        // The burst counts as one statement for the gap.
        p.add(&jobs, "x");
        assert_eq!(p.due(t0), Some(t0 + GAP));
    }
}
