//! A queue under steady load while another connection holds the database's horizon open
//! (a REPEATABLE READ transaction, as a report or `pg_dump` holds one; on MariaDB a
//! consistent snapshot): VACUUM (InnoDB's purge) can remove none of the dead row versions
//! the churn leaves, and the queue must keep a bounded size and its claims their cost all
//! the same. Short runs that assert sizes, never times; the figures over minutes are
//! the benchmark's (benches/horizon).

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::throwaway::{ThrowawayMariaDb, ThrowawayPg};
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

/// A runner of 8 workers on a queue, counting the messages it handles and the distinct
/// payloads among them.
struct Handled {
    seen: Arc<Mutex<(usize, HashSet<String>)>>,
    runner: tokio::task::JoinHandle<Result<(), rowbus::Error>>,
}

impl Handled {
    fn run<DB: rowbus::Db>(q: &rowbus::Queue<DB>) -> Self {
        let seen = Arc::new(Mutex::new((0usize, HashSet::new())));
        let counted = seen.clone();
        let runner = tokio::spawn(q.subscribe().workers(8).run(move |d| {
            let counted = counted.clone();
            async move {
                let text = d.text()?.to_owned();
                let mut counted = counted.lock().unwrap();
                counted.0 += 1;
                counted.1.insert(text);
                Ok::<_, rowbus::Error>(())
            }
        }));
        Handled { seen, runner }
    }

    /// Waits until `n` were handled, or `within` passed.
    async fn wait_for(&self, n: usize, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.seen.lock().unwrap().0 < n && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Once the broker shut down: how many were handled, and how many distinct.
    async fn end(self) -> (usize, usize) {
        let _ = self.runner.await;
        let seen = self.seen.lock().unwrap();
        (seen.0, seen.1.len())
    }
}

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

    let handled = Handled::run(&q);

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

    handled.wait_for(published, Duration::from_secs(60)).await;
    let stats = broker.stats();
    broker.shutdown(Duration::from_secs(5)).await;
    let (done, distinct) = handled.end().await;
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

/// The throwaway MariaDB's port (scripts/binlog.sh, in a directory of its own).
const MARIADB_PORT: u16 = 3363;

/// One global status counter of the server, as an integer.
async fn status(pool: &sqlx::MySqlPool, name: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(
        "SELECT CAST(variable_value AS SIGNED) FROM information_schema.global_status WHERE variable_name = ?",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// MariaDB under a consistent snapshot held on another connection: the purge removes no
/// acknowledged message meanwhile (the history list grows), and a claim still reads only
/// what lies from its group's floor on, not the delete-marked records of the 30,000
/// messages handled before: InnoDB's page reads around a claim of 5, the least of five
/// (the server is the test's own; the broker's upkeep may run beside one of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_claims_read_from_their_floor_while_a_snapshot_is_held() {
    const CHURN: usize = 30_000;
    let server = ThrowawayMariaDb::start(MARIADB_PORT);
    let pool = rowbus::connect::<sqlx::MySql>(&server.url(), 12).await.expect("the throwaway server");
    let broker = Broker::new(pool.clone(), BrokerOptions::default()).await.unwrap();
    let q = broker.queue(&unique("snapshot")).unwrap();
    q.deploy().await.unwrap();

    let mut holder = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    sqlx::raw_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT").execute(&mut holder).await.unwrap();
    let history = |pool: sqlx::MySqlPool| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT CAST(`count` AS SIGNED) FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let history_before = history(pool.clone()).await;

    for chunk in 0..CHURN / 1000 {
        q.publish_batch((0..1000).map(|i| Message::text(format!("churn {}", chunk * 1000 + i))))
            .await
            .unwrap();
    }
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (count, all) = (handled.clone(), done.clone());
    q.subscribe()
        .workers(8)
        .until(async move { all.notified().await })
        .run(move |_d| {
            if count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == CHURN {
                done.notify_one();
            }
            async { Ok::<_, rowbus::Error>(()) }
        })
        .await
        .unwrap();
    let history_after = history(pool.clone()).await;
    assert!(
        history_after >= history_before + 100,
        "the snapshot holds the purge: {history_before} -> {history_after}"
    );

    tokio::time::sleep(Duration::from_secs(1)).await;
    q.publish_batch((0..30).map(|i| Message::text(format!("after {i}")))).await.unwrap();
    let mut sub = q.subscribe().batch(5).lease(Duration::from_secs(60)).stream().await.unwrap();
    let mut least = i64::MAX;
    for _ in 0..6 {
        let before = status(&pool, "Innodb_buffer_pool_read_requests").await;
        // One claim of 5: the stream hands them out one at a time.
        for _ in 0..5 {
            tokio::time::timeout(Duration::from_secs(30), futures::StreamExt::next(&mut sub))
                .await
                .expect("a delivery")
                .expect("the stream goes on")
                .expect("claimed");
        }
        let reads = status(&pool, "Innodb_buffer_pool_read_requests").await - before;
        least = least.min(reads);
        // A pass of the upkeep computes the floor after the first claim.
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    eprintln!("history list {history_before} -> {history_after}; a claim of 5 read {least} pages at least");
    assert!(least < 100, "a claim of 5 read {least} pages: it walked the delete-marked records");
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    drop(holder);
    pool.close().await;
    drop(server);
}

/// The bytes of a SQLite database's WAL file (0 when there is none).
fn wal_bytes(file: &common::TempSqlite) -> u64 {
    let wal = format!("{}-wal", file.path().display());
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

/// SQLite, 1,000 messages a second: with no other reader the WAL starts over at each
/// checkpoint and stays small (the broker's own connections hold no read transaction
/// between statements); a reader's transaction held on another connection stops the
/// checkpoints short, the WAL grows and the broker counts them held; once that reader
/// ends, the WAL starts over and is cut back to `journal_size_limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_checkpoints_its_wal_and_counts_a_reader_that_holds_it() {
    const LIMIT: u64 = 8 << 20;
    let file = common::TempSqlite::new();
    let rowbus::DbPool::Sqlite(pool) = rowbus::DbPool::connect_creating(&file.url, 8).await.unwrap() else {
        unreachable!()
    };
    let broker = Broker::new(pool.clone(), BrokerOptions::default()).await.unwrap();
    let q = broker.queue("wal").unwrap();
    q.deploy().await.unwrap();
    let handled = Handled::run(&q);

    // Publishes at RATE for `secs`, each message `pad` bytes more; the largest WAL seen.
    let mut published = 0usize;
    let mut churn = async |secs: u64, pad: usize| {
        let mut largest = 0;
        let start = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        while start.elapsed() < Duration::from_secs(secs) {
            tick.tick().await;
            let batch = RATE / 10;
            q.publish_batch(
                (published..published + batch).map(|i| Message::text(format!("m{i} {:pad$}", ""))),
            )
            .await
            .unwrap();
            published += batch;
            largest = largest.max(wal_bytes(&file));
        }
        largest
    };

    let alone = churn(6, 0).await;
    let held_before = broker.stats().checkpoints_held;

    let mut reader = sqlx::SqliteConnection::connect(&file.url).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT count(*) FROM sqlite_master").execute(&mut reader).await.unwrap();
    let at_hold = wal_bytes(&file);
    // Larger messages while the reader holds the WAL: it outgrows the size it is cut to.
    let held = churn(6, 2_000).await;
    let stats = broker.stats();
    sqlx::raw_sql("ROLLBACK").execute(&mut reader).await.unwrap();
    drop(reader);

    let after = churn(3, 0).await;
    let end = wal_bytes(&file);
    handled.wait_for(published, Duration::from_secs(30)).await;
    broker.shutdown(Duration::from_secs(5)).await;
    let (done, distinct) = handled.end().await;
    eprintln!(
        "WAL bytes: {alone} at most alone; {at_hold} when the reader began, {held} at most while it held, \
         {after} at most after, {end} at the end; checkpoints {} ({} held, {held_before} before the reader)",
        stats.checkpoints, stats.checkpoints_held
    );
    assert_eq!((done, distinct), (published, published), "every message handled once");
    assert!(alone <= LIMIT, "alone, the WAL starts over: {alone} bytes at most");
    assert_eq!(held_before, 0, "no checkpoint held before the reader");
    assert!(stats.checkpoints_held > 0, "the broker counted checkpoints the reader held: {stats:?}");
    assert!(held > at_hold.max(alone), "the held WAL grew: {held} bytes, from {at_hold}");
    assert!(held > LIMIT, "the held WAL outgrew the limit: {held} bytes");
    assert!(end <= LIMIT, "after the reader, the WAL is cut back: {end} bytes");
    pool.close().await;
}
