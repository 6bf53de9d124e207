//! Shared by the relay's integration tests: the databases (one test per database, as the
//! library's tests do), unique names, the guard that drops what a test made, a queue
//! filled with numbered messages, a TCP proxy a test stops and starts to take a broker
//! away, a slow relay in front of a database, and the brokers' own clients to read back what the relay sent.
#![allow(dead_code)]

#[path = "../../../rowbus/tests/common/cleanup.rs"]
mod cleanup;
pub mod jetstream;
pub mod proxy;
pub mod streams;
#[path = "../../../rowbus/tests/common/trickle.rs"]
pub mod trickle;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rowbus::{Broker, BrokerOptions, Db, DbPool, Message, Queue};
use sqlx::{MySql, Postgres, Sqlite};

pub use cleanup::Cleanup;

/// The PostgreSQL server every test uses.
pub const PG: &str = cleanup::PG_URL;
/// The MariaDB server every test uses.
pub const MARIADB: &str = cleanup::MARIADB_URL;
/// The NATS server (with JetStream) every test uses.
pub const NATS: &str = "nats://127.0.0.1:4222";
/// The Redis server every test uses.
pub const REDIS: &str = "redis://127.0.0.1:6379";

/// How long a test waits for what should happen before it fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A name no other test (or test process) uses, after the run's tag when
/// `scripts/test.sh` set one.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}_{}{}_{}", cleanup::run_tag(), std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A SQLite database file removed when dropped.
pub struct TempSqlite {
    path: std::path::PathBuf,
    pub url: String,
}

impl TempSqlite {
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(format!("{}.sqlite", unique("rowbus_relay_test")));
        let url = format!("sqlite://{}", path.display());
        TempSqlite { path, url }
    }
}

impl Drop for TempSqlite {
    fn drop(&mut self) {
        cleanup::remove_sqlite(&self.path);
    }
}

/// Where a test makes its brokers: one database, on SQLite one file.
#[derive(Clone)]
pub enum Place {
    Postgres,
    MariaDb,
    Sqlite(Arc<TempSqlite>),
}

impl Place {
    pub fn url(&self) -> String {
        match self {
            Place::Postgres => PG.to_owned(),
            Place::MariaDb => MARIADB.to_owned(),
            Place::Sqlite(file) => file.url.clone(),
        }
    }

    /// A new pool on the place's database; panics, loudly, when the server is down. Its
    /// 16 connections leave room beyond the batches in flight of the most relays a test
    /// runs on one broker (four of three, each batch holding a connection until the broker
    /// answers): with 8, a loaded machine kept the tests' own statements waiting past the
    /// pool's acquire timeout.
    pub async fn pool(&self) -> DbPool {
        let url = self.url();
        DbPool::connect_creating(&url, 16)
            .await
            .unwrap_or_else(|e| panic!("{url} must be reachable (run scripts/services.sh): {e}"))
    }

    pub fn backend(&self) -> rowbus::Backend {
        match self {
            Place::Postgres => rowbus::Backend::Postgres,
            Place::MariaDb => rowbus::Backend::MySql,
            Place::Sqlite(_) => rowbus::Backend::Sqlite,
        }
    }
}

/// A broker on `place` with `options`.
pub trait Brokers: Db {
    fn broker(place: &Place, options: BrokerOptions) -> impl Future<Output = Broker<Self>> + Send;
}

macro_rules! brokers {
    ($db:ty, $variant:ident) => {
        impl Brokers for $db {
            async fn broker(place: &Place, options: BrokerOptions) -> Broker<Self> {
                let DbPool::$variant(pool) = place.pool().await else { unreachable!() };
                Broker::new(pool, options).await.unwrap()
            }
        }
    };
}
brokers!(Postgres, Postgres);
brokers!(MySql, MySql);
brokers!(Sqlite, Sqlite);

/// Runs `scenario` as one test per database (`scenario::postgres`, `::mariadb`,
/// `::sqlite`), each handed the [`Place`] to make its brokers.
macro_rules! on_each_database {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$scenario::<sqlx::Postgres>(crate::common::Place::Postgres).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mariadb() {
                super::$scenario::<sqlx::MySql>(crate::common::Place::MariaDb).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let file = std::sync::Arc::new(crate::common::TempSqlite::new());
                super::$scenario::<sqlx::Sqlite>(crate::common::Place::Sqlite(file)).await;
            }
        }
    };
}
pub(crate) use on_each_database;

/// The options the tests' brokers use: quick polls, so that an idle relay finds what a
/// broker gave back soon.
pub fn options() -> BrokerOptions {
    BrokerOptions { poll_interval: Duration::from_millis(50), ..BrokerOptions::default() }
}

/// A broker on `place` and a deployed queue of the test's own (dropped by `cleanup`).
pub async fn queue<DB: Brokers>(place: &Place, cleanup: &Cleanup, prefix: &str) -> (Broker<DB>, Queue<DB>) {
    let broker = DB::broker(place, options()).await;
    let queue = broker.queue(&cleanup.queue(&unique(prefix))).unwrap();
    queue.deploy().await.unwrap();
    (broker, queue)
}

/// Publishes `n` messages whose payloads are `m1`, `m2`, ...; every `keyed`-th (when not
/// 0) has ordering key `k<i mod 7>`, and each a header `n` with its number. Returns the ids
/// in order.
pub async fn fill<DB: Db>(queue: &Queue<DB>, n: usize, keyed: usize) -> Vec<i64> {
    let messages: Vec<Message> = (1..=n)
        .map(|i| {
            let message = Message::text(format!("m{i}")).header("n", i.to_string());
            if keyed > 0 && i % keyed == 0 { message.key(format!("k{}", i % 7)) } else { message }
        })
        .collect();
    let before = queue.published_total().await.unwrap();
    for chunk in messages.chunks(1000) {
        queue.publish_batch(chunk.to_vec()).await.unwrap();
    }
    // Ids are handed out in order on every database; a test queue is filled by one task.
    let last = queue.published_total().await.unwrap();
    assert_eq!(last - before, n as u64);
    ((before + 1)..=last).map(|id| id as i64).collect()
}

/// Waits until `queue` holds no message (ready, delayed or in flight), or fails.
pub async fn drained<DB: Db>(queue: &Queue<DB>) {
    drained_within(queue, DEADLINE).await;
}

/// How long four relays may take over a queue whose every message is keyed. Each key's
/// messages go one at a time, and every claim reads the rows waiting behind the keys to
/// find the few it may take: 1,400 messages of 7 keys take 6-16 s alone here, and took
/// over 100 s on MariaDB with other tests running, when up to twelve claims went at once.
/// Slow, not lost: those tests are about order.
pub const KEYED_DEADLINE: Duration = Duration::from_secs(300);

/// [`drained`], failing after `within`.
pub async fn drained_within<DB: Db>(queue: &Queue<DB>, within: Duration) {
    let start = tokio::time::Instant::now();
    loop {
        let groups = queue.group_stats().await.unwrap();
        if groups.iter().all(|g| g.depth == 0) {
            return;
        }
        assert!(start.elapsed() < within, "the queue is not drained after {within:?}: {groups:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `check` holds, or fails saying `what`.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < DEADLINE, "{what}: not within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A relay running on its own task, and the sender that stops it.
pub type Running = (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<rowbus_relay::RelayReport>);

/// A relay of `queue` to `sink` in batches of `batch`, running on its own task.
pub fn start<DB: Db, S: rowbus_relay::sink::Sink>(queue: &Queue<DB>, sink: S, batch: usize) -> Running {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = rowbus_relay::Relay::new(queue.clone(), sink).batch(batch).until(async move {
        let _ = stopped.await;
    });
    (stop, tokio::spawn(async move { relay.run().await.expect("the relay runs") }))
}

/// Stops a relay [`start`]ed and returns what it did.
pub async fn stop(relay: Running) -> rowbus_relay::RelayReport {
    let _ = relay.0.send(());
    relay.1.await.unwrap()
}
