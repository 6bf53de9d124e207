//! `Queue::ack_all` and `Queue::release_all`: deliveries of several claims settled at once,
//! one statement per claim or per 256 messages, each still under its own lease. A delivery
//! whose lease ran out and that another claim took since is left to that claim, and
//! counted as a lost lease, whichever statement settled the others. Against the real
//! PostgreSQL and MariaDB and a temporary SQLite file.

use crate::common;

use std::time::Duration;

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use futures::StreamExt;
use rowbus::{BrokerOptions, Delivery, Message, Queue};

use common::place_test as database_test;

/// The lease of the claims whose lease is let run out.
const SHORT: Duration = Duration::from_millis(300);

/// `n` deliveries of one claim, under `lease`.
async fn claim<DB: Brokers>(q: &Queue<DB>, n: usize, lease: Duration) -> Vec<Delivery<DB>> {
    let mut sub = q.subscribe().batch(n).lease(lease).stream().await.unwrap();
    let mut got = Vec::new();
    while got.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(20), sub.next()).await.expect("claimed in time");
        got.push(next.unwrap().unwrap());
    }
    got
}

/// One claim's deliveries, some of several claims, one whose lease ran out and was
/// claimed again: each settled once, by the lease that holds it.
async fn each_claim_settles_its_own<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = broker.queue(&cleanup.queue(&unique("many"))).unwrap();
    q.deploy().await.unwrap();
    q.publish_batch((0..10).map(|i| Message::text(i.to_string()))).await.unwrap();

    // Three claims (4, 3 and 2 messages), then one message whose lease runs out and that
    // a fourth claim takes again.
    let (a, b, c) = (
        claim(&q, 4, Duration::from_secs(30)).await,
        claim(&q, 3, Duration::from_secs(30)).await,
        claim(&q, 2, Duration::from_secs(30)).await,
    );
    let stale = claim(&q, 1, SHORT).await;
    tokio::time::sleep(SHORT * 2).await;
    let again = claim(&q, 1, Duration::from_secs(30)).await;
    assert_eq!(stale[0].id(), again[0].id());
    let lost_before = broker.stats().leases_lost;

    // One claim's messages alone.
    assert_eq!(q.ack_all(a).await.unwrap(), 4);
    assert_eq!(q.depth("").await.unwrap(), (6, 0));
    // Two claims and the stale delivery: the stale one changes nothing.
    let mut mixed = b;
    mixed.extend(stale);
    mixed.extend(c);
    assert_eq!(q.ack_all(mixed).await.unwrap(), 5);
    assert_eq!(broker.stats().leases_lost, lost_before + 1);
    assert_eq!(q.depth("").await.unwrap(), (1, 0), "the message claimed again is still its claim's");

    // Given back whole: claimable at once, the attempt not counted.
    assert_eq!(q.release_all(again).await.unwrap(), 1);
    let back = claim(&q, 1, Duration::from_secs(30)).await;
    assert_eq!(back[0].attempt(), 2, "its first claim's attempt counted, the released one not");
    assert_eq!(q.ack_all(back).await.unwrap(), 1);
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(each_claim_settles_its_own);
