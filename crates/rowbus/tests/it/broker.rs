//! The table broker against the real PostgreSQL and MariaDB and a temporary SQLite file:
//! publishing, claiming, waking, groups, leases, retries, dead letters, transactional
//! handlers, listen_notify and shutdown.

use crate::common;

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Cleanup, MARIADB, PG, TempSqlite, on_each_database, unique};
use futures::{FutureExt, StreamExt};
use rowbus::stats::{Stats, TableState};
use rowbus::{
    Backend, BatchOutcome, Broker, BrokerOptions, Db, DbPool, Delivery, Error, Message, Outcome, Queue,
    RetryPolicy,
};
use sqlx::{MySql, Postgres, Sqlite};

/// A broker on a database of the test's own choosing, with a fast retry policy.
struct Env<DB: Db> {
    broker: Broker<DB>,
    _file: Option<Arc<TempSqlite>>,
}

fn options() -> BrokerOptions {
    BrokerOptions {
        retry: RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(50),
            factor: 2.0,
            max_delay: Duration::from_secs(1),
        },
        ..BrokerOptions::default()
    }
}

/// A pool on `url`; a SQLite file is made (the tests' files start missing).
async fn pool(url: &str) -> DbPool {
    DbPool::connect_creating(url, 8)
        .await
        .unwrap_or_else(|e| panic!("{url} must be reachable (run scripts/services.sh): {e}"))
}

async fn pg(options: BrokerOptions) -> Env<Postgres> {
    let DbPool::Postgres(pool) = pool(PG).await else { unreachable!() };
    Env { broker: Broker::new(pool, options).await.unwrap(), _file: None }
}

async fn mariadb(options: BrokerOptions) -> Env<MySql> {
    let DbPool::MySql(pool) = pool(MARIADB).await else { unreachable!() };
    Env { broker: Broker::new(pool, options).await.unwrap(), _file: None }
}

async fn sqlite_at(file: Arc<TempSqlite>, options: BrokerOptions) -> Env<Sqlite> {
    let DbPool::Sqlite(pool) = pool(&file.url).await else { unreachable!() };
    Env { broker: Broker::new(pool, options).await.unwrap(), _file: Some(file) }
}

async fn sqlite(options: BrokerOptions) -> Env<Sqlite> {
    sqlite_at(Arc::new(TempSqlite::new()), options).await
}

/// One test of `scenario` on `database`, for [`on_each_database!`]: a broker with
/// [`options`] on two worker threads.
macro_rules! database_test {
    (postgres, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn postgres() {
            super::$scenario(pg(options()).await.broker).await;
        }
    };
    (mariadb, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn mariadb() {
            super::$scenario(super::mariadb(options()).await.broker).await;
        }
    };
    (sqlite, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sqlite() {
            let env = super::sqlite(options()).await;
            super::$scenario(env.broker.clone()).await;
        }
    };
}

/// A queue of the test's own: its tables are dropped with it, also when the test fails.
struct OwnQueue<DB: Db> {
    queue: Queue<DB>,
    _cleanup: Cleanup,
}

impl<DB: Db> std::ops::Deref for OwnQueue<DB> {
    type Target = Queue<DB>;

    fn deref(&self) -> &Queue<DB> {
        &self.queue
    }
}

/// A new queue named after `prefix` on `broker`'s database, deployed.
async fn own_queue<DB: Db>(broker: &Broker<DB>, prefix: &str) -> OwnQueue<DB> {
    let cleanup = Cleanup::new(DB::BACKEND);
    let queue = broker.queue(&cleanup.queue(&unique(prefix))).unwrap();
    queue.deploy().await.unwrap();
    OwnQueue { queue, _cleanup: cleanup }
}

async fn queue<DB: Db>(broker: &Broker<DB>) -> OwnQueue<DB> {
    own_queue(broker, "q").await
}

/// A failing test leaves no tables behind: its queue's guard drops them as the panic
/// unwinds.
async fn a_failed_test_drops_its_tables<DB: Db>(broker: Broker<DB>) {
    let name = Mutex::new(String::new());
    let failed = AssertUnwindSafe(async {
        let q = queue(&broker).await;
        *name.lock().unwrap() = q.table().to_string();
        assert_eq!(q.state().await.unwrap(), TableState::Deployed);
        panic!("this test fails on purpose: its tables must go all the same");
    })
    .catch_unwind()
    .await;
    assert!(failed.is_err());
    let name = name.into_inner().unwrap();
    let tables =
        ["", "_dead", "_pause", "_sched", "_ticks", "_hist", "_keep", "_count", "_limits", "_starts"]
            .map(|suffix| format!("{name}{suffix}"));
    for table in tables {
        let state = broker.queue(&table).unwrap().state().await.unwrap();
        assert_eq!(state, TableState::Missing, "{table} is left behind");
    }
}
on_each_database!(a_failed_test_drops_its_tables on postgres, mariadb);

/// Publish one and many, as bytes, text and JSON; a stream delivers them in order with
/// their groups, attempts and payloads; an ack deletes.
async fn publish_and_stream<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish(Message::new(vec![0u8, 159, 146, 150])).await.unwrap();
    q.publish(Message::text("hello")).await.unwrap();
    q.publish(Message::json(&serde_json::json!({"n": 7})).unwrap()).await.unwrap();
    let n = q.publish_batch((0..250).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    assert_eq!(n.stored, 250);
    assert_eq!(q.depth("").await.unwrap(), (253, 0));

    let mut sub = q.subscribe().batch(100).stream().await.unwrap();
    let first = sub.next().await.unwrap().unwrap();
    assert_eq!(first.payload(), &[0u8, 159, 146, 150]);
    assert!(first.text().is_err(), "not UTF-8");
    assert_eq!((first.attempt(), first.group()), (1, ""));
    first.ack().await.unwrap();
    assert_eq!(sub.next().await.unwrap().unwrap().text().unwrap(), "hello");
    let json: serde_json::Value = sub.next().await.unwrap().unwrap().json().unwrap();
    assert_eq!(json["n"], 7);
    for i in 0..250 {
        let d = sub.next().await.unwrap().unwrap();
        assert_eq!(d.text().unwrap(), format!("m{i}"));
        d.ack().await.unwrap();
    }
    // The unacknowledged two are leased, not waiting.
    assert_eq!(q.depth("").await.unwrap(), (2, 0));
    let stats = broker.stats();
    assert_eq!((stats.published, stats.claimed, stats.acked), (253, 253, 251));
}
on_each_database!(publish_and_stream);

/// A backlog larger than a claim drains with no wait between full claims, although the
/// poll interval is an hour: a hundred full claims that each waited for it would take
/// days, so the drain's two minutes at most tell the two apart on a loaded machine.
async fn backlog_drains_without_waiting<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    let total = 10_000u64;
    for chunk in 0..10 {
        q.publish_batch((0..1000).map(|i| Message::text(format!("{chunk}-{i}")))).await.unwrap();
    }
    let handled = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let runner = {
        let handled = handled.clone();
        let q = q.clone();
        tokio::spawn(async move {
            q.subscribe()
                .batch(100)
                .poll_interval(Duration::from_secs(3_600))
                .run_batch(move |batch| {
                    handled.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    async { Ok::<_, Error>(()) }
                })
                .await
        })
    };
    while handled.load(Ordering::Relaxed) < total {
        if started.elapsed() >= Duration::from_secs(120) {
            // What it says tells a stalled drain (rows left under lease or unclaimed) from
            // a slow one.
            let (handled, depth) = (handled.load(Ordering::Relaxed), q.depth("").await);
            panic!(
                "the backlog waited for the poll interval: {handled} handled, depth {depth:?}, {:?}",
                broker.stats()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    assert_eq!(broker.stats().acked, total);
}
on_each_database!(backlog_drains_without_waiting);

/// Waits until the broker's counters satisfy `done`, at most `limit`.
async fn stats_until<DB: Db>(broker: &Broker<DB>, limit: Duration, done: impl Fn(&Stats) -> bool) {
    let started = Instant::now();
    while !done(&broker.stats()) {
        assert!(started.elapsed() < limit, "{:?}", broker.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the broker has acknowledged `n` messages, at most 5 s after `started`.
async fn acked_within<DB: Db>(broker: &Broker<DB>, n: u64, started: Instant, what: &str) {
    while broker.stats().acked < n {
        assert!(started.elapsed() < Duration::from_secs(5), "{what}: {:?}", broker.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An acknowledgement is deleted at once, also when no claim comes to carry it (SQLite's
/// runners put acknowledgements in their next claim's transaction): the subscription then
/// waits its 10 s poll interval, and the rows must be gone long before.
async fn acks_land_while_the_runner_idles<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish_batch((0..5).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    let slow = Duration::from_secs(10);
    let single = tokio::spawn(
        q.subscribe().workers(4).poll_interval(slow).run(|_: Delivery<DB>| async { Ok::<_, Error>(()) }),
    );
    let batch = tokio::spawn(
        q.subscribe()
            .batch(3)
            .poll_interval(slow)
            .run_batch(|_: Vec<Delivery<DB>>| async { Ok::<_, Error>(()) }),
    );
    let started = Instant::now();
    acked_within(&broker, 5, started, "acknowledgements waited for a claim").await;
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    // Published while both idle: woken, handled, and acknowledged without a claim after.
    q.publish(Message::text("late")).await.unwrap();
    acked_within(&broker, 6, started, "the late acknowledgement waited").await;
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    broker.shutdown(Duration::from_secs(5)).await;
    single.await.unwrap().unwrap();
    batch.await.unwrap().unwrap();
    assert_eq!(broker.stats().leases_lost, 0);
}
on_each_database!(acks_land_while_the_runner_idles);

/// A publish of the same broker wakes an idle subscription with a 10 s poll interval at
/// once, and only the subscriptions of its group.
async fn publish_wakes_its_group<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    let mut a = q.subscribe().group("a").poll_interval(Duration::from_secs(10)).stream().await.unwrap();
    let mut b = q.subscribe().group("b").poll_interval(Duration::from_secs(10)).stream().await.unwrap();
    // Both are idle: their first claims found nothing.
    assert!(tokio::time::timeout(Duration::from_millis(200), a.next()).await.is_err());
    assert!(tokio::time::timeout(Duration::from_millis(200), b.next()).await.is_err());

    let wakeups = broker.stats().wakeups;
    let sent = Instant::now();
    q.publish(Message::text("for a").group("a")).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(5), a.next())
        .await
        .expect("woken, not polled")
        .unwrap()
        .unwrap();
    let latency = sent.elapsed();
    assert_eq!((d.text().unwrap(), d.group()), ("for a", "a"));
    assert!(latency < Duration::from_secs(5), "{latency:?}");
    assert_eq!(broker.stats().wakeups, wakeups + 1, "one wake-up, for group a only");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), b.next()).await.is_err(),
        "b is not woken, nor claims a's"
    );
    d.ack().await.unwrap();
}
on_each_database!(publish_wakes_its_group);

/// Two brokers (two pools) with 4 workers each on one table: every message handled
/// exactly once here, and never held by two workers at once.
async fn two_brokers_share_a_table<DB: Db>(first: Broker<DB>, second: Broker<DB>) {
    let q1 = own_queue(&first, "shared").await;
    let q2 = second.queue(&q1.table().to_string()).unwrap();
    let total = 400usize;
    q1.publish_batch((0..total).map(|i| Message::text(i.to_string()))).await.unwrap();

    let holding = Arc::new(Mutex::new(HashSet::new()));
    let done = Arc::new(Mutex::new(Vec::new()));
    let handler = |holding: Arc<Mutex<HashSet<String>>>, done: Arc<Mutex<Vec<String>>>| {
        move |d: rowbus::Delivery<DB>| {
            let (holding, done) = (holding.clone(), done.clone());
            async move {
                let text = d.text()?.to_owned();
                assert!(holding.lock().unwrap().insert(text.clone()), "{text} held by two workers");
                tokio::time::sleep(Duration::from_millis(1)).await;
                holding.lock().unwrap().remove(&text);
                done.lock().unwrap().push(text);
                Ok::<_, Error>(())
            }
        }
    };
    let r1 = tokio::spawn(q1.subscribe().workers(4).run(handler(holding.clone(), done.clone())));
    let r2 = tokio::spawn(q2.subscribe().workers(4).run(handler(holding.clone(), done.clone())));
    let started = Instant::now();
    while done.lock().unwrap().len() < total {
        assert!(started.elapsed() < Duration::from_secs(60), "only {} handled", done.lock().unwrap().len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.shutdown(Duration::from_secs(5)).await;
    second.shutdown(Duration::from_secs(5)).await;
    r1.await.unwrap().unwrap();
    r2.await.unwrap().unwrap();
    let mut handled = done.lock().unwrap().clone();
    handled.sort_by_key(|t| t.parse::<usize>().unwrap());
    assert_eq!(handled, (0..total).map(|i| i.to_string()).collect::<Vec<_>>(), "each exactly once");
    assert_eq!(q1.depth("").await.unwrap(), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_share_a_table_postgres() {
    two_brokers_share_a_table(pg(options()).await.broker, pg(options()).await.broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_share_a_table_mariadb() {
    two_brokers_share_a_table(mariadb(options()).await.broker, mariadb(options()).await.broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_share_a_table_sqlite() {
    let file = Arc::new(TempSqlite::new());
    let (a, b) = (sqlite_at(file.clone(), options()).await, sqlite_at(file, options()).await);
    two_brokers_share_a_table(a.broker.clone(), b.broker.clone()).await;
}

/// A lease that runs out brings the message back to another claim; the first holder's
/// late ack is refused and changes nothing; extending a lease keeps it.
async fn lease_expiry_redelivers<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish(Message::text("slow")).await.unwrap();
    q.publish(Message::text("long")).await.unwrap();
    let mut sub = q
        .subscribe()
        .lease(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(50))
        .stream()
        .await
        .unwrap();
    let first = sub.next().await.unwrap().unwrap();
    let long = sub.next().await.unwrap().unwrap();
    assert_eq!((first.text().unwrap(), long.text().unwrap()), ("slow", "long"));
    long.extend_lease(Duration::from_secs(30)).await.unwrap();

    let again = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((again.id(), again.attempt()), (first.id(), 2), "redelivered after the lease");
    again.extend_lease(Duration::from_secs(30)).await.unwrap();
    let late = first.ack().await.unwrap_err();
    assert!(matches!(late, Error::LeaseLost { id, .. } if id == again.id()), "{late:?}");
    assert!(late.to_string().contains("lease"));
    assert!(
        tokio::time::timeout(Duration::from_millis(600), sub.next()).await.is_err(),
        "the extended lease holds"
    );
    again.ack().await.unwrap();
    long.ack().await.unwrap();
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    assert_eq!(broker.stats().leases_lost, 1);
}
on_each_database!(lease_expiry_redelivers);

/// Failures retry with backoff up to the maximum of attempts, then go to the dead-letter
/// table; a handler can ask for a specific delay, or drop a message; panics are failures.
async fn retries_and_dead_letters<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    for name in ["fails", "panics", "later", "drop", "ok"] {
        q.publish(Message::text(name)).await.unwrap();
    }
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let runner =
        tokio::spawn(q.subscribe().workers(2).poll_interval(Duration::from_millis(50)).run(move |d| {
            let seen = seen.clone();
            async move {
                let text = d.text()?.to_owned();
                seen.lock().unwrap().push((text.clone(), d.attempt()));
                match (text.as_str(), d.attempt()) {
                    ("fails", _) => Err(Error::ShuttingDown),
                    ("panics", _) => panic!("boom"),
                    ("later", 1) => Ok(Outcome::Retry(Duration::from_millis(100))),
                    ("drop", _) => Ok(Outcome::Drop),
                    _ => Ok(Outcome::Ack),
                }
            }
        }));
    let started = Instant::now();
    loop {
        let s = broker.stats();
        if s.dead_lettered == 2 && s.acked == 2 && s.dropped == 1 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    let attempts = attempts.lock().unwrap().clone();
    let of = |name: &str| attempts.iter().filter(|(t, _)| t == name).map(|(_, a)| *a).collect::<Vec<_>>();
    assert_eq!(of("fails"), [1, 2, 3], "three attempts, then dead");
    assert_eq!(of("panics"), [1, 2, 3]);
    assert_eq!(of("later"), [1, 2]);
    assert_eq!(of("drop"), [1]);
    assert_eq!(of("ok"), [1]);
    assert_eq!(q.depth("").await.unwrap(), (0, 2));
    let s = broker.stats();
    assert_eq!((s.retried, s.dead_lettered, s.dropped, s.acked), (5, 2, 1, 2));
}
on_each_database!(retries_and_dead_letters);

/// Shutdown with work in flight: handlers in flight finish, nothing is lost, and what is
/// left is claimed by the next runner.
async fn shutdown_loses_nothing<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    let total = 60usize;
    q.publish_batch((0..total).map(|i| Message::text(i.to_string()))).await.unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let runner = tokio::spawn(q.subscribe().workers(4).run(move |_d| {
        let counter = counter.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(())
        }
    }));
    tokio::time::sleep(Duration::from_millis(250)).await;
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    let first_run = handled.load(Ordering::SeqCst);
    assert!(first_run > 0 && first_run < total, "{first_run}");
    let (left, dead) = q.depth("").await.unwrap();
    assert_eq!((left as usize + first_run, dead), (total, 0), "every message handled or waiting");
    let s = broker.stats();
    assert_eq!(s.acked as usize, first_run);
    assert!(matches!(q.subscribe().stream().await, Err(Error::ShuttingDown)));
}
on_each_database!(shutdown_loses_nothing);

/// At shutdown a stream ends, and the messages it claimed but did not yield are given
/// back at once, not after their lease.
async fn shutdown_releases_unstarted_claims<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish_batch((0..10).map(|i| Message::text(i.to_string()))).await.unwrap();
    let mut sub = q.subscribe().batch(10).lease(Duration::from_secs(600)).stream().await.unwrap();
    let first = sub.next().await.unwrap().unwrap();
    broker.shutdown(Duration::from_secs(1)).await;
    assert!(sub.next().await.is_none(), "the stream ends at shutdown");
    drop(sub);
    first.ack().await.unwrap();
    let started = Instant::now();
    loop {
        if broker.stats().released == 9 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", broker.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fresh = Broker::new(broker.pool().clone(), options()).await.unwrap();
    let again = fresh.queue(&q.table().to_string()).unwrap();
    let mut sub = again.subscribe().batch(20).stream().await.unwrap();
    let mut back = Vec::new();
    while back.len() < 9 {
        let d = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("claimable at once")
            .unwrap()
            .unwrap();
        assert_eq!(d.attempt(), 1, "a release does not count the attempt");
        back.push(d.text().unwrap().to_owned());
        d.ack().await.unwrap();
    }
    back.sort();
    assert_eq!(back, (1..10).map(|i| i.to_string()).collect::<Vec<_>>());
}
on_each_database!(shutdown_releases_unstarted_claims);

/// A transactional handler's writes and the ack commit together; a failure rolls both
/// back and counts the attempt; a message's effects happen exactly once.
async fn transactional_handler_postgres_effects() {
    let cleanup = Cleanup::new(Backend::Postgres);
    let env = pg(options()).await;
    let broker = env.broker;
    let q = queue(&broker).await;
    let effects = cleanup.table(&unique("effects"));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {effects} (message_id BIGINT PRIMARY KEY, note TEXT)"
    )))
    .execute(broker.pool())
    .await
    .unwrap();
    for name in ["ok", "flaky", "bad"] {
        q.publish(Message::text(name)).await.unwrap();
    }
    let insert = Arc::<str>::from(format!("INSERT INTO {effects} (message_id, note) VALUES ($1, $2)"));
    let runner = tokio::spawn(q.subscribe().workers(2).poll_interval(Duration::from_millis(50)).run_tx(
        move |conn, m| {
            let insert = insert.clone();
            Box::pin(async move {
                let note = format!("{}#{}", m.text().unwrap(), m.attempt());
                sqlx::query(sqlx::AssertSqlSafe(insert)).bind(m.id()).bind(&note).execute(&mut *conn).await?;
                match (m.text().unwrap(), m.attempt()) {
                    ("flaky", 1) | ("bad", _) => {
                        Err(sqlx::Error::Protocol("the handler failed after writing".into()))
                    }
                    _ => Ok(()),
                }
            })
        },
    ));
    stats_until(&broker, Duration::from_secs(20), |s| s.acked == 2 && s.dead_lettered == 1).await;
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    let notes: Vec<String> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT note FROM {effects} ORDER BY note")))
            .fetch_all(broker.pool())
            .await
            .unwrap();
    assert_eq!(notes, ["flaky#2", "ok#1"], "effects of failed attempts rolled back, the rest once");
    assert_eq!(q.depth("").await.unwrap(), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_handler_commits_effects_and_ack_together() {
    transactional_handler_postgres_effects().await;
}

/// The same on MariaDB and SQLite, counting effects.
async fn transactional_counts<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    for name in ["ok", "flaky", "bad"] {
        q.publish(Message::text(name)).await.unwrap();
    }
    let runner =
        tokio::spawn(q.subscribe().workers(2).poll_interval(Duration::from_millis(50)).run_tx(|_conn, m| {
            Box::pin(async move {
                match (m.text().unwrap(), m.attempt()) {
                    ("flaky", 1) | ("bad", _) => Err("failed"),
                    _ => Ok(()),
                }
            })
        }));
    stats_until(&broker, Duration::from_secs(20), |s| s.acked == 2 && s.dead_lettered == 1).await;
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    assert_eq!(q.depth("").await.unwrap(), (0, 1));
    assert_eq!(broker.stats().retried, 3, "flaky once, bad twice");
}
on_each_database!(transactional_counts);

/// `run_batch_tx`: two subscriptions of two workers drain a backlog in batches of at most
/// 16, every message once and none in two batches at once.
async fn batch_tx_drains_once<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish_batch((0..300).map(|i| Message::text(i.to_string()).group("g"))).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let in_flight = Arc::new(Mutex::new(HashSet::new()));
    let runner = |q: rowbus::Queue<DB>| {
        let (seen, in_flight) = (seen.clone(), in_flight.clone());
        tokio::spawn(q.subscribe().group("g").workers(2).batch(16).run_batch_tx(move |_conn, messages| {
            let (seen, in_flight) = (seen.clone(), in_flight.clone());
            Box::pin(async move {
                assert!((1..=16).contains(&messages.len()), "{} in a batch", messages.len());
                for m in &messages {
                    assert!(in_flight.lock().unwrap().insert(m.id()), "{} held twice", m.id());
                    assert_eq!((m.group(), m.attempt()), ("g", 1));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                for m in &messages {
                    in_flight.lock().unwrap().remove(&m.id());
                    seen.lock().unwrap().push(m.text().unwrap().parse::<u32>().unwrap());
                }
                Ok::<_, Error>(())
            })
        }))
    };
    let runners = [runner(q.clone()), runner(q.clone())];
    stats_until(&broker, Duration::from_secs(30), |s| s.acked >= 300).await;
    broker.shutdown(Duration::from_secs(5)).await;
    for runner in runners {
        runner.await.unwrap().unwrap();
    }
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..300).collect::<Vec<_>>(), "every message once");
    assert_eq!(q.depth("g").await.unwrap(), (0, 0));
    let s = broker.stats();
    assert_eq!((s.claimed, s.acked, s.retried), (300, 300, 0));
    assert!(s.claims >= 300 / 16, "{s:?}");
}
on_each_database!(batch_tx_drains_once);

/// `run_batch_tx` failures: a failed batch's rows come back whole (same id, group,
/// payload and publish time) with the attempt counted; a retry asked for waits its delay;
/// the last attempt dead-letters; a dropped batch is deleted.
async fn batch_tx_failures<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish_batch((0..3).map(|i| Message::new(vec![i, 0xff]).group("g"))).await.unwrap();
    // Its own table: on MariaDB a claim of another group in the same table can lock the
    // first row past its range for a moment, and this test counts whole batches.
    let dropped = queue(&broker).await;
    dropped.publish(Message::text("drop me")).await.unwrap();
    type Seen = Vec<(i64, u32, Vec<u8>, String, std::time::SystemTime, Instant)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = seen.clone();
    let failing = tokio::spawn(
        q.subscribe().group("g").batch(10).poll_interval(Duration::from_millis(50)).run_batch_tx(
            move |_conn, messages| {
                let record = record.clone();
                Box::pin(async move {
                    let attempts: Vec<_> = messages.iter().map(|m| (m.id(), m.attempt())).collect();
                    assert_eq!(messages.len(), 3, "the batch comes back whole: {attempts:?}");
                    let attempt = messages[0].attempt();
                    for m in &messages {
                        let row = (
                            m.id(),
                            m.attempt(),
                            m.payload().to_vec(),
                            m.group().to_owned(),
                            m.published_at(),
                        );
                        record.lock().unwrap().push((row.0, row.1, row.2, row.3, row.4, Instant::now()));
                    }
                    match attempt {
                        1 => Ok(Outcome::Retry(Duration::from_millis(300))),
                        _ => Err("the batch failed"),
                    }
                })
            },
        ),
    );
    let dropping = tokio::spawn(
        dropped
            .subscribe()
            .poll_interval(Duration::from_millis(50))
            .run_batch_tx(|_conn, _messages| Box::pin(async { Ok::<_, Error>(Outcome::Drop) })),
    );
    stats_until(&broker, Duration::from_secs(20), |s| s.dead_lettered == 3 && s.dropped == 1).await;
    broker.shutdown(Duration::from_secs(5)).await;
    failing.await.unwrap().unwrap();
    dropping.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 9, "three attempts of three messages");
    for first in seen.iter().filter(|r| r.1 == 1) {
        let attempts: Vec<_> = seen.iter().filter(|r| r.0 == first.0).collect();
        assert_eq!(attempts.iter().map(|r| r.1).collect::<Vec<_>>(), [1, 2, 3]);
        for again in &attempts {
            assert_eq!((&again.2, &again.3, again.4), (&first.2, &first.3, first.4), "restored as published");
        }
        // Counted from the claim's transaction (PostgreSQL's `now()` is its start), a little
        // before the handler saw the message.
        let waited = attempts[1].5.duration_since(first.5);
        assert!(waited >= Duration::from_millis(250), "the retry asked for 300 ms, came after {waited:?}");
    }
    assert_eq!(q.depth("g").await.unwrap(), (0, 3));
    assert_eq!(dropped.depth("").await.unwrap(), (0, 0));
    let s = broker.stats();
    assert_eq!(
        (s.retried, s.dead_lettered, s.dropped, s.acked),
        (6, 3, 1, 0),
        "two retries of three, then dead"
    );
}
on_each_database!(batch_tx_failures);

/// A publish inside a broker transaction wakes only after commit, and never on rollback.
async fn transaction_wakes_after_commit<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    let mut sub = q.subscribe().poll_interval(Duration::from_secs(10)).stream().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(200), sub.next()).await.is_err());
    let mut tx = broker.begin().await.unwrap();
    tx.publish(&q, Message::text("rolled back")).await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = broker.begin().await.unwrap();
    tx.publish(&q, Message::text("committed")).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), sub.next()).await.is_err(), "not before commit");
    tx.commit().await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("woken at commit")
        .unwrap()
        .unwrap();
    assert_eq!(d.text().unwrap(), "committed");
    d.ack().await.unwrap();
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
}
on_each_database!(transaction_wakes_after_commit);

/// Delayed messages wait for their delay.
async fn delayed_messages_wait<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish(Message::text("later").delay(Duration::from_millis(700))).await.unwrap();
    q.publish(Message::text("now")).await.unwrap();
    let mut sub = q.subscribe().poll_interval(Duration::from_millis(100)).stream().await.unwrap();
    let started = Instant::now();
    let now = sub.next().await.unwrap().unwrap();
    assert_eq!(now.text().unwrap(), "now");
    now.ack().await.unwrap();
    let later = tokio::time::timeout(Duration::from_secs(5), sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(later.text().unwrap(), "later");
    assert!(started.elapsed() >= Duration::from_millis(500), "{:?}", started.elapsed());
    later.ack().await.unwrap();
}
on_each_database!(delayed_messages_wait);

#[tokio::test]
async fn names_are_validated_and_qualified_on_postgres() {
    let cleanup = Cleanup::new(Backend::Postgres);
    let env = pg(options()).await;
    for bad in ["jobs; DROP TABLE x", "a.b.c", "", "1x", "jobs\"", &"x".repeat(58)] {
        assert!(matches!(env.broker.queue(bad), Err(Error::InvalidName { .. })), "{bad}");
    }
    let schema = cleanup.schema(&unique("app"));
    let q = env.broker.queue(&format!("{schema}.jobs")).unwrap();
    assert!(matches!(q.deploy().await, Err(Error::MissingSchema { .. })));
    q.deploy_with(&rowbus::DeployOptions::default().create_schema(true)).await.unwrap();
    q.publish(Message::text("in a schema")).await.unwrap();
    assert_eq!(q.depth("").await.unwrap(), (1, 0));
    assert!(matches!(q.publish(Message::text("x").group("trailing ")).await, Err(Error::InvalidName { .. })));
    let lite = sqlite(options()).await;
    assert!(matches!(lite.broker.queue("app.jobs"), Err(Error::InvalidName { .. })));
}

/// listen_notify on PostgreSQL: a publish from a second broker (second pool) wakes an
/// idle subscription at once; a row written with plain SQL waits for the poll interval;
/// a killed listening connection is reconnected and wakes every subscription once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_notify_on_postgres() {
    let notify = BrokerOptions { listen_notify: true, ..options() };
    let (here, there) = (pg(notify.clone()).await.broker, pg(notify).await.broker);
    let q = own_queue(&here, "xproc").await;
    let name = q.table().to_string();
    let mut sub = q.subscribe().poll_interval(Duration::from_secs(10)).stream().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(200), sub.next()).await.is_err());

    there.queue(&name).unwrap().publish(Message::text("from afar")).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("woken by NOTIFY")
        .unwrap()
        .unwrap();
    assert_eq!(d.text().unwrap(), "from afar");
    d.ack().await.unwrap();

    let mut plain =
        q.subscribe().group("plain").poll_interval(Duration::from_secs(2)).stream().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(200), plain.next()).await.is_err());
    let insert = format!("INSERT INTO \"{name}\" (group_name, payload) VALUES ('plain', 'raw')");
    sqlx::query(sqlx::AssertSqlSafe(insert)).execute(here.pool()).await.unwrap();
    let sent = Instant::now();
    let d = tokio::time::timeout(Duration::from_secs(5), plain.next()).await.unwrap().unwrap().unwrap();
    assert!(sent.elapsed() > Duration::from_millis(500), "plain SQL wakes nobody: it waits for the poll");
    d.ack().await.unwrap();

    let session = here.listen_session_id().expect("a listening session");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(session as i32)
        .fetch_one(there.pool())
        .await
        .unwrap();
    assert!(killed);
    let before = here.stats().wakeups;
    let started = Instant::now();
    while here.stats().wakeups < before + 2 {
        assert!(started.elapsed() < Duration::from_secs(10), "reconnect did not wake the subscriptions");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    there.queue(&name).unwrap().publish(Message::text("after reconnect")).await.unwrap();
    loop {
        let d = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("still woken")
            .unwrap()
            .unwrap();
        if d.text().unwrap() == "after reconnect" {
            d.ack().await.unwrap();
            break;
        }
    }
    here.shutdown(Duration::from_secs(1)).await;
    there.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn listen_notify_refuses_channels_over_63_bytes_at_startup() {
    let env = pg(BrokerOptions { listen_notify: true, ..options() }).await;
    let long = format!("{}.{}", "s".repeat(20), "t".repeat(50));
    let q = env.broker.queue(&long).unwrap();
    let err = q.subscribe().stream().await.unwrap_err();
    assert!(matches!(err, Error::PgChannelTooLong { bytes: 71, .. }), "{err:?}");
    env.broker.shutdown(Duration::from_secs(1)).await;
}

/// MariaDB: concurrent batch claims from many connections (they can deadlock on the
/// index) all succeed, and nothing is handled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batch_claims_on_mariadb() {
    let env = mariadb(options()).await;
    let q = queue(&env.broker).await;
    let total = 5_000u64;
    for _ in 0..5 {
        q.publish_batch((0..1000).map(|_| Message::text("x"))).await.unwrap();
    }
    let handled = Arc::new(AtomicU64::new(0));
    let counter = handled.clone();
    let runner = tokio::spawn(q.subscribe().batch(100).workers(8).run_batch(move |batch| {
        counter.fetch_add(batch.len() as u64, Ordering::Relaxed);
        async { Ok::<_, Error>(()) }
    }));
    let started = Instant::now();
    while handled.load(Ordering::Relaxed) < total {
        assert!(started.elapsed() < Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    assert_eq!(handled.load(Ordering::Relaxed), total);
    assert_eq!(env.broker.stats().claim_errors, 0);
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
}

/// listen_notify on MySQL/MariaDB and SQLite, through the notify table: a publish from a
/// second broker (a second pool) wakes an idle subscription long before its 10 s poll; a
/// rolled-back publish wakes nobody.
async fn listen_notify_across_brokers<DB: Db>(here: Broker<DB>, there: Broker<DB>) -> OwnQueue<DB> {
    let q = own_queue(&here, "xproc").await;
    let name = q.table().to_string();
    let mut sub = q.subscribe().poll_interval(Duration::from_secs(10)).stream().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), sub.next()).await.is_err());

    let far = there.queue(&name).unwrap();
    let sent = Instant::now();
    far.publish(Message::text("from afar")).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("woken by the notify table")
        .unwrap()
        .unwrap();
    let latency = sent.elapsed();
    assert_eq!(d.text().unwrap(), "from afar");
    assert!(latency < Duration::from_secs(2), "woken, not polled: {latency:?}");
    d.ack().await.unwrap();

    let wakeups = here.stats().wakeups;
    let mut tx = there.begin().await.unwrap();
    tx.publish(&far, Message::text("never")).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(500), sub.next()).await.is_err());
    assert_eq!(here.stats().wakeups, wakeups, "a rolled-back publish wakes nobody");

    let mut tx = there.begin().await.unwrap();
    tx.publish(&far, Message::text("committed")).await.unwrap();
    tx.commit().await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(2), sub.next())
        .await
        .expect("woken after commit")
        .unwrap()
        .unwrap();
    assert_eq!(d.text().unwrap(), "committed");
    d.ack().await.unwrap();
    q
}

fn notifying() -> BrokerOptions {
    BrokerOptions { listen_notify: true, ..options() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_notify_on_mariadb_survives_a_killed_listener() {
    let (here, there) = (mariadb(notifying()).await.broker, mariadb(notifying()).await.broker);
    let q = listen_notify_across_brokers(here.clone(), there.clone()).await;
    let mut sub = q.subscribe().group("g").poll_interval(Duration::from_secs(10)).stream().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(200), sub.next()).await.is_err());

    let session = here.listen_session_id().expect("a listening session");
    sqlx::query("KILL CONNECTION ?").bind(session).execute(there.pool()).await.unwrap();
    let before = here.stats().wakeups;
    let started = Instant::now();
    while here.stats().wakeups < before + 1 {
        assert!(started.elapsed() < Duration::from_secs(10), "the reconnect woke nobody");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(here.listen_session_id(), Some(session));
    there.queue(&q.table().to_string()).unwrap().publish(Message::text("after").group("g")).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(2), sub.next())
        .await
        .expect("still woken")
        .unwrap()
        .unwrap();
    assert_eq!(d.text().unwrap(), "after");
    d.ack().await.unwrap();
    here.shutdown(Duration::from_secs(1)).await;
    there.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_notify_on_sqlite() {
    let file = Arc::new(TempSqlite::new());
    let (here, there) = (sqlite_at(file.clone(), notifying()).await, sqlite_at(file, notifying()).await);
    listen_notify_across_brokers(here.broker.clone(), there.broker.clone()).await;
    here.broker.shutdown(Duration::from_secs(1)).await;
    there.broker.shutdown(Duration::from_secs(1)).await;
}

/// The triggers docs/waking.md gives make rows written with plain SQL by other programs
/// wake subscriptions too. `triggers` gives the statements that make one on the queue
/// table it is given.
async fn trigger_wakes<DB: Db>(env: Env<DB>, triggers: impl FnOnce(&str) -> Vec<String>)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let own = own_queue(&env.broker, "trig").await;
    let name = own.table().to_string();
    let pool = env.broker.pool().clone();
    for sql in triggers(&name) {
        exec(&pool, sql).await;
    }
    let insert = exec(&pool, format!("INSERT INTO {name} (payload) VALUES ('raw')"));
    let q = env.broker.queue(&name).unwrap();
    let mut sub = q.subscribe().poll_interval(Duration::from_secs(10)).stream().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), sub.next()).await.is_err());
    insert.await;
    let d = tokio::time::timeout(Duration::from_secs(3), sub.next())
        .await
        .expect("woken by the trigger")
        .unwrap()
        .unwrap();
    assert_eq!(d.payload(), b"raw");
    d.ack().await.unwrap();
    env.broker.shutdown(Duration::from_secs(1)).await;
}

async fn exec<'a, E: sqlx::Executor<'a>>(executor: E, sql: String)
where
    <E::Database as sqlx::Database>::Arguments: sqlx::IntoArguments<E::Database>,
{
    executor.execute(sqlx::AssertSqlSafe(sql)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_trigger_wakes_subscriptions() {
    trigger_wakes(pg(notifying()).await, |name| {
        vec![
            "CREATE OR REPLACE FUNCTION rowbus_wake() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN PERFORM pg_notify(TG_ARGV[0], NEW.group_name); RETURN NULL; END $$"
                .into(),
            format!("CREATE TRIGGER {name}_wake AFTER INSERT ON {name} FOR EACH ROW EXECUTE FUNCTION rowbus_wake('{name}')"),
        ]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_trigger_wakes_subscriptions() {
    trigger_wakes(mariadb(notifying()).await, |name| {
        vec![format!(
            "CREATE TRIGGER {name}_wake AFTER INSERT ON {name} FOR EACH ROW \
         INSERT INTO rowbus_notify (channel, payload, pid, created_at) \
         VALUES ('{name}', NEW.group_name, CONNECTION_ID(), UTC_TIMESTAMP(6))"
        )]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_trigger_wakes_subscriptions() {
    trigger_wakes(sqlite(notifying()).await, |name| {
        vec![format!(
            "CREATE TRIGGER {name}_wake AFTER INSERT ON {name} BEGIN \
         INSERT INTO rowbus_notify (channel, payload, pid, created_at) \
         VALUES ('{name}', NEW.group_name, 0, strftime('%Y-%m-%d %H:%M:%f', 'now')); END"
        )]
    })
    .await;
}

/// The system's own `sqlite3` (Debian's package `sqlite3`; scripts/services.sh installs it),
/// an SQLite older than the bundled one, runs `sql` on `file`; panics with its error.
fn system_sqlite3(file: &std::path::Path, sql: &str) {
    const SQLITE3: &str = "/usr/bin/sqlite3";
    let output = std::process::Command::new(SQLITE3)
        .args(["-bail", "-cmd", ".timeout 10000"])
        .arg(file)
        .arg(sql)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {SQLITE3} (apt-get install sqlite3; scripts/services.sh does): {e}")
        });
    assert!(
        output.status.success(),
        "{SQLITE3} failed on {sql:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Another program's plain-SQL insert through the system's `sqlite3` (3.40 on Debian 12:
/// older than the bundled SQLite) fills every default, wakes a subscription through the
/// trigger docs/waking.md gives, and is claimed and handled; its publish time is the
/// insert's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_insert_from_the_system_sqlite3_is_handled() {
    let file = Arc::new(TempSqlite::new());
    let env = sqlite_at(file.clone(), notifying()).await;
    let name = unique("sys");
    let q = env.broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    system_sqlite3(
        file.path(),
        &format!(
            "CREATE TRIGGER {name}_wake AFTER INSERT ON {name} BEGIN \
             INSERT INTO rowbus_notify (channel, payload, pid, created_at) \
             VALUES ('{name}', NEW.group_name, 0, strftime('%Y-%m-%d %H:%M:%f', 'now')); END"
        ),
    );
    let mut sub = q.subscribe().poll_interval(Duration::from_secs(10)).stream().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), sub.next()).await.is_err());

    let before = std::time::SystemTime::now();
    system_sqlite3(file.path(), &format!("INSERT INTO {name}(payload) VALUES (x'6869')"));
    let after = std::time::SystemTime::now();
    let d = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("woken by the trigger")
        .unwrap()
        .unwrap();
    assert_eq!((d.payload(), d.group(), d.attempt()), (&b"hi"[..], "", 1));
    // SQLite's clock has millisecond steps.
    let published = d.published_at();
    let floor = before - Duration::from_millis(1);
    assert!(floor <= published && published <= after, "{before:?} <= {published:?} <= {after:?}");
    d.ack().await.unwrap();
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    env.broker.shutdown(Duration::from_secs(1)).await;
}

/// A queue whose table was never deployed says so, naming the table and the fix: on
/// publish, and as the stream's error item (the next claim waits a second).
async fn missing_queue_table_is_named<DB: Db>(broker: Broker<DB>) {
    let name = unique("never_deployed");
    let q = broker.queue(&name).unwrap();
    let err = q.publish(Message::text("x")).await.unwrap_err();
    assert!(matches!(&err, Error::MissingQueueTable { table } if *table == name), "{err:?}");
    assert!(err.to_string().contains(&format!("rowbus deploy --queue {name}")), "{err}");
    let mut sub = q.subscribe().stream().await.unwrap();
    let err = sub.next().await.unwrap().unwrap_err();
    assert!(matches!(err, Error::MissingQueueTable { .. }), "{err:?}");
    assert_eq!(broker.stats().claim_errors, 1);
}
on_each_database!(missing_queue_table_is_named);

/// A handler still running at the shutdown deadline is aborted and its message given back
/// at once, its attempt not counted, rather than left leased until its lease runs out.
async fn shutdown_gives_back_what_it_abandons<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish(Message::text("slow")).await.unwrap();
    let started = Arc::new(tokio::sync::Notify::new());
    let sub = q.subscribe().lease(Duration::from_secs(60)).shutdown_timeout(Duration::from_millis(100));
    let handler_started = started.clone();
    let runner = tokio::spawn(sub.run(move |_d| {
        let started = handler_started.clone();
        async move {
            started.notify_one();
            std::future::pending::<()>().await;
            Ok::<_, Error>(())
        }
    }));
    started.notified().await;
    broker.shutdown(Duration::from_millis(100)).await;
    runner.await.unwrap().unwrap();
    assert_eq!((broker.stats().abandoned, broker.stats().acked), (1, 0));

    let other = Broker::new(broker.pool().clone(), options()).await.unwrap();
    let mut sub = other.queue(q.table().channel()).unwrap().subscribe().stream().await.unwrap();
    let again = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("claimable at once, not after its 60 s lease")
        .unwrap()
        .unwrap();
    assert_eq!((again.text().unwrap(), again.attempt()), ("slow", 1));
    again.ack().await.unwrap();
    drop(sub);
    q.undeploy().await.unwrap();
}
on_each_database!(shutdown_gives_back_what_it_abandons);

/// A claim that fails for a reason retrying cannot mend (the queue table dropped under a
/// running subscription) is reported through `claim_failures`, marked permanent.
async fn claim_failures_say_why<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    let mut failures = broker.claim_failures();
    assert!(failures.borrow().is_none());
    q.undeploy().await.unwrap();
    let sub = q.subscribe().poll_interval(Duration::from_millis(50));
    let runner = tokio::spawn(sub.run(|_d| async { Ok::<_, Error>(()) }));
    let failure = tokio::time::timeout(Duration::from_secs(10), failures.wait_for(Option::is_some))
        .await
        .expect("a failed claim is reported")
        .unwrap()
        .clone()
        .unwrap();
    assert_eq!(failure.table, q.table().to_string());
    assert!(failure.permanent, "{failure:?}");
    assert!(failure.error.contains(q.table().channel()), "{failure:?}");
    assert!(broker.stats().claim_errors >= 1);
    broker.shutdown(Duration::from_secs(1)).await;
    runner.await.unwrap().unwrap();
}
on_each_database!(claim_failures_say_why);

/// MariaDB takes a statement of at most `max_allowed_packet` bytes: a message over it is
/// refused before anything is sent, and a batch larger in all than one packet is split
/// into statements that fit, rather than failing (or dropping the connection) midway.
async fn messages_fit_the_servers_packet<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    let limit = q.max_message_bytes().await.unwrap();
    assert!((1 << 20..=1 << 30).contains(&limit), "{limit}");
    let too_large = Message::new(vec![b'x'; usize::try_from(limit).unwrap() + 1]);
    match q.publish_batch([Message::text("before"), too_large]).await {
        Err(Error::MessageTooLarge { bytes, limit: said, setting }) => {
            assert_eq!((bytes as u64, said), (limit + 1, limit));
            assert!(setting.contains("max_allowed_packet"), "{setting}");
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    assert_eq!(q.depth("").await.unwrap(), (0, 0), "nothing of the refused batch was published");
    // Twenty messages of a twelfth of the limit each: more than one packet in all.
    let part = usize::try_from(limit / 12).unwrap();
    let n = q.publish_batch((0..20).map(|_| Message::new(vec![b'y'; part]))).await.unwrap();
    assert_eq!((n.stored, q.depth("").await.unwrap()), (20, (20, 0)));
    q.undeploy().await.unwrap();
}
on_each_database!(messages_fit_the_servers_packet on mariadb);

/// Publishes `published` messages to `q` and runs a runner whose `until` future the third
/// message's handler resolves; returns how many messages were handled. `widened`: the
/// future blocks its last poll for 300 ms, and the third handler returns 50 ms after it
/// resolved the future, so that its worker asks while the claim loop is still polling.
async fn handled_until_the_third<DB: Db>(q: &Queue<DB>, published: usize, widened: bool) -> usize {
    q.publish_batch((0..published).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    let (done, stop) = tokio::sync::oneshot::channel::<()>();
    let done = Mutex::new(Some(done));
    let handled = Arc::new(AtomicUsize::new(0));
    let counted = handled.clone();
    let run = q.subscribe().until(async move {
        let _ = stop.await;
        if widened {
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    tokio::time::timeout(
        Duration::from_secs(10),
        run.run(move |_d| {
            let third = counted.fetch_add(1, Ordering::SeqCst) + 1 == 3;
            if third {
                done.lock().unwrap().take().map(|d| d.send(()));
            }
            async move {
                if third && widened {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok::<_, Error>(())
            }
        }),
    )
    .await
    .expect("the runner returns once told")
    .unwrap();
    handled.load(Ordering::SeqCst)
}

/// `until` stops one runner (not the broker) when its future resolves: a runner that
/// should end after its third message does, and the rest wait in the queue.
async fn a_runner_stops_when_told<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    assert_eq!(handled_until_the_third(&q, 5, false).await, 3);
    assert_eq!(q.depth("").await.unwrap(), (2, 0));
    assert_eq!(broker.stats().acked, 3);
    q.undeploy().await.unwrap();
}
on_each_database!(a_runner_stops_when_told);

/// A worker that finishes a message while the runner's claim loop is inside a poll of the
/// `until` future that has just resolved does not start a message claimed ahead: it learns
/// of the stop from that poll (see `handled_until_the_third`, widened).
async fn a_runner_stops_when_told_while_its_until_is_being_polled<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    assert_eq!(handled_until_the_third(&q, 10, true).await, 3);
    assert_eq!(q.depth("").await.unwrap(), (7, 0));
    q.undeploy().await.unwrap();
}
on_each_database!(a_runner_stops_when_told_while_its_until_is_being_polled);
/// Longer than any lease or delay rowbus sends a database: 31,700 years.
const TOO_LONG: Duration = Duration::from_secs(1_000_000_000_000);

/// Panics unless `error` is the typed refusal of a duration naming `setting`.
#[track_caller]
fn assert_refused(error: Option<Error>, setting: &str) {
    match error {
        Some(Error::InvalidDuration { setting: named, .. }) if named == setting => {}
        other => panic!("expected `{setting}` refused as InvalidDuration, got {other:?}"),
    }
}

/// A duration longer than a database can add to its clock (over `MAX_DURATION`), a lease
/// of zero or a poll interval under 1 ms is refused with a typed error naming it, before
/// any statement: the queue stays empty and a held message stays held. (Without the
/// check MariaDB fails each such statement with 1441 "datetime field overflow",
/// PostgreSQL with "interval out of range", and SQLite stores it.)
async fn durations_out_of_range_are_refused_before_any_statement<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    let over = rowbus::limits::MAX_DURATION + Duration::from_secs(1);
    assert_refused(q.publish(Message::text("never").delay(TOO_LONG)).await.err(), "delay");
    let batch = [Message::text("fine"), Message::text("never").delay(over)];
    assert_refused(q.publish_batch(batch).await.err(), "delay");
    let mut tx = broker.begin().await.unwrap();
    assert_refused(tx.publish(&q, Message::text("never").delay(TOO_LONG)).await.err(), "delay");
    tx.rollback().await.unwrap();
    assert_eq!(q.depth("").await.unwrap(), (0, 0), "nothing reached the table");

    assert_refused(q.subscribe().lease(TOO_LONG).stream().await.err(), "lease");
    assert_refused(q.subscribe().lease(Duration::ZERO).stream().await.err(), "lease");
    assert_refused(
        q.subscribe().poll_interval(Duration::from_nanos(100)).stream().await.err(),
        "poll_interval",
    );
    let run = q.subscribe().lease(over).run(|_d| async { Ok::<_, Error>(Outcome::Ack) });
    assert_refused(run.await.err(), "lease");
    let run_tx = q
        .subscribe()
        .poll_interval(Duration::ZERO)
        .run_tx(|_conn, _m| Box::pin(async { Ok::<_, Error>(()) }));
    assert_refused(run_tx.await.err(), "poll_interval");
    for (options, setting) in [
        (BrokerOptions { lease: TOO_LONG, ..options() }, "lease"),
        (BrokerOptions { lease: Duration::ZERO, ..options() }, "lease"),
        (BrokerOptions { poll_interval: Duration::from_micros(10), ..options() }, "poll_interval"),
        (
            BrokerOptions { retry: RetryPolicy { max_delay: TOO_LONG, ..options().retry }, ..options() },
            "retry.max_delay",
        ),
    ] {
        assert_refused(Broker::new(broker.pool().clone(), options).await.err(), setting);
    }

    q.publish(Message::text("held")).await.unwrap();
    let mut sub = q.subscribe().stream().await.unwrap();
    let held = sub.next().await.unwrap().unwrap();
    assert_refused(held.extend_lease(TOO_LONG).await.err(), "lease");
    assert_refused(held.retry(over, "much later").await.err(), "retry delay");
    let stats = q.group_stats().await.unwrap();
    let figures = stats.iter().map(|g| (g.depth, g.in_flight, g.delayed())).collect::<Vec<_>>();
    assert_eq!(figures, [(1, 1, 0)], "still leased as claimed, not retried: {stats:?}");
    q.undeploy().await.unwrap();
}
on_each_database!(durations_out_of_range_are_refused_before_any_statement);

/// A handler asking for a retry later than `MAX_DURATION` has failed its attempt: the
/// message comes back after the policy's backoff (rather than the statement failing and
/// the message waiting out its lease, or never coming back), the reason recorded; in the
/// leased runner and the transactional one.
async fn a_handler_retry_beyond_the_maximum_is_a_failure<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish(Message::text("leased")).await.unwrap();
    let poll = Duration::from_millis(50);
    let runner = tokio::spawn(q.subscribe().poll_interval(poll).run(|d| async move {
        Ok::<_, Error>(if d.attempt() == 1 { Outcome::Retry(TOO_LONG) } else { Outcome::Ack })
    }));
    stats_until(&broker, Duration::from_secs(20), |s| s.acked == 1).await;
    q.publish(Message::text("transactional")).await.unwrap();
    let tx_runner = tokio::spawn(q.subscribe().poll_interval(poll).run_tx(|_conn, m| {
        Box::pin(async move {
            Ok::<_, Error>(if m.attempt() == 1 { Outcome::Retry(TOO_LONG) } else { Outcome::Ack })
        })
    }));
    stats_until(&broker, Duration::from_secs(20), |s| s.acked == 2).await;
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    tx_runner.await.unwrap().unwrap();
    assert_eq!(broker.stats().retried, 2);
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    q.undeploy().await.unwrap();
}
on_each_database!(a_handler_retry_beyond_the_maximum_is_a_failure);

/// Drains `n` messages with `workers` quick workers and `claim_ahead`; the claims made.
async fn drain_counting_claims<DB: Db>(broker: &Broker<DB>, q: &Queue<DB>, n: u64, ahead: usize) -> u64 {
    let handled = Arc::new(AtomicU64::new(0));
    let runner = {
        let (handled, q) = (handled.clone(), q.clone());
        tokio::spawn(async move {
            q.subscribe()
                .workers(4)
                .claim_ahead(ahead)
                .poll_interval(Duration::from_secs(10))
                .run(move |_: Delivery<DB>| {
                    handled.fetch_add(1, Ordering::Relaxed);
                    async { Ok::<_, Error>(()) }
                })
                .await
        })
    };
    let before = broker.stats().claims;
    stats_until(broker, Duration::from_secs(30), |s| s.acked >= n).await;
    let claims = broker.stats().claims - before;
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    assert_eq!(handled.load(Ordering::Relaxed), n, "each message handled once");
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    claims
}

/// Quick handlers: a claim takes more than a message per worker (claims ahead), so four
/// workers drain 400 messages in fewer than 100 claims; with `claim_ahead(0)` a claim never
/// takes more than the free workers, so it takes at least 100.
async fn quick_handlers_claim_ahead<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish_batch((0..400).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    let claims = drain_counting_claims(&broker, &q, 400, 4).await;
    assert!(claims < 100, "{claims} claims for 400 messages and 4 workers: none claimed ahead");
}
on_each_database!(quick_handlers_claim_ahead);

/// A transactional runner of four workers, woken while one message is ready, sends one
/// claim, not one per free worker (they would all look for the same row); a backlog still
/// gets a batch per worker, since a claim that came back full lets every free worker claim.
async fn a_woken_transactional_runner_claims_once<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = {
        let (running, peak) = (running.clone(), peak.clone());
        tokio::spawn(
            q.subscribe()
                .workers(4)
                .batch(10)
                .poll_interval(Duration::from_secs(10))
                .until(async move {
                    let _ = stopped.await;
                })
                .run_batch_tx(move |_conn, messages| {
                    let (running, peak) = (running.clone(), peak.clone());
                    Box::pin(async move {
                        peak.fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                        // A batch of the backlog waits (5 s at most) until two have run at
                        // once; not on SQLite, whose transactional batches take turns at its
                        // one writer.
                        let started = Instant::now();
                        while DB::BACKEND != Backend::Sqlite
                            && messages.len() > 1
                            && peak.load(Ordering::SeqCst) < 2
                            && started.elapsed() < Duration::from_secs(5)
                        {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, Error>(BatchOutcome::All(Outcome::Ack))
                    })
                }),
        )
    };
    // The first round found the queue empty: one claim, and the runner waits.
    stats_until(&broker, Duration::from_secs(10), |s| s.claims >= 1).await;
    let before = broker.stats().claims;
    q.publish(Message::text("one")).await.unwrap();
    stats_until(&broker, Duration::from_secs(10), |s| s.acked == 1).await;
    let alone = broker.stats().claims - before;
    // A backlog: 40 messages in batches of 10.
    q.publish_batch((0..40).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    stats_until(&broker, Duration::from_secs(20), |s| s.acked == 41).await;
    let _ = stop.send(());
    runner.await.unwrap().unwrap();
    assert_eq!(before, 1, "the first round sent one claim: {:?}", broker.stats());
    assert_eq!(alone, 1, "one message woke the runner: {:?}", broker.stats());
    // One for the first batch, three beside it once it came back full, and those of the
    // workers as they come free to find nothing.
    let backlog = broker.stats().claims - before - alone;
    assert!(backlog <= 4 + 4, "{backlog} claims for 40 messages: {:?}", broker.stats());
    if DB::BACKEND != Backend::Sqlite {
        assert!(peak.load(Ordering::SeqCst) > 1, "the backlog's batches ran one at a time");
    }
}
on_each_database!(a_woken_transactional_runner_claims_once);

/// Quick handlers draining a backlog, with the claim loop's poll an hour away: every
/// message is handled, none waits claimed ahead for a poll while workers are free (the
/// claims sent before the workers run out may come back after they all stopped).
async fn a_backlog_drains_without_waiting_for_a_poll<DB: Db>(broker: Broker<DB>) {
    const N: u64 = 5_000;
    let q = queue(&broker).await;
    for chunk in 0..N / 1000 {
        q.publish_batch((0..1000).map(|i| Message::text(format!("m{chunk}.{i}")))).await.unwrap();
    }
    for round in 0..3 {
        let handled = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runner = {
            let (handled, q) = (handled.clone(), q.clone());
            tokio::spawn(async move {
                q.subscribe()
                    .workers(8)
                    .poll_interval(Duration::from_secs(3600))
                    .until(async move {
                        let _ = stopped.await;
                    })
                    .run(move |_: Delivery<DB>| {
                        handled.fetch_add(1, Ordering::Relaxed);
                        async { Ok::<_, Error>(()) }
                    })
                    .await
            })
        };
        let start = std::time::Instant::now();
        while handled.load(Ordering::Relaxed) < N {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "round {round}: {} of {N} handled; the rest wait for a poll",
                handled.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop.send(());
        runner.await.unwrap().unwrap();
        assert_eq!(handled.load(Ordering::Relaxed), N, "round {round}: each message once");
        assert_eq!(q.depth("").await.unwrap(), (0, 0));
        if round < 2 {
            for chunk in 0..N / 1000 {
                q.publish_batch((0..1000).map(|i| Message::text(format!("r{round}.{chunk}.{i}"))))
                    .await
                    .unwrap();
            }
        }
    }
}
on_each_database!(a_backlog_drains_without_waiting_for_a_poll);

async fn no_claim_ahead_when_turned_off<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish_batch((0..400).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    let claims = drain_counting_claims(&broker, &q, 400, 0).await;
    assert!(claims >= 100, "{claims} claims for 400 messages and 4 workers, none ahead");
}
on_each_database!(no_claim_ahead_when_turned_off);

/// Messages claimed ahead and still waiting when the runner stops are given back at once
/// (not left leased for the hour of their lease), like those of handlers aborted at the
/// shutdown deadline; the runner ends by the broker's deadline, shorter than its own
/// shutdown timeout (30 s by default).
async fn claimed_ahead_is_given_back_at_shutdown<DB: Db>(broker: Broker<DB>) {
    let q = queue(&broker).await;
    q.publish_batch((0..400).map(|i| Message::text(format!("{i}")))).await.unwrap();
    let handled = Arc::new(AtomicU64::new(0));
    let runner = {
        let (handled, q) = (handled.clone(), q.clone());
        tokio::spawn(async move {
            q.subscribe()
                .workers(4)
                .lease(Duration::from_secs(3600))
                .poll_interval(Duration::from_secs(10))
                .run(move |_: Delivery<DB>| {
                    // Quick for the first 200, then every worker hangs with its message.
                    let hang = handled.fetch_add(1, Ordering::Relaxed) >= 200;
                    async move {
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, Error>(())
                    }
                })
                .await
        })
    };
    stats_until(&broker, Duration::from_secs(30), |s| s.acked >= 200).await;
    while handled.load(Ordering::Relaxed) < 204 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.shutdown(Duration::from_millis(200)).await;
    tokio::time::timeout(Duration::from_secs(5), runner)
        .await
        .expect("the runner ended at the broker's shutdown deadline")
        .unwrap()
        .unwrap();
    assert_eq!(handled.load(Ordering::Relaxed), 204, "no message started after the workers hung");
    let stats = q.group_stats().await.unwrap();
    assert_eq!((stats[0].depth, stats[0].ready, stats[0].in_flight), (200, 200, 0), "{stats:?}");
    assert_eq!(broker.stats().abandoned, 4, "the hung handlers' messages were given back");
}
on_each_database!(claimed_ahead_is_given_back_at_shutdown);

/// Every idle connection of `broker`'s pool killed by the server, as after a restart or
/// an operator's `KILL`: the pool hands them out untested (they were used within the last
/// second).
async fn kill_idle_connections<DB>(broker: &Broker<DB>, kill: &str, id_sql: &str)
where
    DB: Db,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let pool = broker.pool();
    let mut held = Vec::new();
    for _ in 0..pool.size().max(1) {
        held.push(pool.acquire().await.unwrap());
    }
    let mut ids = Vec::new();
    for conn in &mut held {
        let row = sqlx::query(sqlx::AssertSqlSafe(id_sql.to_owned())).fetch_one(&mut **conn).await;
        ids.push(sqlx::Row::get::<i64, _>(&row.unwrap(), 0));
    }
    drop(held);
    let killer = DbPool::connect(if DB::BACKEND == Backend::Postgres { PG } else { MARIADB }).await.unwrap();
    for id in ids {
        let sql = sqlx::AssertSqlSafe(kill.replace("ID", &id.to_string()));
        match &killer {
            DbPool::Postgres(p) => drop(sqlx::query(sql).execute(p).await.unwrap()),
            DbPool::MySql(p) => drop(sqlx::query(sql).execute(p).await.unwrap()),
            DbPool::Sqlite(_) => unreachable!("no sessions to kill"),
        }
    }
}

/// A subscription that starts right after its pool's connections were killed starts (its
/// first read is tried again on a tested connection) and drains what is there.
async fn a_subscription_starts_after_its_connections_were_killed<DB>(broker: Broker<DB>)
where
    DB: Db,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let q = queue(&broker).await;
    q.publish(Message::text("after")).await.unwrap();
    let (kill, id_sql) = match DB::BACKEND {
        Backend::Postgres => ("SELECT pg_terminate_backend(ID)", "SELECT pg_backend_pid()::BIGINT"),
        _ => ("KILL CONNECTION ID", "SELECT CAST(CONNECTION_ID() AS SIGNED)"),
    };
    kill_idle_connections(&broker, kill, id_sql).await;
    // A claim that meets a killed connection is tried again by the runner; the start
    // itself must not fail.
    let runner = tokio::spawn(q.subscribe().run(|d: Delivery<DB>| async move {
        assert_eq!(d.text()?, "after");
        Ok::<_, Error>(())
    }));
    stats_until(&broker, Duration::from_secs(20), |s| s.acked == 1 || runner.is_finished()).await;
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().expect("the subscription started");
    assert_eq!(broker.stats().acked, 1);
}
on_each_database!(a_subscription_starts_after_its_connections_were_killed on postgres, mariadb);
