//! The table broker: queues are tables, subscriptions claim rows for workers or batches.
//!
//! This module holds the [`Broker`] (one pool, the process's subscriptions and wake-ups)
//! and its [`Queue`]s; what a queue does is in rooms by concept, each entered through
//! `Queue`'s methods:
//!
//! - `publish/`: messages, publishing, publishes that share a statement;
//! - `claim/`: claims, claim-ahead, subscriptions, the runner, waking;
//! - `settle/`: deliveries, leases, acknowledgements, retries, transactional handlers;
//! - `operate/`: the operator's side: deploy, dead letters, pause, history, schedules,
//!   statistics;
//! - `upkeep/`: what a broker does for the queues it claims from: the floors claims start
//!   at, and the retiring of partitions (PostgreSQL).
//!
//! `exec` runs every statement that can deadlock, retried, with errors that name the queue;
//! `telemetry` opens the publish and handler spans and carries trace context in headers;
//! `testing` is the test harness (feature `testing`).

mod claim;
mod exec;
mod operate;
mod publish;
mod settle;
mod telemetry;
#[cfg(feature = "testing")]
pub(crate) mod testing;
mod upkeep;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify_table::{Config as NotifyConfig, DurationRange};
use sqlx::{ConnectOptions as _, Pool, Transaction};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use crate::error::{Error, check_duration};
use crate::listener::{Event, Listener, ListenerHandle, ListenerOptions};
use crate::sql::Notifier;
use crate::sql::TableSql;
use crate::sql::{Db, Finishing};

pub use crate::names::{QueueTable, check_group};
pub use claim::subscription::{DEFAULT_GRACE, Subscription, SubscriptionBuilder};
pub use operate::admin::{GroupStats, NotifyTableStats, TableState};
pub use operate::cancel::{Cancel, Cancelled};
pub use operate::counts::{Counted, QueueCounts};
pub use operate::dead::{DeadLetter, DeadLetterPage, DeadLetters};
pub use operate::history::{
    HISTORY_CLEANUP_BATCH, HISTORY_CLEANUP_INTERVAL, HistoryEntry, HistoryOutcome, HistoryPage, Pruned,
};
pub use operate::horizon::{DeadRows, Holder, HolderKind, QueueHealth, Reading, Unreadable, Wal};
pub use operate::limits::{Limit, LimitScope, LimitStatus, Rate};
pub use operate::messages::{MAX_MESSAGE_PAGE, MessagePage, MessageState, Messages, QueuedMessage};
pub use operate::pause::Paused;
pub use operate::schedule::{
    MAX_SCHEDULE_NAME, MAX_SCHEDULE_PAYLOAD, MIN_EVERY, Schedule, ScheduleChange, ScheduleInfo, When,
};
pub use operate::scheduler::{SCHEDULE_HEADER, TICK_HEADER};
pub use operate::stats::{ClaimFailure, Stats};
pub use publish::message::{Headers, MAX_KEY_CHARS, Message, Published, TIMEOUT_HEADER};
pub use settle::control::StopReason;
pub use settle::delivery::{BatchOutcome, Delivery, Outcome, Received, TxMessage};
pub use settle::retry::RetryPolicy;
pub use telemetry::{TRACEPARENT, TRACESTATE};

use claim::wake::Wakers;
use operate::stats::Counters;
use publish::wakes::WakeSender;

/// How a [`Broker`] claims, leases, retries and wakes.
#[derive(Clone)]
pub struct BrokerOptions {
    /// The longest a subscription waits between two claims when nothing wakes it: the
    /// floor under every wake-up. A subscription may set its own. At least
    /// [`MIN_POLL_INTERVAL`](crate::limits::MIN_POLL_INTERVAL) (1 ms).
    pub poll_interval: Duration,
    /// How long a claimed message stays with its worker before it comes back: greater
    /// than zero, at most [`MAX_DURATION`](crate::limits::MAX_DURATION) (100 years).
    pub lease: Duration,
    /// Retries and dead letters; its `max_delay` at most
    /// [`MAX_DURATION`](crate::limits::MAX_DURATION).
    pub retry: RetryPolicy,
    /// Wake subscriptions in other processes too: PostgreSQL's LISTEN/NOTIFY, the notify
    /// table on MySQL/MariaDB and SQLite. Costs one connection for the broker's life; on
    /// MySQL/MariaDB and SQLite one more statement per publish (a notify-table row, in the
    /// publish's transaction), on PostgreSQL a `pg_notify` sent after the publish
    /// committed, apart from it, by one task of the broker that gathers the wake-ups of
    /// concurrent publishes into one statement (at most one about every millisecond).
    pub listen_notify: bool,
    /// The notify table `listen_notify` uses on MySQL/MariaDB and SQLite, polled at its
    /// own `poll_interval` (50 ms by default) with the default `lookback` (60 s): a poll
    /// reads the rows that are new and the ids that may still commit late, not the whole
    /// window, so the lookback costs nothing while publishes commit promptly (except for
    /// the first lookback after the listening connection connects, when each poll also
    /// reads the channels' recent rows below their marks; see docs/notify-table.md). A
    /// wake-up whose publishing transaction stayed open longer than the lookback may be
    /// missed, and the subscription then finds the message at its poll interval.
    pub notify_table: NotifyConfig,
    /// The URL `listen_notify`'s connection is made from; by default the pool's connect
    /// options. A pool through PgBouncer in transaction pooling mode (`pgbouncer=true`)
    /// needs it: LISTEN needs a session of its own, so give a direct URL to the server
    /// (without it, `listen_notify` is refused with [`Error::NeedsSession`]). Set it to the URL the pool was made from when that URL lists several
    /// hosts (`postgres://h1,h2/db?target_session_attrs=read-write`): the pool's options
    /// name only the host it settled on, and with the list the listening connection goes
    /// through the hosts again on every reconnect.
    pub listen_url: Option<String>,
    /// How long a failed claim waits before the next.
    pub claim_error_wait: Duration,
    /// Publish the due ticks of the schedules ([`Queue::schedule`]) of every queue this
    /// broker consumes (on by default; a subscription may turn it off for itself with
    /// [`SubscriptionBuilder::schedules`]). However many brokers do, each tick is
    /// published once.
    pub run_schedules: bool,
    /// How often a broker running schedules reads their definitions again: a schedule
    /// added, changed or removed by another process is seen within it (changes made
    /// through this broker at once). At least 1 ms.
    pub schedule_reread: Duration,
}

// By hand: `listen_url` may hold a password, which a debug print must not show.
impl std::fmt::Debug for BrokerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerOptions")
            .field("poll_interval", &self.poll_interval)
            .field("lease", &self.lease)
            .field("retry", &self.retry)
            .field("listen_notify", &self.listen_notify)
            .field("notify_table", &self.notify_table)
            .field("listen_url", &self.listen_url.as_deref().map(crate::backend::redact))
            .field("claim_error_wait", &self.claim_error_wait)
            .field("run_schedules", &self.run_schedules)
            .field("schedule_reread", &self.schedule_reread)
            .finish()
    }
}

impl Default for BrokerOptions {
    fn default() -> Self {
        BrokerOptions {
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            listen_notify: false,
            // Wake-ups are latency: poll often. A poll reads what is new (and its open
            // gaps), so the default lookback costs no more than a short one.
            notify_table: NotifyConfig {
                poll_interval: Duration::from_millis(50),
                ..NotifyConfig::default()
            },
            listen_url: None,
            claim_error_wait: Duration::from_secs(1),
            run_schedules: true,
            schedule_reread: Duration::from_secs(5),
        }
    }
}

impl BrokerOptions {
    /// Refuses a duration out of its range with [`Error::InvalidDuration`] naming it: a
    /// lease of zero or over [`MAX_DURATION`](crate::limits::MAX_DURATION), a retry
    /// `max_delay` over it, a poll interval under
    /// [`MIN_POLL_INTERVAL`](crate::limits::MIN_POLL_INTERVAL). [`Broker::new`] calls it.
    pub fn validate(&self) -> Result<(), Error> {
        check_duration("poll_interval", self.poll_interval, DurationRange::PollInterval)?;
        check_duration("lease", self.lease, DurationRange::Positive)?;
        check_duration("retry.max_delay", self.retry.max_delay, DurationRange::Span)?;
        check_duration("schedule_reread", self.schedule_reread, DurationRange::PollInterval)
    }
}

/// A table broker on one sqlx pool: queues in tables, subscriptions that claim, waking,
/// leases, retries, dead letters, transactional handlers.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), rowbus::Error> {
/// use rowbus::{Broker, BrokerOptions, Message};
/// let broker = Broker::new(pool, BrokerOptions { listen_notify: true, ..Default::default() }).await?;
/// let jobs = broker.queue("jobs")?;
/// jobs.deploy().await?;
/// jobs.publish(Message::text("hello")).await?;
/// jobs.subscribe().workers(8).run(|delivery| async move {
///     println!("{}", delivery.text()?);
///     Ok::<_, rowbus::Error>(())
/// }).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Broker<DB: Db> {
    inner: Arc<Inner<DB>>,
}

impl<DB: Db> Clone for Broker<DB> {
    fn clone(&self) -> Self {
        Broker { inner: self.inner.clone() }
    }
}

#[derive(Debug)]
pub(crate) struct Inner<DB: Db> {
    pub pool: Pool<DB>,
    pub options: BrokerOptions,
    pub wakers: Arc<Wakers>,
    pub counters: Counters,
    /// The schedulers running in this broker, by queue.
    pub schedulers: operate::schedulers::Schedulers,
    /// The upkeep of the queues this broker claims from: floors, partitions.
    pub upkeep: upkeep::registry::Upkeeps,
    /// The database's clock as this process sees it, for the starts rates plan.
    pub db_clock: claim::limited::DbClock,
    tables: Mutex<HashMap<QueueTable, Arc<TableSql<DB>>>>,
    /// Each queue's keep setting as this broker last read it.
    keeping: Mutex<HashMap<QueueTable, Arc<operate::keeping::Keeping>>>,
    /// Each queue's autocommitted publishes on their way.
    publishing: Mutex<HashMap<QueueTable, Arc<publish::coalesce::Coalescer>>>,
    /// Wakes other processes: set when `listen_notify` is on.
    pub notifier: Option<Notifier>,
    /// Sends other processes' wake-ups apart from the publishing transactions: set when
    /// `listen_notify` is on and the database wakes apart
    /// ([`Waking::WAKES_APART`](crate::sql::Waking::WAKES_APART)).
    pub wakes: Option<WakeSender>,
    pub listen: Option<ListenerHandle>,
    listen_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub shutdown: watch::Sender<bool>,
    /// When [`Broker::shutdown`]'s deadline passes, once it was called.
    shutdown_by: Mutex<Option<tokio::time::Instant>>,
    /// The latest failed claim of any subscription.
    pub claim_failure: watch::Sender<Option<ClaimFailure>>,
    /// The largest statement the database takes, once read.
    pub statement_limit: tokio::sync::OnceCell<u64>,
    /// Where transactional claims wait their turn on a database with one writer
    /// ([`Claiming::ONE_WRITER`](crate::sql::Claiming::ONE_WRITER)), and the transaction
    /// they share.
    pub turns: settle::turns::Turns<DB>,
    /// Runners still running, and a signal when one ends.
    pub running: AtomicUsize,
    pub ended: Notify,
    tokens: AtomicU64,
    token_keys: std::hash::RandomState,
}

impl<DB: Db> Inner<DB> {
    /// A lease token no other claim, here or in another process, has.
    pub fn token(&self) -> i64 {
        let n = self.tokens.fetch_add(1, Ordering::Relaxed);
        (self.token_keys.hash_one(n) & (i64::MAX as u64)) as i64
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// How long a runner that stops lets its handlers in flight finish: its own shutdown
    /// timeout, or what is left of [`Broker::shutdown`]'s deadline when that is shorter.
    pub fn drain_timeout(&self, own: Duration) -> Duration {
        match *self.shutdown_by.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(by) => own.min(by.saturating_duration_since(tokio::time::Instant::now())),
            None => own,
        }
    }

    /// Counts a failed claim of `table` and tells [`Broker::claim_failures`]'s watchers.
    pub fn claim_failed(&self, table: &QueueTable, error: &Error) {
        self.counters.claim_failed();
        let failure = ClaimFailure {
            table: table.to_string(),
            error: error.one_line(),
            permanent: error.is_permanent(),
        };
        self.claim_failure.send_replace(Some(failure));
    }
}

impl<DB: Db> Broker<DB> {
    /// A broker on `pool`. With `listen_notify`, connects the listening connection now
    /// (from [`BrokerOptions::listen_url`], else the pool's connect options) and keeps it until [`shutdown`](Self::shutdown).
    /// Options out of range are refused first ([`BrokerOptions::validate`]).
    pub async fn new(pool: Pool<DB>, options: BrokerOptions) -> Result<Self, Error> {
        options.validate()?;
        let mut notifier = None;
        let mut listener = None;
        if options.listen_notify {
            let url = match &options.listen_url {
                Some(url) => url.clone(),
                None if DB::through_pgbouncer(&pool) => {
                    return Err(Error::NeedsSession { feature: "listen_notify" });
                }
                None => pool.connect_options().to_url_lossy().to_string(),
            };
            if crate::backend::uses_pgbouncer(&url)? {
                return Err(Error::NeedsSession { feature: "listen_notify" });
            }
            notifier = Some(Notifier::new(options.notify_table.clone())?);
            let listener_options =
                ListenerOptions { notify_table: options.notify_table.clone(), ..Default::default() };
            listener = Some(Listener::connect_with(&url, listener_options).await?);
        }
        let wakes = (notifier.is_some() && DB::WAKES_APART).then(|| WakeSender::start(pool.clone()));
        let inner = Arc::new(Inner {
            pool,
            options,
            wakers: Arc::default(),
            counters: Counters::default(),
            schedulers: operate::schedulers::Schedulers::default(),
            upkeep: upkeep::registry::Upkeeps::default(),
            db_clock: claim::limited::DbClock::default(),
            tables: Mutex::default(),
            keeping: Mutex::default(),
            publishing: Mutex::default(),
            notifier,
            wakes,
            listen: listener.as_ref().map(Listener::handle),
            listen_task: Mutex::default(),
            shutdown: watch::Sender::new(false),
            claim_failure: watch::Sender::new(None),
            statement_limit: tokio::sync::OnceCell::new(),
            turns: settle::turns::Turns::default(),
            running: AtomicUsize::new(0),
            shutdown_by: Mutex::new(None),
            ended: Notify::new(),
            tokens: AtomicU64::new(0),
            token_keys: std::hash::RandomState::new(),
        });
        if let Some(listener) = listener {
            let task = tokio::spawn(wake_from_notifications(listener, inner.wakers.clone()));
            *inner.listen_task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        }
        Ok(Broker { inner })
    }

    /// The queue in table `name` (`jobs`, or `app.jobs` where the database has schemas).
    pub fn queue(&self, name: &str) -> Result<Queue<DB>, Error> {
        let table: QueueTable = name.parse()?;
        let mut tables = self.inner.tables.lock().unwrap_or_else(|e| e.into_inner());
        let sql = match tables.get(&table) {
            Some(sql) => sql.clone(),
            None => {
                let sql = Arc::new(TableSql::new(&table)?);
                tables.insert(table, sql.clone());
                sql
            }
        };
        drop(tables);
        let mut keeping = self.inner.keeping.lock().unwrap_or_else(|e| e.into_inner());
        let keeping = keeping.entry(sql.table.clone()).or_default().clone();
        let mut publishing = self.inner.publishing.lock().unwrap_or_else(|e| e.into_inner());
        let publishing = publishing.entry(sql.table.clone()).or_default().clone();
        Ok(Queue { broker: self.clone(), sql, keeping, publishing })
    }

    /// The pool the broker works on.
    pub fn pool(&self) -> &Pool<DB> {
        &self.inner.pool
    }

    /// The broker's options.
    pub fn options(&self) -> &BrokerOptions {
        &self.inner.options
    }

    /// What the broker has done so far.
    pub fn stats(&self) -> Stats {
        self.inner.counters.snapshot(self.inner.wakers.woken.load(Ordering::Relaxed))
    }

    /// The latest failed claim of any of this broker's subscriptions, as it changes
    /// (`None` until one fails). A runner goes on claiming after a failure, waiting
    /// [`claim_error_wait`](BrokerOptions::claim_error_wait) first; watch this to report
    /// why, or to stop on a failure that will not heal ([`ClaimFailure::permanent`]).
    pub fn claim_failures(&self) -> watch::Receiver<Option<ClaimFailure>> {
        self.inner.claim_failure.subscribe()
    }

    /// How the listening connection (`listen_notify`) learns of other processes'
    /// publishes, and what that has cost (see [`Listener::wake_stats`]); `None` without
    /// `listen_notify`.
    pub fn wake_stats(&self) -> Option<crate::listener::WakeStats> {
        self.inner.listen.as_ref().map(ListenerHandle::wake_stats)
    }

    /// The server's id of the listening connection's session (`listen_notify`), for
    /// monitoring or to terminate it; `None` without `listen_notify`, on SQLite, or while
    /// it reconnects.
    pub fn listen_session_id(&self) -> Option<u64> {
        self.inner.listen.as_ref().and_then(ListenerHandle::session_id)
    }

    /// Starts a transaction whose publishes wake subscriptions when it commits, and never
    /// if it rolls back. Run your own statements on it too (`&mut *tx`).
    pub async fn begin(&self) -> Result<BrokerTx<DB>, Error> {
        let tx = crate::sql::begin(&self.inner.pool, DB::WRITE_BEGIN).await?;
        Ok(BrokerTx { broker: self.clone(), tx: Some(tx), woken: Vec::new() })
    }

    /// Stops every subscription of this broker: no new claims; handlers in flight get
    /// until `deadline` to finish; claimed messages not yet started are given back at
    /// once; then the wake-ups of other processes still pending are sent and the
    /// listening connection is closed. Returns when every runner has ended (or the
    /// deadline passed). The broker still publishes afterwards; its wake-ups of other
    /// processes then go out one publish at a time.
    pub async fn shutdown(&self, deadline: Duration) {
        info!("broker shutting down");
        let by = tokio::time::Instant::now() + deadline;
        {
            let mut set = self.inner.shutdown_by.lock().unwrap_or_else(|e| e.into_inner());
            *set = Some(set.map_or(by, |earlier| earlier.min(by)));
        }
        self.inner.shutdown.send_replace(true);
        let until = by + Duration::from_millis(500);
        while self.inner.running.load(Ordering::Acquire) > 0 {
            let ended = self.inner.ended.notified();
            if self.inner.running.load(Ordering::Acquire) == 0 {
                break;
            }
            if tokio::time::timeout_at(until, ended).await.is_err() {
                warn!("runners still running after the shutdown deadline");
                break;
            }
        }
        if let Some(wakes) = &self.inner.wakes {
            wakes.stop(WAKES_FLUSH_WAIT).await;
        }
        let task = self.inner.listen_task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            task.abort();
        }
    }
}

/// The longest [`Broker::shutdown`] waits for the pending wake-ups of other processes to
/// be sent.
const WAKES_FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Receives the listening connection's notifications and wakes the subscriptions they
/// name; after a reconnect, wakes every subscription once.
async fn wake_from_notifications(mut listener: Listener, wakers: Arc<Wakers>) {
    loop {
        match listener.recv().await {
            Ok(Event::Notification(n) | Event::Transient(n)) => {
                let group = (!n.payload.is_empty()).then_some(n.payload.as_str());
                let woken = wakers.wake(&n.channel, group);
                debug!(table = %n.channel, group = n.payload, woken, "woken by a notification");
            }
            Ok(Event::Disconnected(error)) => warn!(%error, "broker listening connection lost"),
            Ok(Event::Reconnected { .. } | Event::Stopped { .. }) => {
                let woken = wakers.wake_all();
                info!(woken, "broker listening connection back: woke every subscription");
            }
            Err(_) => return,
        }
    }
}

/// One queue table of a [`Broker`].
#[derive(Debug)]
pub struct Queue<DB: Db> {
    broker: Broker<DB>,
    sql: Arc<TableSql<DB>>,
    keeping: Arc<operate::keeping::Keeping>,
    publishing: Arc<publish::coalesce::Coalescer>,
}

impl<DB: Db> Clone for Queue<DB> {
    fn clone(&self) -> Self {
        Queue {
            broker: self.broker.clone(),
            sql: self.sql.clone(),
            keeping: self.keeping.clone(),
            publishing: self.publishing.clone(),
        }
    }
}

impl<DB: Db> Queue<DB> {
    /// The table.
    pub fn table(&self) -> &QueueTable {
        &self.sql.table
    }

    /// The broker this queue belongs to.
    pub fn broker(&self) -> &Broker<DB> {
        &self.broker
    }

    pub(crate) fn inner(&self) -> &Arc<Inner<DB>> {
        &self.broker.inner
    }
}

/// Why a [`BrokerTx`] holds no transaction while it is still there.
const ABANDONED: &str = "a BrokerTx is usable until commit or rollback consumes it, or a publish in it \
                         dropped part way rolls it back";

/// A transaction of a [`Broker`]: publishes inside it wake subscriptions after it commits,
/// never before and never if it rolls back. Dereferences to the connection, so your own
/// statements run in it too: `sqlx::query(...).execute(&mut *tx)`.
pub struct BrokerTx<DB: Db> {
    broker: Broker<DB>,
    tx: Option<Transaction<'static, DB>>,
    /// (table channel, group) pairs published in this transaction.
    pub(in crate::broker) woken: Vec<(Arc<str>, String)>,
}

impl<DB: Db> std::fmt::Debug for BrokerTx<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerTx").field("pending_wakeups", &self.woken.len()).finish()
    }
}

impl<DB: Db> BrokerTx<DB> {
    /// The transaction, until commit or rollback consumes it, or a publish dropped part
    /// way takes it with it ([`Error::TransactionAbandoned`]).
    pub(in crate::broker) fn take_tx(&mut self) -> Result<Transaction<'static, DB>, Error> {
        self.tx.take().ok_or(Error::TransactionAbandoned)
    }

    /// The transaction, for statements of the caller's own.
    fn tx(&mut self) -> &mut Transaction<'static, DB> {
        self.tx.as_mut().expect(ABANDONED)
    }

    /// Gives back the transaction [`take_tx`](Self::take_tx) took.
    pub(in crate::broker) fn put_tx(&mut self, tx: Transaction<'static, DB>) {
        self.tx = Some(tx);
    }

    /// Commits; then wakes the subscriptions of every table and group published to: this
    /// broker's at once, and with `listen_notify` other processes' (on PostgreSQL by a
    /// notification sent after the commit, apart from the transaction).
    ///
    /// Runs to its end when its future is dropped once polled (then nobody is woken).
    /// After a publish in it was dropped part way, commits nothing:
    /// [`Error::TransactionAbandoned`].
    pub async fn commit(mut self) -> Result<(), Error> {
        let tx = self.take_tx()?;
        Finishing::new(|_| tx.commit()).await?;
        let inner = &self.broker.inner;
        for (table, group) in &self.woken {
            inner.wakers.wake(table, Some(group));
        }
        if let Some(wakes) = &inner.wakes {
            wakes.wake(&inner.pool, &self.woken).await;
        }
        Ok(())
    }

    /// Rolls back: nothing published in it is seen, nobody is woken.
    pub async fn rollback(mut self) -> Result<(), Error> {
        match self.take_tx() {
            Ok(tx) => Ok(Finishing::new(|_| tx.rollback()).await?),
            // Rolled back already, where the publish dropped part way ended.
            Err(_) => Ok(()),
        }
    }
}

impl<DB: Db> std::ops::Deref for BrokerTx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.tx.as_ref().expect(ABANDONED)
    }
}

impl<DB: Db> std::ops::DerefMut for BrokerTx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.tx()
    }
}
