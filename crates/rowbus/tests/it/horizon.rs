//! A queue under steady load while another connection holds the database's horizon open
//! (a REPEATABLE READ transaction, as a report or `pg_dump` holds one): VACUUM can remove
//! none of the dead row versions the churn leaves, and the queue must keep a bounded size
//! all the same. Short runs that assert sizes, never times; the figures over minutes are
//! the benchmark's (benches/horizon).

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::throwaway::ThrowawayPg;
use common::unique;
use rowbus::{Broker, BrokerOptions, Message};
use sqlx::Connection as _;

/// The throwaway server's port (scripts/pg-throwaway.sh).
const PORT: u16 = 5443;

/// Messages a second the test publishes.
const RATE: usize = 1_000;

/// How long the horizon is held while the queue churns.
const HELD: Duration = Duration::from_secs(50);

/// The samples compared: the largest size in the first window against the largest in
/// the last. After three partitions' time (15 s) the ring is full and its size flat; a
/// table that is not emptied grows in proportion to the time the horizon is held, here
/// more than twice as large in the last window as in the first.
const EARLY: std::ops::Range<Duration> = Duration::from_secs(15)..Duration::from_secs(25);
const LATE: std::ops::Range<Duration> = Duration::from_secs(40)..HELD;

/// The queue's relations (table, partitions, indexes, TOAST) in bytes, and their dead
/// tuples, as PostgreSQL's statistics say.
async fn size_and_dead(pool: &sqlx::PgPool, table: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT COALESCE(sum(pg_total_relation_size(s.relid)), 0)::BIGINT, COALESCE(sum(s.n_dead_tup), 0)::BIGINT \
         FROM pg_stat_user_tables s WHERE s.relid IN (SELECT relid FROM pg_partition_tree($1::regclass))",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// 1,000 messages a second (in batches of 100) for 50 s with a REPEATABLE READ transaction held open on
/// another connection the whole time: the queue's size and dead tuples are as large at
/// the end as after its first 15 s (not growing with the time held, as a table that is
/// not emptied does), and every message is handled exactly once meanwhile, through the
/// moves out of the partitions emptied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_keeps_its_size_while_the_horizon_is_held() {
    let server = ThrowawayPg::start(PORT);
    let pool = rowbus::connect::<sqlx::Postgres>(&server.url(), 12).await.expect("the throwaway server");
    let broker = Broker::new(pool.clone(), BrokerOptions::default()).await.unwrap();
    let name = unique("horizon");
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();

    // The horizon: a snapshot taken, and kept for the whole run.
    let mut holder = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class")
        .execute(&mut holder)
        .await
        .unwrap();

    let handled = Arc::new(Mutex::new((0usize, HashSet::new())));
    let seen = handled.clone();
    let runner = tokio::spawn(q.subscribe().workers(8).run(move |d| {
        let seen = seen.clone();
        async move {
            let text = d.text()?.to_owned();
            let mut seen = seen.lock().unwrap();
            seen.0 += 1;
            seen.1.insert(text);
            Ok::<_, rowbus::Error>(())
        }
    }));

    let mut published = 0usize;
    let (mut early, mut late) = ((0i64, 0i64), (0i64, 0i64));
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut sampled = start;
    while start.elapsed() < HELD {
        tick.tick().await;
        let batch = RATE / 10;
        q.publish_batch((published..published + batch).map(|i| Message::text(format!("m{i}"))))
            .await
            .unwrap();
        published += batch;
        if sampled.elapsed() >= Duration::from_secs(1) {
            sampled = tokio::time::Instant::now();
            let (size, dead) = size_and_dead(&pool, &name).await;
            let at = start.elapsed();
            for (window, most) in [(&EARLY, &mut early), (&LATE, &mut late)] {
                if window.contains(&at) {
                    *most = (most.0.max(size), most.1.max(dead));
                }
            }
        }
    }
    // The horizon was held to the end: the snapshot still sees the table as it was.
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_class").fetch_one(&mut holder).await.unwrap();
    assert!(count > 0);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while handled.lock().unwrap().0 < published && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = broker.stats();
    broker.shutdown(Duration::from_secs(5)).await;
    let _ = runner.await;
    let (done, distinct) = {
        let handled = handled.lock().unwrap();
        (handled.0, handled.1.len())
    };
    eprintln!(
        "horizon held {HELD:?}: {published} messages; largest (bytes, dead tuples) {early:?} early, {late:?} late; \
         {} partitions emptied, {} messages moved",
        stats.partitions_retired, stats.partition_moves
    );
    assert_eq!((done, distinct), (published, published), "every message handled once");
    assert!(early.0 > 0 && early.1 > 0, "sampled early: {early:?}");
    assert!(late.0 * 2 <= early.0 * 3, "the size stayed flat: {} bytes late, {} early", late.0, early.0);
    assert!(late.1 * 2 <= early.1 * 3, "the dead tuples stayed flat: {} late, {} early", late.1, early.1);
    assert!(stats.partitions_retired >= 4, "partitions emptied: {stats:?}");
    drop(holder);
    pool.close().await;
    drop(server);
}
