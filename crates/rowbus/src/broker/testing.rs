//! A harness for testing handlers and publishers (feature `testing`), in the spirit of
//! Oban.Testing and rivertest: a [`TestBroker`] on a SQLite file of its own or on a given
//! database with queues of its own, dropped at the end (also when the test fails);
//! [`drain`](TestBroker::drain) runs a handler inline on every ready message and says what
//! happened to each; [`make_due`](TestBroker::make_due) and
//! [`run_schedules_now`](TestBroker::run_schedules_now) bring delayed messages and
//! schedule ticks forward without sleeping; [`published`](TestBroker::published) and
//! [`assert_published`](TestBroker::assert_published) read what a publisher wrote without
//! claiming it, and [`insert_only`](TestBroker::insert_only) keeps every consumer off a
//! queue meanwhile.
//!
//! ```no_run
//! # async fn f() -> Result<(), rowbus::Error> {
//! use rowbus::testing::{Handled, TestBroker};
//! use rowbus::{Message, Outcome};
//!
//! let test = TestBroker::sqlite().await?;
//! let jobs = test.queue("jobs").await?;
//! jobs.publish(Message::text("ok")).await?;
//! jobs.publish(Message::text("fail")).await?;
//! let drained = test
//!     .drain(&jobs, |d| async move {
//!         match d.text()? {
//!             "ok" => Ok(Outcome::Ack),
//!             _ => Err(rowbus::Error::Payload { id: d.id(), reason: "no".into() }),
//!         }
//!     })
//!     .await?;
//! assert!(matches!(drained[0].handled, Handled::Acked));
//! assert!(matches!(drained[1].handled, Handled::Retried { .. }));
//! test.cleanup().await?;
//! # Ok(()) }
//! ```

use std::fmt::Display;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::broker::claim::runner::outcome;
use crate::broker::claim::subscription::Claimer;
use crate::broker::operate::scheduler::publish_next_ticks;
use crate::broker::{
    Broker, BrokerOptions, Delivery, MAX_MESSAGE_PAGE, MessagePage, Outcome, Queue, QueuedMessage,
};
use crate::driver::Arg;
use crate::error::Error;
use crate::sql::{Db, DbPool, OnPool};

/// What became of one drained message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Handled {
    /// Acknowledged: deleted.
    Acked,
    /// Failed or asked to run again: back in the queue, visible after `after`
    /// ([`TestBroker::make_due`] brings it forward). `error` is the handler's error, if
    /// it failed.
    Retried {
        /// The delay before it runs again.
        after: Duration,
        /// The handler's error, when it failed.
        error: Option<String>,
    },
    /// Failed its last attempt: moved to the dead letters with `error`.
    DeadLettered {
        /// The handler's error.
        error: String,
    },
    /// Dropped by the handler ([`Outcome::Drop`]): deleted, not dead-lettered.
    Dropped,
    /// Snoozed by the handler ([`Outcome::Snooze`]): back in the queue after `after`, its
    /// attempt not counted.
    Snoozed {
        /// The delay before it runs again.
        after: Duration,
    },
}

/// One message [`TestBroker::drain`] ran, in the order it ran them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// The message's id.
    pub id: i64,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The attempt that ran (1 for the first).
    pub attempt: u32,
    /// What became of it.
    pub handled: Handled,
}

/// A broker for tests, with queues of its own that [`cleanup`](Self::cleanup) drops (and,
/// when a test fails before it, the drop of the `TestBroker`). It starts no subscription:
/// messages stay where they are until [`drain`](Self::drain) runs them, so a test can read
/// what its code published.
#[derive(Debug)]
pub struct TestBroker<DB: Db> {
    broker: Broker<DB>,
    url: String,
    queues: Mutex<Vec<String>>,
    file: Option<PathBuf>,
    cleaned: bool,
}

#[cfg(feature = "sqlite")]
impl TestBroker<sqlx::Sqlite> {
    /// A broker on a SQLite file of its own in the temporary directory, removed at the
    /// end, with the default options.
    pub async fn sqlite() -> Result<Self, Error> {
        Self::sqlite_with(BrokerOptions::default()).await
    }

    /// [`sqlite`](Self::sqlite) with `options`.
    pub async fn sqlite_with(options: BrokerOptions) -> Result<Self, Error> {
        let path = std::env::temp_dir().join(format!("rowbus-test-{}.sqlite", unique()));
        remove_sqlite(&path);
        let url = format!("sqlite://{}", path.display());
        let pool = crate::sql::connect_creating::<sqlx::Sqlite>(&url, 4).await?;
        let broker = Broker::new(pool, options).await?;
        Ok(TestBroker { broker, url, queues: Mutex::default(), file: Some(path), cleaned: false })
    }
}

impl<DB: Db> TestBroker<DB> {
    /// A broker on the database at `url` (PostgreSQL, MySQL/MariaDB or SQLite), with the
    /// default options. Its queues have names of their own: a test shares the database
    /// with others.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, BrokerOptions::default()).await
    }

    /// [`connect`](Self::connect) with `options`.
    pub async fn connect_with(url: &str, options: BrokerOptions) -> Result<Self, Error> {
        let pool = crate::sql::connect::<DB>(url, 4).await?;
        let broker = Broker::new(pool, options).await?;
        Ok(TestBroker { broker, url: url.to_owned(), queues: Mutex::default(), file: None, cleaned: false })
    }

    /// The database's URL: for code under test that connects by itself (on SQLite, the
    /// harness's file).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The broker: hand it to the code under test.
    pub fn broker(&self) -> &Broker<DB> {
        &self.broker
    }

    /// A queue of this test's own, deployed, named `name` and a suffix no other test
    /// uses; dropped at the end.
    pub async fn queue(&self, name: &str) -> Result<Queue<DB>, Error> {
        let table = format!("{name}_t{}", unique());
        let queue = self.broker.queue(&table)?;
        self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(table);
        queue.deploy().await?;
        Ok(queue)
    }

    /// Runs `handler` inline, one message at a time, on every message of `queue` that is
    /// ready (all groups), until none is, and settles each as a runner would: `Ok`
    /// acknowledges, `Err` retries with the broker's backoff or dead-letters at the last
    /// attempt, an [`Outcome`] says otherwise; a panic is a failure. A message it retries
    /// is not ready again until its delay passes ([`make_due`](Self::make_due) brings it
    /// forward); a message published by the handler and ready at once is drained too.
    pub async fn drain<F, Fut, O, E>(&self, queue: &Queue<DB>, mut handler: F) -> Result<Vec<Drained>, Error>
    where
        F: FnMut(Delivery<DB>) -> Fut,
        Fut: Future<Output = Result<O, E>>,
        O: Into<Outcome>,
        E: Display + 'static,
    {
        let policy = self.broker.options().retry.clone();
        let mut drained = Vec::new();
        for group in self.groups(queue).await? {
            let builder = queue.subscribe().group(group).batch(1).schedules(false);
            let mut claimer = Claimer::start(&builder).await?;
            loop {
                let Some(delivery) = claimer.claim(1).await?.pop() else { break };
                let (id, attempt, payload) = (delivery.id(), delivery.attempt(), delivery.payload().to_vec());
                let lease = delivery.lease();
                let result = outcome(handler(delivery)).await;
                let handled = match &result {
                    Ok(Outcome::Ack) => Handled::Acked,
                    Ok(Outcome::Drop) => Handled::Dropped,
                    Ok(Outcome::Retry(after)) => Handled::Retried { after: *after, error: None },
                    Ok(Outcome::Snooze(after)) => Handled::Snoozed { after: *after },
                    Err(error) if policy.exhausted(attempt) => Handled::DeadLettered { error: error.clone() },
                    Err(error) => {
                        Handled::Retried { after: policy.delay(attempt), error: Some(error.clone()) }
                    }
                };
                lease.settle(result).await;
                drained.push(Drained { id, payload, attempt, handled });
            }
        }
        Ok(drained)
    }

    /// The groups of `queue` that hold messages, the default group first.
    async fn groups(&self, queue: &Queue<DB>) -> Result<Vec<String>, Error> {
        let mut groups: Vec<String> = queue.group_stats().await?.into_iter().map(|g| g.group).collect();
        groups.sort();
        groups.dedup();
        Ok(groups)
    }

    /// Every message in `queue`'s table (all groups, queued, delayed, retrying or in
    /// flight), lowest id first, read without claiming any: what the code under test
    /// published.
    pub async fn published(&self, queue: &Queue<DB>) -> Result<Vec<QueuedMessage>, Error> {
        let mut all = Vec::new();
        let mut page = MessagePage::default().limit(MAX_MESSAGE_PAGE);
        loop {
            let got = queue.messages(&page).await?;
            all.extend(got.messages);
            match got.next {
                Some(after) => page = page.after(after),
                None => return Ok(all),
            }
        }
    }

    /// The first message of `queue` that `expected` matches; panics, listing what the
    /// queue holds, when none does (as Oban.Testing's `assert_enqueued` does).
    pub async fn assert_published(&self, queue: &Queue<DB>, expected: &Expected) -> QueuedMessage {
        let all =
            self.published(queue).await.unwrap_or_else(|e| panic!("reading `{}` failed: {e}", queue.table()));
        match all.iter().position(|m| expected.matches(m)) {
            Some(found) => all.into_iter().nth(found).expect("found"),
            None => panic!("no message of `{}` is {expected:?}; it holds {}", queue.table(), listing(&all)),
        }
    }

    /// Panics, naming it, when a message of `queue` matches `expected`.
    pub async fn refute_published(&self, queue: &Queue<DB>, expected: &Expected) {
        let all =
            self.published(queue).await.unwrap_or_else(|e| panic!("reading `{}` failed: {e}", queue.table()));
        if let Some(found) = all.iter().find(|m| expected.matches(m)) {
            panic!(
                "`{}` holds a message that is {expected:?}: {}",
                queue.table(),
                listing(std::slice::from_ref(found))
            );
        }
    }

    /// Makes every delayed or retrying message of `queue` ready now (those in flight are
    /// left alone); how many it changed.
    pub async fn make_due(&self, queue: &Queue<DB>) -> Result<u64, Error> {
        let now = DB::NOW;
        let sql = format!(
            "UPDATE {} SET visible_at = {now} WHERE lease IS NULL AND visible_at > {now}",
            queue.sql.quoted
        );
        let mut conn = self.broker.inner.pool.acquire().await?;
        Ok(DB::execute(&mut conn, &std::sync::Arc::from(sql), &[] as &[Arg<'_>]).await?)
    }

    /// Publishes the next tick of each of `queue`'s schedules now, ahead of its time, as
    /// its scheduler would (recorded, so that no scheduler publishes it again when its
    /// time comes); the names of the schedules ticked.
    pub async fn run_schedules_now(&self, queue: &Queue<DB>) -> Result<Vec<String>, Error> {
        publish_next_ticks(queue).await
    }

    /// Holds every consumer of `queue` (in every process, and [`drain`](Self::drain)) off
    /// its messages until [`consume_again`](Self::consume_again): a test of a publisher
    /// can start the application's workers and still read what was published.
    pub async fn insert_only(&self, queue: &Queue<DB>) -> Result<(), Error> {
        queue.pause(None).await.map(|_| ())
    }

    /// Ends [`insert_only`](Self::insert_only).
    pub async fn consume_again(&self, queue: &Queue<DB>) -> Result<(), Error> {
        queue.resume(None).await.map(|_| ())
    }

    /// Drops the queues this harness made and removes its SQLite file. Also done, without
    /// reporting failures, when the `TestBroker` is dropped first (a failing test).
    pub async fn cleanup(mut self) -> Result<(), Error> {
        self.cleaned = true;
        self.broker.shutdown(Duration::from_secs(5)).await;
        let queues =
            std::mem::take(&mut *self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let result = if self.file.is_some() { Ok(()) } else { drop_queues(&self.broker, &queues).await };
        self.broker.pool().close().await;
        if let Some(file) = &self.file {
            remove_sqlite(file);
        }
        result
    }
}

impl<DB: Db> Drop for TestBroker<DB> {
    /// A test that failed before [`cleanup`](Self::cleanup): the queues are dropped on a
    /// connection of a thread of its own (the test's runtime may be unwinding), the file
    /// removed.
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        if let Some(file) = &self.file {
            remove_sqlite(file);
            return;
        }
        let queues =
            std::mem::take(&mut *self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        if queues.is_empty() {
            return;
        }
        let url = self.url.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                let db = DbPool::connect_with_size(&url, 1).await.ok()?;
                let done = db.run(DropQueues(&queues)).await;
                db.close().await;
                done.ok()
            })
        });
        let _ = dropped.join();
    }
}

/// What [`TestBroker::assert_published`] looks for: every condition given must hold
/// (none given matches any message).
///
/// ```
/// use std::time::Duration;
/// use rowbus::testing::Expected;
///
/// let expected = Expected::json(&serde_json::json!({"order": 7}))
///     .group("mail")
///     .key("customer-3")
///     .header("trace", "abc")
///     .delayed_at_least(Duration::from_secs(60));
/// # let _ = expected;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expected {
    payload: Option<Vec<u8>>,
    json: Option<serde_json::Value>,
    group: Option<String>,
    key: Option<String>,
    headers: Vec<(String, String)>,
    delayed_at_least: Option<Duration>,
}

impl Expected {
    /// Any message.
    pub fn any() -> Self {
        Expected::default()
    }

    /// A message with exactly this payload.
    pub fn payload(payload: impl Into<Vec<u8>>) -> Self {
        Expected { payload: Some(payload.into()), ..Expected::default() }
    }

    /// A message with this text as its payload.
    pub fn text(text: &str) -> Self {
        Self::payload(text.as_bytes())
    }

    /// A message whose payload is JSON equal to `value` (whatever its formatting).
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Self {
        let json = serde_json::to_value(value).expect("a value that serializes to JSON");
        Expected { json: Some(json), ..Expected::default() }
    }

    /// In group `group` (`""` is the default group).
    pub fn group(mut self, group: &str) -> Self {
        self.group = Some(group.to_owned());
        self
    }

    /// With ordering key `key`.
    pub fn key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    /// With header `name` set to `value` (repeatable: each must hold).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Not claimable for at least `delay` more (published with a delay, or retried).
    pub fn delayed_at_least(mut self, delay: Duration) -> Self {
        self.delayed_at_least = Some(delay);
        self
    }

    /// Whether `message` is what this looks for.
    pub fn matches(&self, message: &QueuedMessage) -> bool {
        self.payload.as_ref().is_none_or(|p| *p == message.payload)
            && self.json.as_ref().is_none_or(|j| {
                serde_json::from_slice::<serde_json::Value>(&message.payload).is_ok_and(|v| v == *j)
            })
            && self.group.as_ref().is_none_or(|g| *g == message.group)
            && self.key.as_ref().is_none_or(|k| message.key.as_ref() == Some(k))
            && self.headers.iter().all(|(n, v)| message.headers.get(n) == Some(v))
            && self.delayed_at_least.is_none_or(|d| message.visible_in >= d)
    }
}

/// The messages, one short line each, for a failed assertion.
fn listing(messages: &[QueuedMessage]) -> String {
    if messages.is_empty() {
        return "no message".to_owned();
    }
    let lines: Vec<String> = messages
        .iter()
        .map(|m| {
            format!(
                "\n  {} group {:?} key {:?} {:?} in {:?} headers {:?}: {}",
                m.id,
                m.group,
                m.key,
                m.state,
                m.visible_in,
                m.headers,
                String::from_utf8_lossy(&m.payload)
            )
        })
        .collect();
    lines.concat()
}

/// Drops `queues` on a pool of any database.
struct DropQueues<'a>(&'a [String]);

impl OnPool for DropQueues<'_> {
    type Output = Result<(), Error>;

    async fn run<DB: Db>(self, pool: sqlx::Pool<DB>) -> Self::Output {
        let broker = Broker::new(pool, BrokerOptions::default()).await?;
        drop_queues(&broker, self.0).await
    }
}

async fn drop_queues<DB: Db>(broker: &Broker<DB>, queues: &[String]) -> Result<(), Error> {
    let mut result = Ok(());
    for name in queues {
        if let Err(error) = broker.queue(name)?.undeploy().await {
            result = result.and(Err(error));
        }
    }
    result
}

/// A name part no other harness in any process uses: the process id, a count and the
/// time's low bits.
fn unique() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{:x}{:x}{:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed), nanos & 0xfff)
}

fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}
