//! Job control against the real PostgreSQL and MariaDB and a temporary SQLite file:
//! cancelling waiting and running messages, timeouts (per message and per subscription),
//! heartbeats, a lease that ran out not renewed, and a lost lease reported to its handler.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Cleanup, Place, next_delivery as next, on_each_database, unique};
use rowbus::control::StopReason;
use rowbus::dead::DeadLetterPage;
use rowbus::history::{HistoryOutcome, HistoryPage};
use rowbus::{Broker, BrokerOptions, Db, DbPool, Delivery, Error, Message, Queue, RetryPolicy};
use tokio::sync::mpsc;

/// How long a test waits for something that should happen well within it.
const WITHIN: Duration = Duration::from_secs(20);

/// A broker polling every 100 ms whose failed messages run again after 10 ms and die
/// at their second failure, and the same pool as a [`DbPool`]; the SQLite file lives as
/// long as it.
struct Env<DB: Db> {
    broker: Broker<DB>,
    db: DbPool,
    _place: Place,
}

fn options() -> BrokerOptions {
    BrokerOptions {
        poll_interval: Duration::from_millis(100),
        retry: RetryPolicy {
            max_attempts: 2,
            base: Duration::from_millis(10),
            max_delay: Duration::from_millis(10),
            ..RetryPolicy::default()
        },
        ..BrokerOptions::default()
    }
}

/// One test of `scenario` on `database`, for [`on_each_database!`].
use common::env_test as database_test;

async fn env<DB: Db>(pool: sqlx::Pool<DB>, db: DbPool, place: Place) -> Env<DB> {
    Env { broker: Broker::new(pool, options()).await.unwrap(), db, _place: place }
}

/// A new queue table, dropped with the tables beside it when the test ends, also when it
/// fails (the guard).
struct Table<DB: Db>(Queue<DB>, Cleanup);

impl<DB: Db> Table<DB> {
    async fn new(broker: &Broker<DB>) -> Self {
        let cleanup = Cleanup::new(DB::BACKEND);
        let queue = broker.queue(&cleanup.queue(&unique("ctl"))).unwrap();
        queue.deploy().await.unwrap();
        Table(queue, cleanup)
    }

    async fn drop_tables(self) {
        self.0.undeploy().await.unwrap();
        self.1.forget(self.0.table().channel());
    }
}

/// Runs `sql` (binding `id`) on the test's own connection; the rows it changed.
async fn exec_with_id(db: &DbPool, sql: String, id: i64) -> u64 {
    let sql = sqlx::AssertSqlSafe(sql);
    match db {
        DbPool::Postgres(pool) => sqlx::query(sql).bind(id).execute(pool).await.unwrap().rows_affected(),
        DbPool::MySql(pool) => sqlx::query(sql).bind(id).execute(pool).await.unwrap().rows_affected(),
        DbPool::Sqlite(pool) => sqlx::query(sql).bind(id).execute(pool).await.unwrap().rows_affected(),
    }
}

/// The queue table's name as the test's own SQL writes it.
fn quoted(db: &DbPool, q: &Queue<impl Db>) -> String {
    match db {
        DbPool::Postgres(_) => format!("\"{}\"", q.table()),
        _ => format!("`{}`", q.table()),
    }
}

/// A ready, a delayed and a retrying message are removed and never claimed again; each
/// goes into the kept history as cancelled; an id not in the queue is passed over; a
/// second cancel of the same ids finds nothing. A group's cancel takes that group only.
async fn cancel_waiting<DB: Db>(env: Env<DB>) {
    let t = Table::new(&env.broker).await;
    let q = &t.0;
    q.deploy_keeping(Duration::from_secs(3600)).await.unwrap();
    q.publish(Message::text("ready")).await.unwrap();
    q.publish(Message::text("delayed").delay(Duration::from_secs(3600))).await.unwrap();
    q.publish(Message::text("retrying")).await.unwrap();
    q.publish(Message::text("other").group("g")).await.unwrap();
    let mut sub = q.subscribe().batch(2).stream().await.unwrap();
    let (first, retrying) = (next(&mut sub).await, next(&mut sub).await);
    assert_eq!((first.text().unwrap(), retrying.text().unwrap()), ("ready", "retrying"));
    let ready = first.id();
    first.release().await.unwrap();
    let retrying_id = retrying.id();
    retrying.retry(Duration::from_secs(3600), "later").await.unwrap();
    drop(sub);
    // The delayed one's id lies between the two others'.
    let mut ids: Vec<i64> = (ready..=retrying_id).collect();
    ids.extend([retrying_id + 1000, ready]);
    let done = q.cancel(&ids).await.unwrap();
    assert_eq!((done.ids.len(), done.ids[0], done.ids[2]), (3, ready, retrying_id), "{done:?}");
    let delayed = done.ids[1];
    assert!(done.running.is_empty(), "{done:?}");
    assert_eq!(q.cancel(&[ready, delayed, retrying_id]).await.unwrap().count(), 0);
    assert_eq!(q.depth("").await.unwrap().0, 0, "nothing left in the default group");

    let history = q.history(&HistoryPage::default()).await.unwrap();
    let mut cancelled: Vec<(i64, HistoryOutcome)> =
        history.iter().map(|h| (h.id, h.outcome.clone())).collect();
    cancelled.sort_by_key(|(id, _)| *id);
    let expected = [ready, delayed, retrying_id].map(|id| (id, HistoryOutcome::Cancelled));
    assert_eq!(cancelled, expected);
    let kept = history.iter().find(|h| h.id == retrying_id).unwrap();
    assert_eq!(kept.last_error.as_deref(), Some("later"), "the retry's error is kept");

    // Nothing comes back: a claim finds the queue's default group empty.
    let mut sub = q.subscribe().poll_interval(Duration::from_millis(50)).stream().await.unwrap();
    use futures::StreamExt as _;
    assert!(tokio::time::timeout(Duration::from_millis(400), sub.next()).await.is_err());
    drop(sub);

    // The group's cancel: its one message, nothing of the default group's.
    let stays = q.publish_with_id(Message::text("stays").dedup_id("s")).await.unwrap().unwrap();
    assert_eq!(q.publish_with_id(Message::text("again").dedup_id("s")).await.unwrap(), None);
    let done = q.cancel_group("g").await.unwrap();
    assert_eq!(done.count(), 1);
    assert_eq!((q.depth("g").await.unwrap().0, q.depth("").await.unwrap().0), (0, 1));
    // The id a publish returned is the message's.
    assert_eq!(q.cancel(&[stays]).await.unwrap().ids, vec![stays]);
    assert_eq!(env.broker.stats().cancelled, 5);
    // Counted in the database too, for `rowbus stats` and the dashboard elsewhere.
    assert_eq!(q.counts().await.unwrap().unwrap().cancelled, 5);
    t.drop_tables().await;
}
on_each_database!(cancel_waiting);

/// What a handler of `cancel_running` reports.
#[derive(Debug)]
enum Seen {
    Started(i64, String),
    /// Told to stop, for this reason; whether its own acknowledgement was refused as a
    /// lost lease.
    Stopped(StopReason, bool),
}

/// A running message, cancelled from the same process: its handler's `cancelled()`
/// resolves, its acknowledgement is refused, and the message is gone. A handler that
/// ignores the cancel is dropped after the grace period: its worker takes the next one.
async fn cancel_running<DB: Db>(env: Env<DB>) {
    let t = Table::new(&env.broker).await;
    let q = t.0.clone();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let runner = tokio::spawn(q.subscribe().workers(1).grace(Duration::from_millis(300)).run(
        move |d: Delivery<DB>| {
            let tx = tx.clone();
            async move {
                let text = d.text().unwrap().to_owned();
                tx.send(Seen::Started(d.id(), text.clone())).unwrap();
                match text.as_str() {
                    "polite" => {
                        let reason = d.cancelled().await;
                        assert!(d.is_cancelled());
                        let refused = matches!(d.ack().await, Err(Error::LeaseLost { .. }));
                        tx.send(Seen::Stopped(reason, refused)).unwrap();
                    }
                    "stubborn" => tokio::time::sleep(Duration::from_secs(3600)).await,
                    _ => {}
                }
                Ok::<_, Error>(())
            }
        },
    ));
    let started = |seen: Option<Seen>| match seen {
        Some(Seen::Started(id, text)) => (id, text),
        other => panic!("expected a start, got {other:?}"),
    };
    q.publish(Message::text("polite")).await.unwrap();
    let (id, _) = started(tokio::time::timeout(WITHIN, rx.recv()).await.unwrap());
    let done = q.cancel(&[id]).await.unwrap();
    assert_eq!((done.ids.clone(), done.running.clone()), (vec![id], vec![id]));
    match tokio::time::timeout(WITHIN, rx.recv()).await.unwrap() {
        Some(Seen::Stopped(StopReason::Cancelled, true)) => {}
        other => panic!("expected a cancelled handler whose ack was refused, got {other:?}"),
    }

    q.publish(Message::text("stubborn")).await.unwrap();
    let (id, _) = started(tokio::time::timeout(WITHIN, rx.recv()).await.unwrap());
    assert_eq!(q.cancel(&[id]).await.unwrap().running, vec![id]);
    // One worker: the next message runs once the stubborn handler was dropped.
    q.publish(Message::text("next")).await.unwrap();
    let (_, text) = started(tokio::time::timeout(WITHIN, rx.recv()).await.unwrap());
    assert_eq!(text, "next");
    env.broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    // The acknowledgement of "next" went out at the latest at the shutdown.
    assert_eq!(q.depth("").await.unwrap().0, 0);
    assert_eq!(env.broker.stats().cancelled, 2);
    t.drop_tables().await;
}
on_each_database!(cancel_running);

/// A handler past its timeout is told (`cancelled()` resolves with the reason) and the
/// attempt fails with "timed out after ...": retried, then dead-lettered. A message's own
/// timeout beats the subscription's; one that ignores the signal is dropped after the grace.
async fn timeouts<DB: Db>(env: Env<DB>) {
    let t = Table::new(&env.broker).await;
    let q = t.0.clone();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let runner = tokio::spawn(
        q.subscribe().workers(2).timeout(Duration::from_millis(300)).grace(Duration::from_millis(200)).run(
            move |d: Delivery<DB>| {
                let tx = tx.clone();
                async move {
                    if d.text().unwrap() == "polite" {
                        let reason = d.cancelled().await;
                        tx.send((d.id(), reason)).unwrap();
                        // Its outcome is not applied: the attempt timed out.
                        return Ok::<_, Error>(());
                    }
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(())
                }
            },
        ),
    );
    let polite = q.publish(Message::text("polite").timeout(Duration::from_millis(150))).await.unwrap();
    assert_eq!(polite.stored, 1);
    q.publish(Message::text("stubborn")).await.unwrap();
    for _ in 0..2 {
        let (_, reason) = tokio::time::timeout(WITHIN, rx.recv()).await.unwrap().unwrap();
        assert_eq!(reason, StopReason::TimedOut(Duration::from_millis(150)));
    }
    let deadline = tokio::time::Instant::now() + WITHIN;
    let dead = loop {
        let dead = q.dead_letters(&DeadLetterPage::default()).await.unwrap();
        if dead.len() == 2 || tokio::time::Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut errors: Vec<(String, i64, Option<String>)> = dead
        .iter()
        .map(|d| (String::from_utf8(d.payload.clone()).unwrap(), d.attempts, d.last_error.clone()))
        .collect();
    errors.sort();
    assert_eq!(
        errors,
        vec![
            ("polite".to_owned(), 2, Some("timed out after 150ms".to_owned())),
            ("stubborn".to_owned(), 2, Some("timed out after 300ms".to_owned())),
        ]
    );
    assert_eq!(env.broker.stats().timed_out, 4);
    assert_eq!(q.counts().await.unwrap().unwrap().timed_out, 4);
    env.broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    // A timeout out of range is refused at publish and at the subscription's start.
    let refused = q.publish(Message::text("x").header(rowbus::control::TIMEOUT_HEADER, "soon")).await;
    assert!(matches!(refused, Err(Error::InvalidMessage { field: "timeout", .. })), "{refused:?}");
    t.drop_tables().await;
}
on_each_database!(timeouts);

/// A handler that runs three times its lease: with heartbeats its lease holds (one run,
/// acknowledged, no lease lost); without, a second worker takes the message again when
/// the lease runs out, and the first handler is told its lease was lost.
async fn heartbeats<DB: Db>(env: Env<DB>) {
    for heartbeat in [true, false] {
        let t = Table::new(&env.broker).await;
        let q = t.0.clone();
        let runs = Arc::new(AtomicUsize::new(0));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (counted, done) = (runs.clone(), tx.clone());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let runner = tokio::spawn(
            q.subscribe()
                .workers(2)
                .lease(Duration::from_secs(1))
                .heartbeat(heartbeat)
                .until(async move {
                    let _ = stop_rx.await;
                })
                .run(move |d: Delivery<DB>| {
                    let (counted, done) = (counted.clone(), done.clone());
                    async move {
                        if counted.fetch_add(1, Ordering::SeqCst) > 0 {
                            // The second run, after a lost lease: it holds the message
                            // while the first one finds out.
                            tokio::time::sleep(Duration::from_millis(1500)).await;
                            return Ok::<_, Error>(());
                        }
                        let lost = tokio::select! {
                            () = d.lease_lost() => true,
                            () = tokio::time::sleep(Duration::from_secs(3)) => false,
                        };
                        if lost {
                            // Let the second run begin.
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        let acked = d.ack().await;
                        done.send((lost, acked.is_ok())).unwrap();
                        Ok(())
                    }
                }),
        );
        q.publish(Message::text("long")).await.unwrap();
        let (lost, acked) = tokio::time::timeout(WITHIN, rx.recv()).await.unwrap().unwrap();
        let _ = stop_tx.send(());
        runner.await.unwrap().unwrap();
        if heartbeat {
            assert_eq!((lost, acked, runs.load(Ordering::SeqCst)), (false, true, 1), "with heartbeats");
        } else {
            assert!(lost, "without heartbeats the lease is lost and the handler told");
            assert!(!acked, "its acknowledgement is refused");
            assert_eq!(runs.load(Ordering::SeqCst), 2, "and it ran again");
        }
        t.drop_tables().await;
    }
}
on_each_database!(heartbeats);

/// Moves message `id`'s `lease_until` an hour back, its token kept: its lease has run out
/// while nobody claimed it since, as for a holder that stalled past its lease.
async fn run_out(db: &DbPool, q: &Queue<impl Db>, id: i64) {
    let back = match db {
        DbPool::Postgres(_) => "lease_until - interval '1 hour'",
        DbPool::MySql(_) => "lease_until - INTERVAL 1 HOUR",
        DbPool::Sqlite(_) => "lease_until - 3600000000",
    };
    let sql = format!("UPDATE {} SET lease_until = {back} WHERE id = {}", quoted(db, q), bind(db));
    assert_eq!(exec_with_id(db, sql, id).await, 1);
}

/// A lease that ran out is not renewed, even where nobody claimed the message since: an
/// extension is refused as a lost lease, and a heartbeat leaves it run out (its handler is
/// told), so the message is claimable again at once. Before, both renewed it, and a
/// concurrency limit (which counts only unexpired leases) ran it uncounted.
async fn run_out_leases_are_not_renewed<DB: Db>(env: Env<DB>) {
    let t = Table::new(&env.broker).await;
    let q = t.0.clone();
    q.publish(Message::text("extended")).await.unwrap();
    let mut sub = q.subscribe().lease(Duration::from_secs(30)).stream().await.unwrap();
    let held = next(&mut sub).await;
    held.extend_lease(Duration::from_secs(30)).await.expect("a lease that runs is extended");
    run_out(&env.db, &q, held.id()).await;
    let refused = held.extend_lease(Duration::from_secs(30)).await;
    assert!(matches!(refused, Err(Error::LeaseLost { id, .. }) if id == held.id()), "{refused:?}");
    let again = next(&mut sub).await;
    assert_eq!((again.id(), again.attempt()), (held.id(), 2), "claimable again at once");
    assert!(matches!(held.ack().await, Err(Error::LeaseLost { .. })));
    again.ack().await.unwrap();
    drop(sub);

    // The heartbeat: every third of the 3 s lease, with a look every 100 ms.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let hold = release.clone();
    let runner = tokio::spawn(
        q.subscribe()
            .heartbeat(true)
            .lease(Duration::from_secs(3))
            .until(async move {
                let _ = stop_rx.await;
            })
            .run(move |d: Delivery<DB>| {
                let (tx, hold) = (tx.clone(), hold.clone());
                async move {
                    tx.send((d.id(), None)).unwrap();
                    tokio::time::timeout(WITHIN, d.lease_lost())
                        .await
                        .expect("the run-out lease is reported");
                    hold.notified().await;
                    let id = d.id();
                    let refused = matches!(d.ack().await, Err(Error::LeaseLost { .. }));
                    tx.send((id, Some(refused))).unwrap();
                    Ok::<_, Error>(())
                }
            }),
    );
    q.publish(Message::text("beating")).await.unwrap();
    let (id, _) = tokio::time::timeout(WITHIN, rx.recv()).await.unwrap().unwrap();
    run_out(&env.db, &q, id).await;
    // Past the next heartbeat: one that renewed the lease would keep the message from the
    // claim below for as long as the handler runs.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut sub = q.subscribe().stream().await.unwrap();
    let taken = tokio::time::timeout(Duration::from_secs(2), next(&mut sub)).await;
    let taken = taken.expect("the heartbeat left the run-out lease as it was: claimable");
    assert_eq!((taken.id(), taken.attempt()), (id, 2));
    release.notify_one();
    let (_, refused) = tokio::time::timeout(WITHIN, rx.recv()).await.unwrap().unwrap();
    assert_eq!(refused, Some(true), "the first holder's acknowledgement is refused");
    taken.ack().await.unwrap();
    drop(sub);
    let _ = stop_tx.send(());
    runner.await.unwrap().unwrap();
    t.drop_tables().await;
}
on_each_database!(run_out_leases_are_not_renewed);

/// A lease taken from under a running handler (the test changes its token, as a claim
/// elsewhere would) is reported: `lease_lost()` resolves within a poll interval, and the
/// acknowledgement is refused.
async fn lease_lost_reported<DB: Db>(env: Env<DB>) {
    let t = Table::new(&env.broker).await;
    let q = t.0.clone();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let runner = tokio::spawn(q.subscribe().heartbeat(true).lease(Duration::from_secs(3)).run(
        move |d: Delivery<DB>| {
            let tx = tx.clone();
            async move {
                tx.send((d.id(), None)).unwrap();
                tokio::time::timeout(WITHIN, d.lease_lost()).await.expect("the lost lease is reported");
                assert!(d.is_lease_lost() && !d.is_cancelled());
                let id = d.id();
                let refused = matches!(d.ack().await, Err(Error::LeaseLost { .. }));
                tx.send((id, Some(refused))).unwrap();
                Ok::<_, Error>(())
            }
        },
    ));
    q.publish(Message::text("x")).await.unwrap();
    let (id, _) = tokio::time::timeout(WITHIN, rx.recv()).await.unwrap().unwrap();
    let sql = format!("UPDATE {} SET lease = lease + 1 WHERE id = {}", quoted(&env.db, &q), bind(&env.db));
    assert_eq!(exec_with_id(&env.db, sql, id).await, 1);
    let (_, refused) = tokio::time::timeout(WITHIN, rx.recv()).await.unwrap().unwrap();
    assert_eq!(refused, Some(true));
    // The refused acknowledgement is counted in the database, by a task of its own.
    let deadline = tokio::time::Instant::now() + WITHIN;
    while q.counts().await.unwrap().unwrap().lease_lost == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the lost lease was never counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    t.drop_tables().await;
}
on_each_database!(lease_lost_reported);

/// The first bind's placeholder in the test's own SQL.
fn bind(db: &DbPool) -> &'static str {
    match db {
        DbPool::Postgres(_) => "$1",
        _ => "?",
    }
}

/// A running keyed message, cancelled, frees its key at once: the next message of the key
/// is claimed while the first one's holder still runs (its settlement then refused).
async fn cancel_frees_the_key<DB: Db>(env: Env<DB>) {
    let t = Table::new(&env.broker).await;
    let q = &t.0;
    let first = q.publish_with_id(Message::text("k1").key("k")).await.unwrap().unwrap();
    q.publish(Message::text("k2").key("k")).await.unwrap();
    let mut sub = q.subscribe().poll_interval(Duration::from_millis(50)).stream().await.unwrap();
    let held = next(&mut sub).await;
    assert_eq!(held.id(), first);
    {
        use futures::StreamExt as _;
        let waiting = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
        assert!(waiting.is_err(), "the key's next message waits while the first is held");
    }
    assert_eq!(q.cancel(&[first]).await.unwrap().running, vec![first]);
    let second = next(&mut sub).await;
    assert_eq!(second.text().unwrap(), "k2");
    assert!(matches!(held.ack().await, Err(Error::LeaseLost { .. })));
    second.ack().await.unwrap();
    drop(sub);
    t.drop_tables().await;
}
on_each_database!(cancel_frees_the_key);

/// Four cancels racing for the same messages, from two brokers: each message is cancelled
/// exactly once, and the reports add up to the messages published.
async fn racing_cancels<DB: Db>(env: Env<DB>) {
    let t = Table::new(&env.broker).await;
    let q = t.0.clone();
    let mut ids = Vec::new();
    for i in 0..120 {
        ids.push(
            q.publish_with_id(Message::text(format!("m{i}")).delay(Duration::from_secs(3600)))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let other = Broker::new(env.broker.pool().clone(), options()).await.unwrap();
    let other_q = other.queue(&q.table().to_string()).unwrap();
    let mut racers = Vec::new();
    for racer in 0..4 {
        let (q, ids) = (if racer % 2 == 0 { q.clone() } else { other_q.clone() }, ids.clone());
        racers.push(tokio::spawn(async move { q.cancel(&ids).await.unwrap().ids }));
    }
    let mut all = Vec::new();
    for racer in racers {
        all.extend(racer.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, ids, "each message cancelled exactly once");
    assert_eq!(q.depth("").await.unwrap().0, 0);
    t.drop_tables().await;
}
on_each_database!(racing_cancels);
