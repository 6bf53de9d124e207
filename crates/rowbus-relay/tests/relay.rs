//! The relay itself, with a sink that needs no broker, on the real PostgreSQL and MariaDB
//! and a temporary SQLite file.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{
    Brokers, Cleanup, MARIADB, Place, drained, fill, on_each_database, options, place_test as database_test,
    queue, trickle,
};
use rowbus::{Broker, Message};
use rowbus_relay::Relay;
use rowbus_relay::sink::{Outgoing, Sink, SinkError};

/// Longer than many polls of the tests' brokers (50 ms): a relay that still claims has
/// claimed by then.
const QUIET: Duration = Duration::from_secs(1);

/// A broker that confirms everything at once and counts the batches it took.
#[derive(Default)]
struct Confirms {
    batches: AtomicUsize,
}

impl Sink for Confirms {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        batch.iter().map(|_| Ok(())).collect()
    }

    fn system(&self) -> &'static str {
        "test"
    }
}

/// A relay whose task is aborted claims nothing more: what is published afterwards stays
/// ready for the next relay rather than held under a lease by a claim no one sends.
async fn an_aborted_relay_claims_nothing_more<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_abort").await;
    fill(&queue, 0..10, 0).await;
    let relay = tokio::spawn(Relay::new(queue.clone(), Confirms::default()).batch(5).run());
    drained(&queue).await;
    relay.abort();
    assert!(relay.await.unwrap_err().is_cancelled());

    queue.publish_batch((0..20).map(|i| Message::text(format!("after {i}")))).await.unwrap();
    tokio::time::sleep(QUIET).await;
    let groups = queue.group_stats().await.unwrap();
    let default = groups.iter().find(|g| g.group.is_empty()).expect("the default group");
    assert_eq!((default.ready, default.in_flight), (20, 0), "{groups:?}");
}
on_each_database!(an_aborted_relay_claims_nothing_more);

/// A broker that holds each batch until `together` batches are at it at once (or two
/// seconds passed), then confirms it; it records the most batches it had at once.
struct Together {
    together: usize,
    at_once: AtomicUsize,
    most: AtomicUsize,
}

impl Sink for Together {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        let now = self.at_once.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while self.at_once.load(Ordering::SeqCst) < self.together && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.at_once.fetch_sub(1, Ordering::SeqCst);
        batch.iter().map(|_| Ok(())).collect()
    }

    fn system(&self) -> &'static str {
        "test"
    }
}

/// A relay hands the sink its batches in flight at once, so the broker has the next batch
/// while it confirms the last: claiming in transactions and under leases alike. An
/// ordered relay has one batch at a time, and so has a transactional one on SQLite, where
/// each transaction holds the one write lock until it commits.
async fn batches_in_flight_are_at_the_sink_together<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_together").await;
    let side_by_side = if place.backend() == rowbus::Backend::Sqlite { 1 } else { 3 };
    for (transactional, ordered, expected) in
        [(true, false, side_by_side), (false, false, 3), (false, true, 1)]
    {
        fill(&queue, 0..90, 0).await;
        let sink = std::sync::Arc::new(Together { together: expected, at_once: 0.into(), most: 0.into() });
        let relay = Relay::new(queue.clone(), sink.clone())
            .batch(10)
            .in_flight(3)
            .transactional(transactional)
            .ordered(ordered);
        let relay = tokio::spawn(relay.run());
        drained(&queue).await;
        relay.abort();
        let _ = relay.await;
        let most = sink.most.load(Ordering::SeqCst);
        assert_eq!(
            most, expected,
            "batches at the sink at once, transactional {transactional}, ordered {ordered}"
        );
    }
}
on_each_database!(batches_in_flight_are_at_the_sink_together);

/// Relays aborted again and again while they relay, each at another moment of their
/// claims, sends, settlements and counts, in transactions and under leases, on MariaDB
/// through a relay that passes the server's answers on a few bytes at a time; then every
/// connection of the pool is taken. A statement cut off while its answer was being read
/// left its connection waiting for good: the pool counted it in use, the server idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_relays_give_every_connection_back() {
    const CONNECTIONS: u32 = 3;
    let broker = Broker::new(trickle::mariadb(MARIADB, CONNECTIONS).await, options()).await.unwrap();
    let cleanup = Cleanup::new(rowbus::Backend::MySql);
    let name = cleanup.queue(&common::unique("relay_aborted"));
    let queue = broker.queue(&name).unwrap();
    queue.deploy().await.unwrap();
    let sink = std::sync::Arc::new(Confirms::default());
    let rounds = async {
        for round in 0..300u64 {
            fill(&queue, 0..24, 0).await;
            let before = sink.batches.load(Ordering::SeqCst);
            let relay =
                Relay::new(queue.clone(), sink.clone()).batch(4).in_flight(2).transactional(round % 2 == 0);
            let relay = tokio::spawn(relay.run());
            // Relaying: its first batch is at the sink.
            while sink.batches.load(Ordering::SeqCst) == before {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // It goes on on the other worker meanwhile: part of a statement, perhaps.
            std::thread::sleep(Duration::from_micros(round * 173 % 3000));
            relay.abort();
            let _ = relay.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), rounds)
        .await
        .expect("300 rounds took over two minutes: the pool was short of connections");
    trickle::every_connection_back(broker.pool(), CONNECTIONS).await;
    queue.undeploy().await.unwrap();
    cleanup.forget(&name);
}
