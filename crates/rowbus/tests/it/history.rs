//! Kept history against the real PostgreSQL and MariaDB and a temporary SQLite file: a
//! queue deployed with a keep duration moves every handled message into `<table>_hist`
//! with its outcome and attempts (single acknowledgements, runners' batched ones, drops,
//! dead letters, transactional handlers); a queue without one keeps nothing; the cleanup
//! deletes expired rows in batches, and a consuming broker runs it; deploying again adds
//! the history tables to a queue made without them; moves wait for no message they do not
//! move.

use crate::common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Cleanup, Place, next_delivery as next, on_each_database, unique};
use rowbus::history::{HistoryEntry, HistoryOutcome, HistoryPage};
use rowbus::{Broker, BrokerOptions, Db, DbPool, Error, Message, Outcome, Queue, RetryPolicy};

/// A broker whose messages die at their first failure, and the same pool as a [`DbPool`]
/// for the test's own statements; the SQLite file lives as long as it.
struct Env<DB: Db> {
    broker: Broker<DB>,
    db: DbPool,
    _place: Place,
}

fn options() -> BrokerOptions {
    BrokerOptions {
        retry: RetryPolicy { max_attempts: 1, ..RetryPolicy::default() },
        poll_interval: Duration::from_millis(50),
        ..BrokerOptions::default()
    }
}

/// One test of `scenario` on `database`, for [`on_each_database!`].
use common::env_test as database_test;

async fn env<DB: Db>(pool: sqlx::Pool<DB>, db: DbPool, place: Place) -> Env<DB> {
    Env { broker: Broker::new(pool, options()).await.unwrap(), db, _place: place }
}

/// A new queue, its tables dropped when the guard goes (also when the test fails).
fn new_queue<DB: Db>(broker: &Broker<DB>, cleanup: &Cleanup) -> Queue<DB> {
    broker.queue(&cleanup.queue(&unique("hist"))).unwrap()
}

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

/// The whole history, newest first.
async fn history<DB: Db>(q: &Queue<DB>) -> Vec<HistoryEntry> {
    q.history(&HistoryPage { limit: 1000, ..HistoryPage::default() }).await.unwrap()
}

/// Waits (at most 20 s) until `check` holds.
async fn eventually<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "{what} within 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The entry for payload `text`.
fn entry<'a>(entries: &'a [HistoryEntry], text: &str) -> &'a HistoryEntry {
    entries
        .iter()
        .find(|e| e.payload == text.as_bytes())
        .unwrap_or_else(|| panic!("{text} kept: {entries:#?}"))
}

/// Each way a leased message is settled lands in the history: a single acknowledgement
/// (with the attempts a retry added and its error), a dead letter with its reason, a
/// handler's drop, and the acknowledgements and drops that runners send in batches; each
/// with its group, payload, attempts and publish time, newest first; paging and the group
/// filter work.
async fn leased_settlements_are_kept<DB: Db>(env: Env<DB>) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = new_queue(&env.broker, &cleanup);
    q.deploy_keeping(WEEK).await.unwrap();
    assert_eq!(q.keep().await.unwrap(), Some(WEEK));

    q.publish_batch(["acked", "retried", "dead", "discarded"].map(Message::text)).await.unwrap();
    let mut sub = q.subscribe().stream().await.unwrap();
    let mut seen = 0;
    while seen < 5 {
        let d = next(&mut sub).await;
        seen += 1;
        match (d.text().unwrap(), d.attempt()) {
            ("acked", _) | ("retried", 2) => d.ack().await.unwrap(),
            ("retried", _) => d.retry(Duration::ZERO, "not yet").await.unwrap(),
            ("dead", _) => d.dead_letter("boom").await.unwrap(),
            ("discarded", _) => d.discard().await.unwrap(),
            other => panic!("unexpected {other:?}"),
        }
    }
    drop(sub);

    // A runner's acknowledgements ride on its claims or go out in batches; a batch
    // runner's drop is one statement.
    q.publish_batch((0..6).map(|i| Message::text(format!("run {i}")).group("runs"))).await.unwrap();
    q.publish_batch((0..3).map(|i| Message::text(format!("drop {i}")).group("drops"))).await.unwrap();
    let handled = Arc::new(AtomicUsize::new(0));
    let (done, stop) = tokio::sync::oneshot::channel::<()>();
    let done = std::sync::Mutex::new(Some(done));
    let count = handled.clone();
    let runs = q.subscribe().group("runs").workers(3).until(async { drop(stop.await) }).run(move |_d| {
        if count.fetch_add(1, Ordering::SeqCst) + 1 == 6 {
            done.lock().unwrap().take().map(|d| d.send(()));
        }
        async { Ok::<_, Error>(()) }
    });
    runs.await.unwrap();
    let (done, stop) = tokio::sync::oneshot::channel::<()>();
    let done = std::sync::Mutex::new(Some(done));
    let drops =
        q.subscribe().group("drops").batch(3).until(async { drop(stop.await) }).run_batch(move |batch| {
            assert_eq!(batch.len(), 3, "one claim takes the three");
            done.lock().unwrap().take().map(|d| d.send(()));
            async { Ok::<_, Error>(Outcome::Drop) }
        });
    drops.await.unwrap();

    eventually("13 kept", || async { history(&q).await.len() == 13 }).await;
    let kept = history(&q).await;
    let acked = entry(&kept, "acked");
    assert_eq!(
        (acked.outcome.clone(), acked.attempts, acked.group.as_str()),
        (HistoryOutcome::Acknowledged, 1, "")
    );
    assert!(acked.handled_at >= acked.published_at);
    let retried = entry(&kept, "retried");
    assert_eq!((retried.outcome.clone(), retried.attempts), (HistoryOutcome::Acknowledged, 2));
    assert_eq!(retried.last_error.as_deref(), Some("not yet"));
    let dead = entry(&kept, "dead");
    assert_eq!((dead.outcome.clone(), dead.attempts), (HistoryOutcome::DeadLettered, 1));
    assert_eq!(dead.last_error.as_deref(), Some("boom"));
    assert_eq!(q.depth("").await.unwrap(), (0, 1), "the dead letter is in the dead-letter table too");
    assert_eq!(entry(&kept, "discarded").outcome, HistoryOutcome::Dropped);
    for i in 0..6 {
        let run = entry(&kept, &format!("run {i}"));
        assert_eq!(
            (run.outcome.clone(), run.attempts, run.group.as_str()),
            (HistoryOutcome::Acknowledged, 1, "runs")
        );
    }
    for i in 0..3 {
        assert_eq!(entry(&kept, &format!("drop {i}")).outcome, HistoryOutcome::Dropped);
    }
    assert!(kept.windows(2).all(|w| w[0].handled_at >= w[1].handled_at), "newest first");
    let drops = q.history(&HistoryPage { group: Some("drops".into()), limit: 2, offset: 1 }).await.unwrap();
    assert_eq!(drops.len(), 2);
    assert!(drops.iter().all(|e| e.group == "drops"));
    assert_eq!(drops[0], kept.iter().filter(|e| e.group == "drops").nth(1).unwrap().clone());
    for group in ["", "runs", "drops"] {
        assert_eq!(q.depth(group).await.unwrap().0, 0, "nothing left in {group:?}");
    }
    env.broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(leased_settlements_are_kept);

/// A transactional handler's commit writes its messages into the history with it (its
/// attempt counted), a batch's too; a failure that dead-letters them keeps them as dead
/// with the error; a rolled-back transaction keeps nothing of the attempt.
async fn transactional_handlers_keep_too<DB: Db>(env: Env<DB>) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = new_queue(&env.broker, &cleanup);
    q.deploy_keeping(WEEK).await.unwrap();
    q.publish_batch(["tx ok", "tx fail"].map(Message::text)).await.unwrap();
    q.publish_batch((0..4).map(|i| Message::text(format!("batch {i}")).group("b"))).await.unwrap();

    let handled = Arc::new(AtomicUsize::new(0));
    let (done, stop) = tokio::sync::oneshot::channel::<()>();
    let done = Arc::new(std::sync::Mutex::new(Some(done)));
    let count = handled.clone();
    let single = q.subscribe().until(async { drop(stop.await) }).run_tx(move |_conn, m| {
        let (count, done) = (count.clone(), done.clone());
        Box::pin(async move {
            if count.fetch_add(1, Ordering::SeqCst) + 1 == 2 {
                done.lock().unwrap().take().map(|d| d.send(()));
            }
            match m.payload() {
                b"tx fail" => Err("handler failed".to_owned()),
                _ => Ok(()),
            }
        })
    });
    single.await.unwrap();
    let (done, stop) = tokio::sync::oneshot::channel::<()>();
    let done = Arc::new(std::sync::Mutex::new(Some(done)));
    let batch =
        q.subscribe().group("b").batch(4).until(async { drop(stop.await) }).run_batch_tx(move |_conn, ms| {
            let done = done.clone();
            Box::pin(async move {
                assert_eq!(ms.len(), 4);
                done.lock().unwrap().take().map(|d| d.send(()));
                Ok::<_, Error>(())
            })
        });
    batch.await.unwrap();

    eventually("6 kept", || async { history(&q).await.len() == 6 }).await;
    let kept = history(&q).await;
    let ok = entry(&kept, "tx ok");
    assert_eq!(
        (ok.outcome.clone(), ok.attempts, ok.last_error.clone()),
        (HistoryOutcome::Acknowledged, 1, None)
    );
    let failed = entry(&kept, "tx fail");
    assert_eq!((failed.outcome.clone(), failed.attempts), (HistoryOutcome::DeadLettered, 1));
    assert_eq!(failed.last_error.as_deref(), Some("handler failed"));
    for i in 0..4 {
        let e = entry(&kept, &format!("batch {i}"));
        assert_eq!((e.outcome.clone(), e.group.as_str()), (HistoryOutcome::Acknowledged, "b"));
    }
    assert_eq!(q.depth("").await.unwrap(), (0, 1));
    env.broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(transactional_handlers_keep_too);

/// `n` deliveries of one claim of `group`.
async fn claim<DB: Db>(q: &Queue<DB>, group: &str, n: usize) -> Vec<rowbus::Delivery<DB>> {
    let mut sub = q.subscribe().group(group).batch(n).stream().await.unwrap();
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        got.push(next(&mut sub).await);
    }
    got
}

/// Moving messages into the history waits for no message it does not move: while a
/// transactional handler holds the messages of its claim, a claim's messages acknowledged
/// together, messages of several claims acknowledged together, and a cancel each move
/// theirs at once (on MariaDB each once read the whole of a small table, and waited for
/// the held rows until the server's lock wait timeout, 50 s by default). Not on SQLite,
/// where the transactional handler holds the one write lock.
async fn kept_moves_wait_for_no_held_message<DB: Db>(env: Env<DB>) {
    if DB::BACKEND == rowbus::Backend::Sqlite {
        return;
    }
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = new_queue(&env.broker, &cleanup);
    q.deploy_keeping(WEEK).await.unwrap();
    q.publish_batch((0..5).map(|i| Message::text(format!("held {i}")).group("held"))).await.unwrap();
    q.publish_batch((0..35).map(|i| Message::text(format!("m{i}")))).await.unwrap();

    let (started, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Semaphore::new(0)));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let (started, release) = (started.clone(), release.clone());
        tokio::spawn(q.subscribe().group("held").batch(5).until(async { drop(stopped.await) }).run_batch_tx(
            move |_conn, _messages| {
                let (started, release) = (started.clone(), release.clone());
                Box::pin(async move {
                    started.notify_one();
                    drop(release.acquire().await);
                    Ok::<_, Error>(())
                })
            },
        ))
    };
    started.notified().await;

    let at_once = Duration::from_secs(10);
    let why = "waited for messages a transaction holds";
    let one_claim = claim(&q, "", 10).await;
    let acked = tokio::time::timeout(at_once, q.ack_all(one_claim)).await.expect(why).unwrap();
    assert_eq!(acked, 10, "one claim's messages");
    // More claims than acknowledgements by claim go to: each message under its own lease.
    let mut several = Vec::new();
    for _ in 0..10 {
        several.extend(claim(&q, "", 1).await);
    }
    let acked = tokio::time::timeout(at_once, q.ack_all(several)).await.expect(why).unwrap();
    assert_eq!(acked, 10, "ten claims' messages");
    let ids: Vec<i64> = claim(&q, "", 10).await.iter().map(|d| d.id()).collect();
    let cancelled = tokio::time::timeout(at_once, q.cancel(&ids)).await.expect(why).unwrap();
    assert_eq!(cancelled.ids.len(), 10, "{cancelled:?}");

    release.add_permits(1);
    eventually("35 kept", || async { history(&q).await.len() == 35 }).await;
    let _ = stop.send(());
    holder.await.unwrap().unwrap();
    let kept = history(&q).await;
    let count = |outcome: HistoryOutcome| kept.iter().filter(|e| e.outcome == outcome).count();
    assert_eq!(
        (count(HistoryOutcome::Acknowledged), count(HistoryOutcome::Cancelled)),
        (25, 10),
        "{kept:#?}"
    );
    assert_eq!(q.depth("").await.unwrap(), (5, 0));
    env.broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(kept_moves_wait_for_no_held_message);

/// A queue deployed without a keep duration keeps nothing, and `--keep 0` turns keeping
/// off for what is handled after it.
async fn without_keep_nothing_is_kept<DB: Db>(env: Env<DB>) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = new_queue(&env.broker, &cleanup);
    q.deploy().await.unwrap();
    assert_eq!(q.keep().await.unwrap(), None);
    q.publish_batch(["a", "b"].map(Message::text)).await.unwrap();
    let mut sub = q.subscribe().batch(2).stream().await.unwrap();
    next(&mut sub).await.ack().await.unwrap();
    next(&mut sub).await.dead_letter("gone").await.unwrap();
    drop(sub);
    assert!(history(&q).await.is_empty());

    q.deploy_keeping(WEEK).await.unwrap();
    q.deploy().await.unwrap();
    assert_eq!(q.keep().await.unwrap(), Some(WEEK), "a deploy without a keep duration leaves it");
    q.deploy_keeping(Duration::ZERO).await.unwrap();
    assert_eq!(q.keep().await.unwrap(), None);
    q.publish(Message::text("c")).await.unwrap();
    let mut sub = q.subscribe().stream().await.unwrap();
    next(&mut sub).await.ack().await.unwrap();
    drop(sub);
    assert!(history(&q).await.is_empty());
    assert_eq!(q.depth("").await.unwrap(), (0, 1));
    env.broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(without_keep_nothing_is_kept);

/// Moves every history row of `q` but those of payload `but` back in time by two hours,
/// with the test's own SQL.
async fn backdate<DB: Db>(db: &DbPool, q: &Queue<DB>, but: &[u8]) -> u64 {
    let h = format!("{}_hist", q.table());
    let sql = match db {
        DbPool::Postgres(_) => {
            format!("UPDATE \"{h}\" SET handled_at = handled_at - interval '2 hours' WHERE payload <> $1")
        }
        DbPool::MySql(_) => {
            format!("UPDATE `{h}` SET handled_at = handled_at - INTERVAL 2 HOUR WHERE payload <> ?")
        }
        DbPool::Sqlite(_) => {
            format!("UPDATE `{h}` SET handled_at = handled_at - 7200000000 WHERE payload <> ?")
        }
    };
    let sql = sqlx::AssertSqlSafe(sql);
    match db {
        DbPool::Postgres(pool) => sqlx::query(sql).bind(but).execute(pool).await.unwrap().rows_affected(),
        DbPool::MySql(pool) => sqlx::query(sql).bind(but).execute(pool).await.unwrap().rows_affected(),
        DbPool::Sqlite(pool) => sqlx::query(sql).bind(but).execute(pool).await.unwrap().rows_affected(),
    }
}

/// Acknowledges `n` messages of `q` one by one.
async fn ack_some<DB: Db>(q: &Queue<DB>, prefix: &str, n: usize) {
    q.publish_batch((0..n).map(|i| Message::text(format!("{prefix} {i}")))).await.unwrap();
    let mut sub = q.subscribe().batch(n).stream().await.unwrap();
    for _ in 0..n {
        next(&mut sub).await.ack().await.unwrap();
    }
}

/// The cleanup deletes only what is older than the keep duration, oldest first, a batch a
/// statement until one is not full; with keeping turned off it deletes what was kept, and
/// a consuming broker runs it when its subscription starts.
async fn cleanup_deletes_expired_rows_in_batches<DB: Db>(env: Env<DB>) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = new_queue(&env.broker, &cleanup);
    q.deploy_keeping(Duration::from_secs(3600)).await.unwrap();
    ack_some(&q, "old", 5).await;
    ack_some(&q, "new", 1).await;
    // A subscription's start sets off a cleanup pass, which would race the prune below for
    // the expired rows: it ends before any row is backdated.
    eventually("the subscriptions' cleanup pass ends", || async { env.broker.stats().history_cleanups > 0 })
        .await;
    assert_eq!(backdate(&env.db, &q, b"new 0").await, 5);
    let pruned = q.prune_history(2).await.unwrap();
    assert_eq!((pruned.rows, pruned.batches), (5, 3));
    let kept = history(&q).await;
    assert_eq!(kept.iter().map(|e| e.payload.clone()).collect::<Vec<_>>(), vec![b"new 0".to_vec()]);
    let pruned = q.prune_history(2).await.unwrap();
    assert_eq!((pruned.rows, pruned.batches), (0, 1));

    // Turned off by this broker's deploy; another broker (another process) that starts
    // consuming reads the setting, and its first cleanup pass empties the history.
    q.deploy_keeping(Duration::ZERO).await.unwrap();
    assert_eq!(history(&q).await.len(), 1, "a deploy deletes nothing itself");
    let other = Broker::new(env.broker.pool().clone(), options()).await.unwrap();
    let _sub = other.queue(q.table().channel()).unwrap().subscribe().stream().await.unwrap();
    eventually("the consuming broker's cleanup empties the history", || async {
        history(&q).await.is_empty()
    })
    .await;
    other.shutdown(Duration::from_secs(1)).await;
    env.broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(cleanup_deletes_expired_rows_in_batches);

/// A queue made before kept history (no `_hist` or `_keep` table): its consumers go on
/// and keep nothing, reading its history says to deploy again, which adds the tables and
/// leaves the messages; then it keeps.
async fn deploy_again_adds_history<DB: Db>(env: Env<DB>) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = new_queue(&env.broker, &cleanup);
    q.deploy().await.unwrap();
    for suffix in ["_hist", "_keep"] {
        let sql = sqlx::AssertSqlSafe(format!("DROP TABLE {}{suffix}", q.table()));
        match &env.db {
            DbPool::Postgres(pool) => drop(sqlx::query(sql).execute(pool).await.unwrap()),
            DbPool::MySql(pool) => drop(sqlx::query(sql).execute(pool).await.unwrap()),
            DbPool::Sqlite(pool) => drop(sqlx::query(sql).execute(pool).await.unwrap()),
        }
    }
    q.publish_batch(["before", "waiting"].map(Message::text)).await.unwrap();
    let mut sub = q.subscribe().stream().await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!(d.text().unwrap(), "before");
    d.ack().await.unwrap();
    drop(sub);
    match q.history(&HistoryPage::default()).await {
        Err(e @ Error::MissingHistoryTable { .. }) => {
            assert!(e.to_string().contains("rowbus deploy --queue"), "{e}")
        }
        other => panic!("expected MissingHistoryTable, got {other:?}"),
    }
    assert!(matches!(q.keep().await, Err(Error::MissingHistoryTable { .. })));
    q.deploy_keeping(WEEK).await.unwrap();
    assert_eq!(q.depth("").await.unwrap(), (1, 0), "the message stays");
    let mut sub = q.subscribe().stream().await.unwrap();
    next(&mut sub).await.ack().await.unwrap();
    let kept = history(&q).await;
    assert_eq!(kept.len(), 1, "{kept:#?}");
    assert_eq!(entry(&kept, "waiting").outcome, HistoryOutcome::Acknowledged);
    env.broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(deploy_again_adds_history);
