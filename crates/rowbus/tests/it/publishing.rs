//! Publishes made at the same moment share statements: each caller still learns what
//! happened to its own messages, every message is stored once, a failed statement fails
//! each publish it carried, and publishes dropped on the way leave the others going. On
//! the real PostgreSQL and MariaDB and a temporary SQLite file.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use futures::StreamExt;
use rowbus::{BrokerOptions, Db, Error, Message, Queue};

use common::place_test as database_test;

/// Far longer than the statements of any test here take, even on a loaded machine: a
/// publish not done by then is stuck.
const STUCK: Duration = Duration::from_secs(60);

/// Publishers at once, and what each publishes.
const PUBLISHERS: usize = 16;
const SINGLES: usize = 25;

/// Every payload in `queue`, with how often it is there; `expected` of them in all
/// (acknowledged as they come: a keyed message waits for the one before it).
async fn payloads<DB: Db>(queue: &Queue<DB>, expected: usize) -> BTreeMap<String, usize> {
    let mut stream =
        queue.subscribe().batch(1000).poll_interval(Duration::from_millis(50)).stream().await.unwrap();
    let mut seen = BTreeMap::new();
    let mut taken = 0;
    while taken < expected {
        let delivery = tokio::time::timeout(STUCK, stream.next())
            .await
            .unwrap_or_else(|_| panic!("{taken} of {expected} messages arrived"))
            .expect("the stream runs")
            .unwrap();
        *seen.entry(delivery.text().unwrap().to_owned()).or_insert(0) += 1;
        delivery.ack().await.unwrap();
        taken += 1;
    }
    drop(stream);
    seen
}

/// Sixteen publishers at once, single messages (in two groups, some with a priority or a
/// key) and a batch each: every publish says it stored its own, every message is there
/// exactly once, and fewer statements than messages carried them.
async fn overlapping_publishes_each_store_their_own<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let queue = broker.queue(&cleanup.queue(&unique("merged"))).unwrap();
    queue.deploy().await.unwrap();
    let publishers = (0..PUBLISHERS).map(|p| {
        let queue = queue.clone();
        tokio::spawn(async move {
            for i in 0..SINGLES {
                let mut m = Message::text(format!("{p}-{i}"));
                match i % 4 {
                    1 => m = m.priority(-1),
                    2 => m = m.key(format!("k{p}")),
                    _ => {}
                }
                let published = queue.publish(m).await.unwrap();
                assert_eq!((published.stored, published.duplicates.len()), (1, 0), "{p}-{i}");
            }
            let batch = (0..3).map(|b| Message::text(format!("{p}-batch-{b}")));
            assert_eq!(queue.publish_batch(batch).await.unwrap().stored, 3);
        })
    });
    for publisher in publishers.collect::<Vec<_>>() {
        tokio::time::timeout(STUCK, publisher).await.expect("a publisher is stuck").unwrap();
    }
    let total = PUBLISHERS * (SINGLES + 3);
    let stats = broker.stats();
    assert_eq!(stats.published, total as u64);
    assert!(stats.publishes < stats.published, "publishes shared no statement: {stats:?}");
    let seen = payloads(&queue, total).await;
    assert_eq!(seen.len(), total, "distinct payloads");
    assert!(seen.values().all(|&n| n == 1), "a message stored twice: {seen:?}");
    assert!(seen.contains_key("0-0") && seen.contains_key(&format!("{}-batch-2", PUBLISHERS - 1)));
    broker.shutdown(Duration::from_secs(1)).await;
    queue.undeploy().await.unwrap();
}
on_each_database!(overlapping_publishes_each_store_their_own);

/// Publishes at once to a queue table that does not exist: each is told so, whether its
/// statement was its own or carried others too.
async fn a_failed_shared_statement_fails_each_publish<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let table = unique("nowhere");
    let queue = broker.queue(&table).unwrap();
    let publishes = (0..PUBLISHERS).map(|i| {
        let queue = queue.clone();
        tokio::spawn(async move { queue.publish(Message::text(format!("m{i}"))).await })
    });
    for publish in publishes.collect::<Vec<_>>() {
        let got = tokio::time::timeout(STUCK, publish).await.expect("a publish is stuck").unwrap();
        assert!(matches!(&got, Err(Error::MissingQueueTable { table: t }) if *t == table), "{got:?}");
    }
    broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(a_failed_shared_statement_fails_each_publish);

/// Publishes whose futures are dropped on the way (some while their statement runs, some
/// while they wait for one): the others go on, what said it was stored is there, nothing
/// is there twice, and a publish made after them all is stored.
async fn dropped_publishes_leave_the_others_going<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let queue = broker.queue(&cleanup.queue(&unique("dropped"))).unwrap();
    queue.deploy().await.unwrap();
    let publishers = (0..8u64).map(|p| {
        let queue = queue.clone();
        tokio::spawn(async move {
            let mut stored = Vec::new();
            for i in 0..30u64 {
                let payload = format!("{p}-{i}");
                // Cut short after 0 to 1.5 ms: before, during or after its statement.
                let patience = Duration::from_micros((p * 7 + i * 13) % 16 * 100);
                if let Ok(done) = tokio::time::timeout(patience, queue.publish(Message::text(&payload))).await
                {
                    done.unwrap();
                    stored.push(payload);
                }
            }
            stored
        })
    });
    let mut confirmed = Vec::new();
    for publisher in publishers.collect::<Vec<_>>() {
        confirmed
            .extend(tokio::time::timeout(STUCK, publisher).await.expect("a publisher is stuck").unwrap());
    }
    let last = tokio::time::timeout(STUCK, queue.publish(Message::text("last")))
        .await
        .expect("a publish after the dropped ones is stuck");
    assert_eq!(last.unwrap().stored, 1);
    let (depth, _) = queue.depth("").await.unwrap();
    let depth = usize::try_from(depth).unwrap();
    assert!(depth > confirmed.len() && depth <= 241, "{depth} stored, {} confirmed", confirmed.len());
    let seen = payloads(&queue, depth).await;
    assert!(seen.values().all(|&n| n == 1), "a message stored twice: {seen:?}");
    for payload in confirmed.iter().map(String::as_str).chain(["last"]) {
        assert!(seen.contains_key(payload), "{payload} said it was stored and is not there");
    }
    broker.shutdown(Duration::from_secs(1)).await;
    queue.undeploy().await.unwrap();
}
on_each_database!(dropped_publishes_leave_the_others_going);

/// Transactions that hold every connection of a fresh broker's pool each publish and
/// commit: the first publish reads the server's statement-size limit (MySQL/MariaDB's
/// `max_allowed_packet`) on its own transaction's connection, not on another pooled one
/// that none of them gives back before its publish returns.
async fn transactions_holding_the_whole_pool_publish<DB: Brokers>(place: Place) {
    const TRANSACTIONS: usize = 8; // the tests' pool size
    let cleanup = Cleanup::new(place.backend());
    let name = cleanup.queue(&unique("pool_tx"));
    DB::broker(&place, BrokerOptions::default()).await.queue(&name).unwrap().deploy().await.unwrap();

    // A broker of its own: it has not read the limit yet.
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let queue = broker.queue(&name).unwrap();
    let all_begun = std::sync::Arc::new(tokio::sync::Barrier::new(TRANSACTIONS));
    let mut publishing = tokio::task::JoinSet::new();
    for i in 0..TRANSACTIONS {
        let (broker, queue, all_begun) = (broker.clone(), queue.clone(), all_begun.clone());
        publishing.spawn(async move {
            let mut tx = broker.begin().await?;
            all_begun.wait().await;
            tx.publish(&queue, Message::text(format!("m{i}"))).await?;
            tx.commit().await
        });
    }
    let done = tokio::time::timeout(STUCK, async {
        let mut results = Vec::new();
        while let Some(result) = publishing.join_next().await {
            results.push(result.unwrap());
        }
        results
    })
    .await
    .expect("the transactions are stuck");
    for result in done {
        result.expect("each transaction publishes and commits");
    }
    let seen = payloads(&queue, TRANSACTIONS).await;
    assert_eq!(seen.len(), TRANSACTIONS, "{seen:?}");
}
on_each_database!(transactions_holding_the_whole_pool_publish on postgres, mariadb);
