//! What a claim costs, in statements, as sqlx reports them while the claim is polled
//! (`common::statements`): a limited claim against a plain one, on each database.

use crate::common;

use std::time::Duration;

use crate::statements::Statements;
use common::{Brokers, Cleanup, Place, on_each_database, unique};
use futures::StreamExt;
use rowbus::limit::{Limit, LimitScope};
use rowbus::{BrokerOptions, Message, Queue};

use common::place_test as database_test;

/// Claims measured per kind of claim.
const CLAIMS: usize = 9;

/// The statements that name the queue's tables in one claim of a stream of batch 1 on
/// `queue`: the median of [`CLAIMS`] claims after one not counted (the first learns
/// whether a limit applies). The median leaves out a statement of the queue's upkeep that
/// ran during a claim.
async fn per_claim<DB: rowbus::Db>(queue: &Queue<DB>, name: &str) -> usize {
    let statements = Statements::start();
    let mut sub = queue.subscribe().batch(1).stream().await.unwrap();
    sub.next().await.unwrap().unwrap().ack().await.unwrap();
    let mut counts = Vec::new();
    for _ in 0..CLAIMS {
        statements.take_naming(name);
        let delivery = sub.next().await.unwrap().unwrap();
        counts.push(statements.take_naming(name));
        delivery.ack().await.unwrap();
    }
    drop(sub);
    counts.sort_unstable();
    counts[CLAIMS / 2]
}

/// A claim under a concurrency limit costs at most three statements (naming the queue's
/// tables) more than a plain claim, one under a rate four: the lock of the limits rows,
/// one statement of every count of every limit (on SQLite the lock's own: its claim's
/// transaction holds every row), one insert of every start, and under a rate the bucket
/// moved on. They cost four and five more before (a count per limit, and forgetting old
/// starts on every claim): PostgreSQL 5 and 6 against 1, MariaDB 6 and 7 against 2, SQLite
/// 5 and 6 against 1. The lock and the counts stay two statements where a statement reads
/// from a snapshot taken at its start (see `LimitSql::COUNTS_LOCK`).
async fn limited_claims_cost_little_more_than_a_plain_claim<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("cost_lim"));
    let broker =
        DB::broker(&place, BrokerOptions { poll_interval: Duration::from_millis(200), ..Default::default() })
            .await;
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    q.publish_batch((0..3 * (CLAIMS + 1)).map(|i| Message::text(i.to_string()))).await.unwrap();
    let plain = per_claim(&q, &name).await;
    q.set_limit(&LimitScope::Queue, Limit::MaxRunning(1_000)).await.unwrap();
    let running = per_claim(&q, &name).await;
    q.clear_limit(&LimitScope::Queue).await.unwrap();
    q.set_limit(&LimitScope::Queue, Limit::Rate("100000/s".parse().unwrap())).await.unwrap();
    let rated = per_claim(&q, &name).await;
    eprintln!(
        "{:?}: statements per claim naming the queue: plain {plain}, max running {running}, rate {rated}",
        DB::BACKEND
    );
    assert!(plain >= 1, "the counter saw the plain claim: {plain}");
    let counts_lock = usize::from(DB::BACKEND != rowbus::Backend::Sqlite);
    assert!(running <= plain + 2 + counts_lock, "a claim under max running: {running}, a plain one {plain}");
    assert!(rated <= plain + 3 + counts_lock, "a claim under a rate: {rated}, a plain one {plain}");
    broker.shutdown(Duration::from_secs(5)).await;
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(limited_claims_cost_little_more_than_a_plain_claim);

/// MariaDB: while every waiting message has one priority, a claim reads that priority's
/// part alone, not the union of the two parts, which sorts its rows (payloads included) in
/// a temporary table at every claim; a message of another priority is claimed first once
/// the floor tells of it, through the union.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_claims_of_one_priority_read_without_a_union() {
    let place = Place::MariaDb;
    let cleanup = Cleanup::new(rowbus::Backend::MySql);
    let name = cleanup.queue(&unique("cost_one"));
    let broker = <sqlx::MySql as Brokers>::broker(
        &place,
        BrokerOptions { poll_interval: Duration::from_millis(50), ..Default::default() },
    )
    .await;
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    // Enough that the queue still holds the first priority's when the floor tells of the
    // urgent one below, and the floor's priority stays theirs.
    q.publish_batch((0..2000).map(|i| Message::text(i.to_string()))).await.unwrap();
    let statements = Statements::start();
    let mut sub = q.subscribe().batch(1).stream().await.unwrap();
    let claims = |statements: &Statements| -> Vec<String> {
        let all = statements.take_texts_naming(&name);
        all.into_iter().filter(|sql| sql.contains("FOR UPDATE SKIP LOCKED")).collect()
    };
    // Until the broker's first floor of the group, claims read both parts.
    let started = std::time::Instant::now();
    loop {
        sub.next().await.unwrap().unwrap().ack().await.unwrap();
        if claims(&statements).iter().any(|sql| !sql.contains("UNION")) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no claim without a union");
    }
    for _ in 0..5 {
        sub.next().await.unwrap().unwrap().ack().await.unwrap();
    }
    let later = claims(&statements);
    assert!(!later.is_empty());
    assert!(later.iter().all(|sql| !sql.contains("UNION")), "{later:#?}");
    q.publish(Message::text("urgent").priority(-5)).await.unwrap();
    let started = std::time::Instant::now();
    loop {
        let d = sub.next().await.unwrap().unwrap();
        let text = d.text().unwrap().to_owned();
        d.ack().await.unwrap();
        if text == "urgent" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the urgent message was not claimed");
    }
    let claims = statements.take_texts_naming(&name);
    assert!(claims.iter().any(|sql| sql.contains("UNION ALL")), "{claims:#?}");
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
}
