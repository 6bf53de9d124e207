//! Shared by the relay's integration tests. The library's own test helpers (the databases,
//! one test per database, unique names, the guard that drops what a test made, a slow relay
//! in front of MariaDB) are rowbus's `tests/common`, taken whole by `#[path]`; here is what
//! the relay adds: a queue filled with numbered messages, relays on tasks of their own, a
//! TCP proxy a test stops or freezes to take a broker away ([`proxy`]), messages for a
//! sink ([`sinks`]), and the one harness of the four brokers' scenarios ([`target`]).
#![allow(dead_code)]

pub mod jetstream;
#[path = "../../../rowbus/tests/common/mod.rs"]
mod library;
pub mod proxy;
pub mod sinks;
pub mod streams;
pub mod target;

use std::ops::Range;
use std::time::Duration;

use rowbus::{Broker, BrokerOptions, Db, Message, Queue};

#[allow(unused_imports)]
pub use library::{Brokers, Cleanup, MARIADB, Place, TempSqlite, trickle, unique};
#[allow(unused_imports)]
pub(crate) use library::{on_each_database, place_test};

/// The NATS server (with JetStream) every test uses.
pub const NATS: &str = "127.0.0.1:4222";
/// The Redis server every test uses.
pub const REDIS: &str = "127.0.0.1:6379";
/// The RabbitMQ broker every test uses (guest/guest).
pub const RABBITMQ: &str = "127.0.0.1:5672";
/// The MQTT broker (Mosquitto) every test uses.
pub const MOSQUITTO: &str = "127.0.0.1:1883";

/// How long a test waits for what should happen before it fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How long four relays may take over a queue whose every message is keyed. Each key's
/// messages go one at a time, and every claim reads the rows waiting behind the keys to
/// find the few it may take: 1,400 messages of 7 keys take 6-16 s alone here, and took
/// over 100 s on MariaDB with other tests running, when up to twelve claims went at once.
/// Slow, not lost: those tests are about order.
pub const KEYED_DEADLINE: Duration = Duration::from_secs(300);

/// The options the tests' brokers use: quick polls, so that an idle relay finds what a
/// broker gave back soon.
pub fn options() -> BrokerOptions {
    BrokerOptions { poll_interval: Duration::from_millis(50), ..BrokerOptions::default() }
}

/// A broker on `place` and a deployed queue of the test's own (dropped by `cleanup`). Its
/// pool's 16 connections leave room beyond the batches in flight of the most relays a
/// test runs on one broker (four of three, each batch holding a connection until the
/// broker answers): with 8, a loaded machine kept the tests' own statements waiting past
/// the pool's acquire timeout.
pub async fn queue<DB: Brokers>(place: &Place, cleanup: &Cleanup, prefix: &str) -> (Broker<DB>, Queue<DB>) {
    let broker = DB::broker_of(place, 16, options()).await;
    let queue = broker.queue(&cleanup.queue(&unique(prefix))).unwrap();
    queue.deploy().await.unwrap();
    (broker, queue)
}

/// The payload of message number `i`: the number's bytes and every byte value (so that no
/// byte is lost or changed on the way).
pub fn payload(i: usize) -> Vec<u8> {
    let mut payload = (i as u64).to_be_bytes().to_vec();
    payload.extend(0..=255u8);
    payload
}

/// The ordering key of message number `i` when every `keyed`-th is keyed (none when 0):
/// `k<i mod 7>`.
pub fn key_of(i: usize, keyed: usize) -> Option<String> {
    (keyed > 0 && i.is_multiple_of(keyed)).then(|| format!("k{}", i % 7))
}

/// Publishes the messages numbered `numbers`: each its [`payload`], its number in the
/// header `n`, and its key [`key_of`]. Returns their ids in order.
pub async fn fill<DB: Db>(queue: &Queue<DB>, numbers: Range<usize>, keyed: usize) -> Vec<i64> {
    let messages: Vec<Message> = numbers
        .map(|i| {
            let message = Message::new(payload(i)).header("n", i.to_string());
            match key_of(i, keyed) {
                Some(key) => message.key(key),
                None => message,
            }
        })
        .collect();
    let before = queue.published_total().await.unwrap();
    for chunk in messages.chunks(1000) {
        queue.publish_batch(chunk.to_vec()).await.unwrap();
    }
    // Ids are handed out in order on every database; a test queue is filled by one task.
    let last = queue.published_total().await.unwrap();
    assert_eq!(last - before, messages.len() as u64);
    ((before + 1)..=last).map(|id| id as i64).collect()
}

/// The prefix of the ids a relay of `queue` sends: its table's name.
pub fn prefix<DB: Db>(queue: &Queue<DB>) -> String {
    queue.table().to_string()
}

/// Relays 20 messages and one more, keyed `key`, which `sink`'s broker refuses: the 20
/// are confirmed, the one is dead-lettered and counted refused. Returns the dead letter's
/// reason.
pub async fn one_refused<DB: Db, S: rowbus_relay::sink::Sink>(
    queue: &Queue<DB>,
    sink: S,
    key: &str,
) -> String {
    fill(queue, 0..20, 0).await;
    let lost = queue.publish_with_id(Message::text("nowhere").key(key)).await.unwrap().unwrap();
    let relay = start(queue, sink, 50);
    drained(queue).await;
    let report = stop(relay).await;
    assert_eq!((report.confirmed, report.refused, report.resent), (20, 1, 0), "{report:?}");
    let dead = queue.dead_letters(&rowbus::dead::DeadLetterPage::default()).await.unwrap();
    assert_eq!(dead.iter().map(|d| d.id).collect::<Vec<_>>(), [lost]);
    assert_eq!(queue.counts().await.unwrap().unwrap().get(rowbus::stats::Counted::Refused), 1);
    dead[0].last_error.clone().unwrap_or_default()
}

/// Waits until `queue` holds no message (ready, delayed or in flight), or fails.
pub async fn drained<DB: Db>(queue: &Queue<DB>) {
    drained_within(queue, DEADLINE).await;
}

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
    run(rowbus_relay::Relay::new(queue.clone(), sink).batch(batch))
}

/// `relay` running on its own task until stopped.
pub fn run<DB: Db, S: rowbus_relay::sink::Sink>(relay: rowbus_relay::Relay<DB, S>) -> Running {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = relay.until(async move {
        let _ = stopped.await;
    });
    (stop, tokio::spawn(async move { relay.run().await.expect("the relay runs") }))
}

/// Stops a relay [`start`]ed and returns what it did.
pub async fn stop(relay: Running) -> rowbus_relay::RelayReport {
    let _ = relay.0.send(());
    relay.1.await.unwrap()
}
