//! Dead letters for operators, against the real PostgreSQL and MariaDB and a temporary
//! SQLite file: listing (newest first, paged, by group), fetching one, requeueing (by id
//! and all, with a delay; once under concurrency; waking subscriptions), purging (by id,
//! all, older than), and a handler's error kept with its causes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Cleanup, Place, next_delivery as next, on_each_database, unique};
use rowbus::dead::{DeadLetter, DeadLetterPage, DeadLetters};
use rowbus::testing::{Handled, TestBroker};
use rowbus::{Broker, BrokerOptions, Db, DbPool, Error, Message, Queue, RetryPolicy};

/// A broker whose messages die at their first failure, and the same pool as a [`DbPool`]
/// for the test's own statements; the SQLite file lives as long as it.
struct Env<DB: Db> {
    broker: Broker<DB>,
    db: DbPool,
    url: String,
    _place: Place,
}

fn options() -> BrokerOptions {
    BrokerOptions {
        retry: RetryPolicy { max_attempts: 1, ..RetryPolicy::default() },
        ..BrokerOptions::default()
    }
}

/// One test of `scenario` on `database`, for [`on_each_database!`].
use common::env_test as database_test;

async fn env<DB: Db>(pool: sqlx::Pool<DB>, db: DbPool, place: Place) -> Env<DB> {
    Env { broker: Broker::new(pool, options()).await.unwrap(), db, url: place.url(), _place: place }
}

/// A new queue table, dropped with its dead-letter and pause tables when the test ends,
/// also when it fails (the guard).
struct Table<DB: Db>(Queue<DB>, Cleanup);

impl<DB: Db> Table<DB> {
    async fn new(broker: &Broker<DB>) -> Self {
        let cleanup = Cleanup::new(DB::BACKEND);
        let queue = broker.queue(&cleanup.queue(&unique("dl"))).unwrap();
        queue.deploy().await.unwrap();
        Table(queue, cleanup)
    }

    async fn drop_tables(self) {
        self.0.undeploy().await.unwrap();
        self.1.forget(self.0.table().channel());
    }
}

/// Publishes `payloads` to `group` and dead-letters them, in order, each with the error
/// `boom <payload>`. Their ids, in order.
async fn kill<DB: Db>(q: &Queue<DB>, group: &str, payloads: &[&str]) -> Vec<i64> {
    q.publish_batch(payloads.iter().map(|p| Message::text(*p).group(group))).await.unwrap();
    let mut sub = q.subscribe().group(group).batch(payloads.len()).stream().await.unwrap();
    let mut ids = Vec::new();
    for payload in payloads {
        let d = next(&mut sub).await;
        assert_eq!(d.text().unwrap(), *payload);
        ids.push(d.id());
        d.dead_letter(&format!("boom {payload}")).await.unwrap();
    }
    ids
}

fn ids(letters: &[DeadLetter]) -> Vec<i64> {
    letters.iter().map(|l| l.id).collect()
}

async fn page<DB: Db>(q: &Queue<DB>, group: Option<&str>, limit: u32, offset: u64) -> Vec<i64> {
    let page = DeadLetterPage { group: group.map(str::to_owned), limit, offset };
    ids(&q.dead_letters(&page).await.unwrap())
}

/// Moves dead letter `id` of `q` back in time by two hours, with the test's own SQL.
async fn backdate(db: &DbPool, q: &Queue<impl Db>, id: i64) {
    let dead = format!("{}_dead", q.table());
    let sql = match db {
        DbPool::Postgres(_) => {
            format!("UPDATE \"{dead}\" SET failed_at = failed_at - interval '2 hours' WHERE id = $1")
        }
        DbPool::MySql(_) => {
            format!("UPDATE `{dead}` SET failed_at = failed_at - INTERVAL 2 HOUR WHERE id = ?")
        }
        DbPool::Sqlite(_) => format!("UPDATE `{dead}` SET failed_at = failed_at - 7200000000 WHERE id = ?"),
    };
    let sql = sqlx::AssertSqlSafe(sql);
    let changed = match db {
        DbPool::Postgres(pool) => sqlx::query(sql).bind(id).execute(pool).await.unwrap().rows_affected(),
        DbPool::MySql(pool) => sqlx::query(sql).bind(id).execute(pool).await.unwrap().rows_affected(),
        DbPool::Sqlite(pool) => sqlx::query(sql).bind(id).execute(pool).await.unwrap().rows_affected(),
    };
    assert_eq!(changed, 1);
}

/// Listing is newest first (by the time they died, not their ids), paged, filtered by
/// group; fetching one returns what died; a purge by id, older than an age and of all
/// deletes what it names and says how many; a requeue by id puts back exactly that
/// message (same id, group, payload and publish time, attempts from 0, ids that are not
/// dead letters passed over), and a requeue of all with a delay puts every one back,
/// not yet ready.
async fn list_fetch_requeue_purge<DB: Db>(env: Env<DB>) {
    let table = Table::new(&env.broker).await;
    let q = &table.0;
    let a = kill(q, "a", &["m0", "m1", "m2"]).await;
    let b = kill(q, "b", &["m3", "m4"]).await;
    let all: Vec<i64> = a.iter().chain(&b).copied().collect();
    let newest_first: Vec<i64> = all.iter().rev().copied().collect();
    assert_eq!(ids(&q.dead_letters(&DeadLetterPage::default()).await.unwrap()), newest_first);
    assert_eq!(page(q, None, 2, 0).await, newest_first[..2]);
    assert_eq!(page(q, None, 2, 2).await, newest_first[2..4]);
    assert_eq!(page(q, None, 2, 4).await, newest_first[4..]);
    assert_eq!(page(q, Some("a"), 10, 0).await, [a[2], a[1], a[0]]);
    assert_eq!(page(q, Some("a"), 1, 1).await, [a[1]]);
    assert!(page(q, Some("nobody"), 10, 0).await.is_empty());

    // Died two hours ago: last, though its id is the highest.
    backdate(&env.db, q, b[1]).await;
    assert_eq!(page(q, None, 10, 0).await, [b[0], a[2], a[1], a[0], b[1]]);

    let m0 = q.dead_letter(a[0]).await.unwrap().expect("dead letter m0");
    assert_eq!((m0.id, m0.group.as_str(), m0.payload.as_slice()), (a[0], "a", &b"m0"[..]));
    assert_eq!((m0.attempts, m0.last_error.as_deref()), (1, Some("boom m0")));
    assert!(m0.published_at <= m0.died_at, "{m0:?}");
    assert_eq!(q.dead_letter(i64::MAX).await.unwrap(), None);

    assert_eq!(q.purge_dead(&DeadLetters::OlderThan(Duration::from_secs(3600))).await.unwrap(), 1);
    assert_eq!(q.dead_letter(b[1]).await.unwrap(), None);

    assert_eq!(q.requeue_dead(&DeadLetters::Ids(vec![a[0], i64::MAX]), Duration::ZERO).await.unwrap(), 1);
    assert_eq!(q.depth("a").await.unwrap(), (1, 2));
    assert_eq!(q.dead_letter(a[0]).await.unwrap(), None);
    let mut sub = q.subscribe().group("a").stream().await.unwrap();
    let back = next(&mut sub).await;
    assert_eq!((back.id(), back.group(), back.payload()), (a[0], "a", &b"m0"[..]));
    assert_eq!((back.attempt(), back.published_at()), (1, m0.published_at));
    back.dead_letter("boom again").await.unwrap();
    let again = q.dead_letter(a[0]).await.unwrap().expect("dead again");
    assert_eq!((again.attempts, again.published_at), (1, m0.published_at), "attempts counted from 0");
    assert_eq!(again.last_error.as_deref(), Some("boom again"));

    assert_eq!(q.purge_dead(&DeadLetters::Ids(vec![a[1], i64::MAX])).await.unwrap(), 1);
    assert_eq!(page(q, None, 10, 0).await.len(), 3);

    let hour = Duration::from_secs(3600);
    assert_eq!(q.requeue_dead(&DeadLetters::All, hour).await.unwrap(), 3);
    assert!(page(q, None, 10, 0).await.is_empty());
    let stats = q.group_stats().await.unwrap();
    let figures: Vec<_> = stats.iter().map(|g| (g.group.as_str(), g.depth, g.ready, g.dead)).collect();
    assert_eq!(figures, [("a", 2, 0, Some(0)), ("b", 1, 0, Some(0))], "back, delayed an hour");

    kill(q, "c", &["m5", "m6"]).await;
    assert_eq!(q.purge_dead(&DeadLetters::All).await.unwrap(), 2);
    assert_eq!(q.purge_dead(&DeadLetters::All).await.unwrap(), 0);
    assert!(page(q, None, 10, 0).await.is_empty());
    table.drop_tables().await;
}
on_each_database!(list_fetch_requeue_purge);

/// Two requeues of the same dead letters at once put each back once: by id, one dead
/// letter at a time, and all of them.
async fn concurrent_requeues_move_once<DB: Db>(env: Env<DB>) {
    let table = Table::new(&env.broker).await;
    let q = &table.0;
    let payloads: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let payloads: Vec<&str> = payloads.iter().map(String::as_str).collect();
    let dead = kill(q, "", &payloads).await;
    for &id in &dead {
        let which = DeadLetters::Ids(vec![id]);
        let (one, two) =
            tokio::join!(q.requeue_dead(&which, Duration::ZERO), q.requeue_dead(&which, Duration::ZERO));
        assert_eq!(one.unwrap() + two.unwrap(), 1, "dead letter {id}");
    }
    assert_eq!(q.depth("").await.unwrap(), (20, 0));

    let mut sub = q.subscribe().batch(20).stream().await.unwrap();
    for _ in 0..20 {
        next(&mut sub).await.dead_letter("boom").await.unwrap();
    }
    assert_eq!(q.depth("").await.unwrap(), (0, 20));
    let (one, two) = tokio::join!(
        q.requeue_dead(&DeadLetters::All, Duration::ZERO),
        q.requeue_dead(&DeadLetters::All, Duration::ZERO)
    );
    assert_eq!(one.unwrap() + two.unwrap(), 20);
    assert_eq!(q.depth("").await.unwrap(), (20, 0));
    table.drop_tables().await;
}
on_each_database!(concurrent_requeues_move_once);

/// A requeue wakes the broker's waiting subscription of the group at once: its poll
/// interval (an hour) would not have found the message within the test.
async fn requeue_wakes_subscriptions<DB: Db>(env: Env<DB>) {
    let table = Table::new(&env.broker).await;
    let q = &table.0;
    let dead = kill(q, "w", &["wake me"]).await;
    let mut sub = q.subscribe().group("w").poll_interval(Duration::from_secs(3600)).stream().await.unwrap();
    let claims = env.broker.stats().claims;
    let waiting = tokio::spawn(async move { next(&mut sub).await.id() });
    // Its first claim found nothing: from then on only a wake-up (kept if it comes before
    // the wait begins) or the hour's poll makes it claim again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while env.broker.stats().claims == claims {
        assert!(tokio::time::Instant::now() < deadline, "the subscription never claimed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(q.requeue_dead(&DeadLetters::Ids(dead.clone()), Duration::ZERO).await.unwrap(), 1);
    assert_eq!(waiting.await.unwrap(), dead[0]);
    table.drop_tables().await;
}
on_each_database!(requeue_wakes_subscriptions);

/// An error with a cause, as a `Box<dyn Error>` carries it.
#[derive(Debug)]
struct Outer(std::io::Error);

impl std::fmt::Display for Outer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cannot resize 42.png")
    }
}

impl std::error::Error for Outer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// An error only `Display`, writing its causes in its alternate form as `anyhow` does.
struct Chained(&'static str, &'static str);

impl std::fmt::Display for Chained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match f.alternate() {
            true => write!(f, "{}: {}", self.0, self.1),
            false => f.write_str(self.0),
        }
    }
}

/// A library handler's failure is dead-lettered with its causes: a boxed error's source
/// chain, and a `Display`-only error's alternate form (an `anyhow` error's chain). Run
/// inline with the test harness, which settles each message as a runner does.
async fn handler_errors_keep_their_causes<DB: Db>(env: Env<DB>) {
    let harness = TestBroker::<DB>::connect_with(&env.url, options()).await.unwrap();
    let q = harness.queue("dl_causes").await.unwrap();
    // Each error type through the harness's drain, one message each.
    q.publish(Message::text("boxed").group("boxed")).await.unwrap();
    let boxed = harness
        .drain(&q, |_| async {
            let cause = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
            Err::<(), Box<dyn std::error::Error + Send + Sync>>(Box::new(Outer(cause)))
        })
        .await
        .unwrap();
    q.publish(Message::text("chained").group("chained")).await.unwrap();
    let chained = harness
        .drain(&q, |_| async { Err::<(), Chained>(Chained("upload failed", "disk full")) })
        .await
        .unwrap();
    for drained in [boxed, chained] {
        assert!(
            matches!(&drained[..], [d] if matches!(d.handled, Handled::DeadLettered { .. })),
            "{drained:?}"
        );
    }
    let mut errors: Vec<(String, Option<String>)> = q
        .dead_letters(&DeadLetterPage::default())
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.group, l.last_error))
        .collect();
    errors.sort();
    assert_eq!(
        errors,
        [
            ("boxed".to_owned(), Some("cannot resize 42.png: connection refused".to_owned())),
            ("chained".to_owned(), Some("upload failed: disk full".to_owned())),
        ]
    );
    harness.cleanup().await.unwrap();
}
on_each_database!(handler_errors_keep_their_causes);

/// Drops queue `q`'s dead-letter table with the test's own SQL, as an operator might.
async fn drop_dead_table(db: &DbPool, q: &Queue<impl Db>) {
    let dead = format!("{}_dead", q.table());
    let sql = sqlx::AssertSqlSafe(match db {
        DbPool::MySql(_) => format!("DROP TABLE `{dead}`"),
        _ => format!("DROP TABLE \"{dead}\""),
    });
    match db {
        DbPool::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(drop),
        DbPool::MySql(pool) => sqlx::query(sql).execute(pool).await.map(drop),
        DbPool::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(drop),
    }
    .unwrap();
}

/// Messages in queue `q`'s own table, counted with the test's own SQL (the queue's
/// figures read the dead-letter table too).
async fn in_table(db: &DbPool, q: &Queue<impl Db>) -> i64 {
    let table = q.table().to_string();
    let sql = sqlx::AssertSqlSafe(match db {
        DbPool::MySql(_) => format!("SELECT COUNT(*) FROM `{table}`"),
        _ => format!("SELECT COUNT(*) FROM \"{table}\""),
    });
    match db {
        DbPool::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        DbPool::MySql(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        DbPool::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
    }
}

/// A dead-letter move that fails (the dead-letter table dropped by hand) is an error
/// naming that table, not a dead letter: nothing is counted as dead-lettered, the message
/// stays in its queue and comes back after the retry delay with its attempt not counted
/// again (no ever-growing "attempt 6 of 1"), and once a redeploy brings the table back it
/// is dead-lettered.
async fn a_failed_dead_letter_move_is_reported_and_retried<DB: Db>(env: Env<DB>) {
    let table = Table::new(&env.broker).await;
    let retry = RetryPolicy { max_attempts: 1, base: Duration::from_millis(300), ..RetryPolicy::default() };
    let options = BrokerOptions { retry, lease: Duration::from_secs(60), ..BrokerOptions::default() };
    let broker = Broker::new(env.broker.pool().clone(), options).await.unwrap();
    let q = broker.queue(&table.0.table().to_string()).unwrap();
    q.publish(Message::text("doomed")).await.unwrap();
    drop_dead_table(&env.db, &q).await;

    let mut sub = q.subscribe().stream().await.unwrap();
    let d = next(&mut sub).await;
    let id = d.id();
    assert_eq!(d.attempt(), 1);
    let err = d.fail("boom").await.expect_err("a dead-letter move into a missing table");
    assert!(matches!(&err, Error::DeadLetterFailed { id: failed, .. } if *failed == id), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&format!("`{}_dead`", q.table())), "the dead-letter table is named: {message}");
    let stats = broker.stats();
    assert_eq!((stats.dead_lettered, stats.dead_letter_failures), (0, 1), "not counted as dead-lettered");
    assert_eq!(in_table(&env.db, &q).await, 1, "the message is still in its queue");

    // Back after the delay (not the minute's lease), its attempt still the first.
    let again = next(&mut sub).await;
    assert_eq!((again.id(), again.attempt()), (id, 1));
    again.release().await.unwrap();

    q.deploy().await.unwrap();
    let last = next(&mut sub).await;
    assert_eq!((last.id(), last.attempt()), (id, 1));
    last.fail("boom again").await.unwrap();
    let letter = q.dead_letter(id).await.unwrap().expect("dead-lettered once the table is back");
    assert_eq!((letter.attempts, letter.last_error.as_deref()), (1, Some("boom again")));
    let stats = broker.stats();
    assert_eq!((stats.dead_lettered, stats.dead_letter_failures), (1, 1));
    assert_eq!(in_table(&env.db, &q).await, 0);
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    table.drop_tables().await;
}
on_each_database!(a_failed_dead_letter_move_is_reported_and_retried);

/// The same for a transactional handler: its batch's dead letters behind a savepoint, a
/// failed move undoes neither the batch's transaction nor puts its rows back at once (they
/// were claimable again the moment it rolled back, in a loop): the message is back after
/// the backoff, its attempt not counted, the failure counted; once the table is back it
/// is dead-lettered once.
async fn a_failed_dead_letter_move_of_a_transactional_handler_is_retried<DB: Db>(env: Env<DB>) {
    let table = Table::new(&env.broker).await;
    let retry = RetryPolicy { max_attempts: 1, base: Duration::from_millis(400), ..RetryPolicy::default() };
    let options =
        BrokerOptions { retry, poll_interval: Duration::from_millis(20), ..BrokerOptions::default() };
    let broker = Broker::new(env.broker.pool().clone(), options).await.unwrap();
    let q = broker.queue(&table.0.table().to_string()).unwrap();
    q.publish(Message::text("doomed")).await.unwrap();
    drop_dead_table(&env.db, &q).await;

    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let runner = tokio::spawn(q.subscribe().run_tx(move |_conn, _message| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Err::<(), _>("boom") })
    }));
    let waited = tokio::time::Instant::now();
    while broker.stats().dead_letter_failures == 0 {
        assert!(waited.elapsed() < Duration::from_secs(20), "no failed dead-letter move counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Polled every 20 ms, a batch put back at once would have run about 15 times more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = broker.stats();
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "run again before its backoff");
    assert_eq!((stats.dead_lettered, stats.dead_letter_failures), (0, 1), "not counted as dead-lettered");
    assert_eq!(in_table(&env.db, &q).await, 1, "the message is still in its queue");

    q.deploy().await.unwrap();
    let waited = tokio::time::Instant::now();
    while broker.stats().dead_lettered == 0 {
        assert!(waited.elapsed() < Duration::from_secs(20), "not dead-lettered once the table is back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    runner.abort();
    let _ = runner.await;
    let letters = q.dead_letters(&DeadLetterPage::default()).await.unwrap();
    assert_eq!(letters.len(), 1, "dead-lettered once");
    assert_eq!(letters[0].attempts, 1, "its attempt not counted while the move failed");
    assert_eq!(in_table(&env.db, &q).await, 0);
    broker.shutdown(Duration::from_secs(1)).await;
    table.drop_tables().await;
}
on_each_database!(a_failed_dead_letter_move_of_a_transactional_handler_is_retried);
