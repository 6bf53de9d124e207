//! A claim or a `Broker::begin` dropped part way (a `select!` that took another branch,
//! a timeout, a stream or a relay dropped) must leave the pool's connections as they were
//! and give back what it claimed. sqlx counts a transaction only once its `BEGIN` has
//! answered: a begin dropped while the statement was on its way put its connection back
//! into the pool inside a transaction nobody would end (on PostgreSQL, one failed statement
//! on it then failed every later one, 25P02, and what they wrote was never committed). On
//! MariaDB, dropped claims left connections the pool never got back. A claim dropped after
//! its commit held its messages for the whole lease. A subscription dropped stopped its
//! queue's scheduler wherever it was, on MariaDB in the middle of a statement: the pool
//! waited for that connection for good. So did settlements dropped part way (an
//! acknowledgement under a timeout, say).

use crate::common;

use std::time::Duration;

use common::{Cleanup, MARIADB, PG, TempSqlite, trickle, unique};
use futures::StreamExt;
use futures::future::join_all;
use rowbus::dead::DeadLetters;
use rowbus::limit::{Limit, LimitScope};
use rowbus::{Broker, BrokerOptions, Db, Message};
use sqlx::pool::PoolOptions;
use sqlx::{Executor, Row};
use tokio::time::timeout;
use trickle::poll_then_drop;

/// How many connections the broker's pool holds: few, so that every dropped future's
/// connection is met again by the next ones.
const CONNECTIONS: u32 = 2;

/// A pool of [`CONNECTIONS`] on the SQLite `file`.
async fn sqlite_pool(file: &TempSqlite) -> sqlx::SqlitePool {
    let rowbus::DbPool::Sqlite(pool) =
        rowbus::DbPool::connect_creating(&file.url, CONNECTIONS).await.unwrap()
    else {
        unreachable!()
    };
    pool
}

/// Whether a connection is inside a transaction that an earlier statement began.
async fn in_transaction<DB: Db>(conn: &mut DB::Connection) -> bool
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let sql = match DB::BACKEND {
        // `now()` is when the transaction began: the statement's own start only when the
        // statement is the first of its transaction.
        rowbus::Backend::Postgres => {
            "SELECT CASE WHEN now() <> statement_timestamp() THEN 1 ELSE 0 END::INT8"
        }
        rowbus::Backend::MySql => "SELECT CAST(@@in_transaction AS SIGNED)",
        // No variable says it: a `BEGIN` inside a transaction is refused.
        rowbus::Backend::Sqlite => {
            return match conn.execute("BEGIN").await {
                Ok(_) => {
                    conn.execute("ROLLBACK").await.unwrap();
                    false
                }
                Err(_) => true,
            };
        }
    };
    let row = conn.fetch_one(sql).await.unwrap();
    row.try_get::<i64, _>(0usize).unwrap() != 0
}

/// Drops claims and begins part way (at several points of their statements over the
/// rounds), then looks at every connection of the pool.
async fn nothing_left_open<DB: Db>(broker: Broker<DB>)
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("dropped"));
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    q.publish_batch((0..200).map(|i| Message::text(i.to_string()))).await.unwrap();
    let mut dropped = 0;
    let rounds = async {
        for round in 0..400u64 {
            // Polled 1 to 6 times, 30 to 230 µs apart (time for the server to answer a
            // statement), then dropped: each poll gets one statement further.
            let (polls, apart) = (1 + round % 6, Duration::from_micros(30 + round * 13 % 200));
            if round % 2 == 0 {
                // A stream's claim runs while it is polled; dropping the stream drops it.
                let mut sub = q.subscribe().batch(3).stream().await.unwrap();
                match poll_then_drop(sub.next(), polls, apart).await {
                    Some(delivery) => delivery.unwrap().unwrap().release().await.unwrap(),
                    None => dropped += 1,
                }
            } else {
                match poll_then_drop(broker.begin(), polls, apart).await {
                    Some(tx) => tx.unwrap().rollback().await.unwrap(),
                    None => dropped += 1,
                }
            }
        }
    };
    // Before, the rounds on MariaDB stopped for good after some dropped claims: the
    // server had both connections idle, the pool had neither to give.
    tokio::time::timeout(Duration::from_secs(120), rounds).await.expect("400 rounds took over 2 minutes");
    assert!(dropped > 50, "only {dropped} of 400 futures were dropped part way: the test tested little");
    // Every connection the pool holds, each checked while the others are held too.
    let mut conns = join_all((0..CONNECTIONS).map(|_| broker.pool().acquire())).await;
    let mut open = 0;
    for conn in &mut conns {
        if in_transaction::<DB>(conn.as_mut().unwrap()).await {
            open += 1;
        }
    }
    drop(conns);
    assert_eq!(open, 0, "{open} of the pool's {CONNECTIONS} connections were left inside a transaction");
    // And the queue still works from the same pool: everything claimed, handled, gone.
    // A dropped claim gave back what it took (its lease, 30 s, would fail the wait below),
    // as a stream dropped with claimed messages does.
    let mut sub = q.subscribe().batch(50).stream().await.unwrap();
    for _ in 0..200 {
        let delivery = tokio::time::timeout(Duration::from_secs(20), sub.next())
            .await
            .expect("a claim waited 20 s: a connection left in a transaction holds the rows")
            .unwrap()
            .unwrap();
        delivery.ack().await.unwrap();
    }
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_left_open_postgres() {
    let pool = PoolOptions::<sqlx::Postgres>::new().max_connections(CONNECTIONS).connect(PG).await.unwrap();
    nothing_left_open(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_left_open_mariadb() {
    let pool = PoolOptions::<sqlx::MySql>::new().max_connections(CONNECTIONS).connect(MARIADB).await.unwrap();
    nothing_left_open(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_left_open_sqlite() {
    let file = TempSqlite::new();
    let pool = sqlite_pool(&file).await;
    nothing_left_open(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

/// Subscribes and drops the subscription again and again, each at another moment of its
/// queue's scheduler (which every subscription with schedules on starts in its broker and
/// the last one stops), then takes every connection of the pool. A scheduler stopped in the
/// middle of a statement left its connection waiting, on MariaDB, for the rest of an answer
/// already read: the pool counted it in use for good.
async fn schedulers_stop_between_statements<DB: Db>(broker: Broker<DB>) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("sched_drop"));
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    let rounds = async {
        for round in 0..300u64 {
            let sub = q.subscribe().stream().await.unwrap_or_else(|e| panic!("round {round}: {e}"));
            // The scheduler's pass runs on the other worker meanwhile: a statement or two.
            std::thread::sleep(Duration::from_micros(round * 37 % 1500));
            drop(sub);
        }
    };
    // About a second when every connection comes back.
    tokio::time::timeout(Duration::from_secs(60), rounds)
        .await
        .expect("300 rounds took over a minute: the pool was short of connections");
    trickle::every_connection_back(broker.pool(), CONNECTIONS).await;
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_stop_between_statements_postgres() {
    let pool = trickle::postgres(PG, CONNECTIONS).await;
    schedulers_stop_between_statements(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_stop_between_statements_mariadb() {
    let pool = trickle::mariadb(MARIADB, CONNECTIONS).await;
    schedulers_stop_between_statements(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_stop_between_statements_sqlite() {
    let file = TempSqlite::new();
    let pool = sqlite_pool(&file).await;
    schedulers_stop_between_statements(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

/// Settles deliveries, publishes, cancels and operates the queue, and drops each call part
/// way (at several points of its statements over the rounds): an acknowledgement, a retry,
/// a dead letter, a release, a batch's acknowledgement, a cancel, a publish of its own (one
/// with a deduplication id), a pause, a limit set and one cleared, a dead letter requeued
/// and one purged, a publish in a `BrokerTx` and its commit. After each, the call that
/// undoes it (a resume, a limit cleared) runs whole within 10 s: no lock was left held; a
/// dead letter requeued part way is still one, or back in the queue, never lost. Then takes
/// every connection of the pool, none inside a transaction.
async fn calls_dropped<DB: Db>(broker: Broker<DB>)
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("call_drop"));
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    // Each round takes two and leaves one leased in about half the kinds.
    q.publish_batch((0..2 * ROUNDS).map(|i| Message::text(i.to_string()))).await.unwrap();
    let mut dropped = 0;
    let within = Duration::from_secs(10);
    let limited = LimitScope::Group("limited".into());
    let rounds = async {
        for round in 0..ROUNDS {
            let mut sub = q.subscribe().batch(2).stream().await.unwrap();
            let (a, b) = (sub.next().await.unwrap().unwrap(), sub.next().await.unwrap().unwrap());
            drop(sub);
            let (polls, apart) = (1 + round % 6, Duration::from_micros(30 + round * 13 % 200));
            let finished = match round % KINDS {
                0 => poll_then_drop(a.ack(), polls, apart).await.map(|r| r.unwrap()),
                1 => poll_then_drop(a.retry(Duration::ZERO, "again"), polls, apart).await.map(|r| r.unwrap()),
                2 => poll_then_drop(a.dead_letter("dead"), polls, apart).await.map(|r| r.unwrap()),
                3 => poll_then_drop(a.release(), polls, apart).await.map(|r| r.unwrap()),
                4 => {
                    poll_then_drop(q.ack_all(vec![a]), polls, apart).await.map(|r| assert_eq!(r.unwrap(), 1))
                }
                5 => poll_then_drop(q.cancel(&[a.id()]), polls, apart)
                    .await
                    .map(|r| assert_eq!(r.unwrap().ids.len(), 1)),
                7 => {
                    let done = poll_then_drop(q.pause(Some("paused")), polls, apart).await.map(|r| {
                        r.unwrap();
                    });
                    timeout(within, q.resume(Some("paused")))
                        .await
                        .unwrap_or_else(held("a resume", round))
                        .unwrap();
                    done
                }
                8 => {
                    let set = q.set_limit(&limited, Limit::MaxRunning(3));
                    let done = poll_then_drop(set, polls, apart).await.map(Result::unwrap);
                    timeout(within, q.clear_limit(&limited))
                        .await
                        .unwrap_or_else(held("a clear", round))
                        .unwrap();
                    done
                }
                9 => {
                    let set = q.set_limit(&limited, Limit::Rate("5/s".parse().unwrap()));
                    timeout(within, set).await.unwrap_or_else(held("a limit", round)).unwrap();
                    poll_then_drop(q.clear_limit(&limited), polls, apart).await.map(|r| {
                        r.unwrap();
                    })
                }
                10 | 11 => {
                    let id = a.id();
                    a.dead_letter("to requeue or purge").await.unwrap();
                    let ids = DeadLetters::Ids(vec![id]);
                    if round % KINDS == 10 {
                        let done = poll_then_drop(q.requeue_dead(&ids, Duration::ZERO), polls, apart).await;
                        // Still a dead letter, or back in the queue (where a cancel finds it).
                        let dead =
                            timeout(within, q.dead_letter(id)).await.unwrap_or_else(held("a read", round));
                        if dead.unwrap().is_none() {
                            let back = q.cancel(&[id]).await.unwrap();
                            assert_eq!(
                                back.ids,
                                [id],
                                "round {round}: the requeued dead letter {id} was lost"
                            );
                        }
                        done.map(|r| {
                            r.unwrap();
                        })
                    } else {
                        poll_then_drop(q.purge_dead(&ids), polls, apart).await.map(|r| {
                            r.unwrap();
                        })
                    }
                }
                12 => {
                    let mut tx =
                        timeout(within, broker.begin()).await.unwrap_or_else(held("a begin", round)).unwrap();
                    let publish = poll_then_drop(tx.publish(&q, Message::text("in tx")), polls, apart).await;
                    match publish {
                        Some(published) if round % 2 == 0 => {
                            assert!(published.unwrap().all_stored());
                            poll_then_drop(tx.commit(), polls, apart).await.map(Result::unwrap)
                        }
                        Some(published) => {
                            assert!(published.unwrap().all_stored());
                            drop(tx);
                            Some(())
                        }
                        None => {
                            drop(tx);
                            None
                        }
                    }
                }
                _ => {
                    // `a` stays leased: the rounds need far fewer than the queue holds.
                    let alone = Message::text("more").dedup_id(format!("d{round}"));
                    poll_then_drop(q.publish(alone), polls, apart)
                        .await
                        .map(|r| assert!(r.unwrap().all_stored()))
                }
            };
            if finished.is_none() {
                dropped += 1;
            }
            // The other one settled whole, on the connections the dropped one left.
            tokio::time::timeout(Duration::from_secs(10), b.release())
                .await
                .unwrap_or_else(|_| panic!("round {round}: a release waited 10 s for a connection"))
                .unwrap();
        }
    };
    timeout(Duration::from_secs(120), rounds)
        .await
        .expect("the rounds took over two minutes: the pool was short of connections");
    assert!(dropped > 40, "only {dropped} of {ROUNDS} calls were dropped part way: the test tested little");
    let mut conns = join_all((0..CONNECTIONS).map(|_| broker.pool().acquire())).await;
    let mut open = 0;
    for conn in &mut conns {
        let conn = conn.as_mut().expect("every connection came back");
        if in_transaction::<DB>(conn).await {
            open += 1;
        }
    }
    drop(conns);
    assert_eq!(open, 0, "{open} of the pool's {CONNECTIONS} connections were left inside a transaction");
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}

/// What a call that waited too long in round `round` of [`calls_dropped`] says.
fn held<T>(what: &'static str, round: u64) -> impl FnOnce(tokio::time::error::Elapsed) -> T {
    move |_| panic!("round {round}: {what} waited 10 s: a lock or a connection was left held")
}

/// The kinds of call [`calls_dropped`] drops, one a round in turn.
const KINDS: u64 = 13;

/// Rounds of [`calls_dropped`]: each kind of call dropped at 20 points.
const ROUNDS: u64 = KINDS * 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_dropped_postgres() {
    let pool = trickle::postgres(PG, CONNECTIONS).await;
    calls_dropped(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_dropped_mariadb() {
    let pool = trickle::mariadb(MARIADB, CONNECTIONS).await;
    calls_dropped(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_dropped_sqlite() {
    let file = TempSqlite::new();
    let pool = sqlite_pool(&file).await;
    calls_dropped(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

/// Starts a transactional batch runner and drops its future again and again, each at
/// another moment of its claims, handlers and commits, then takes every connection of the
/// pool and counts the messages: each one handled once or still in the queue. The
/// runner's attempts were aborted with it, on MariaDB in the middle of a statement: the
/// pool waited for that connection for good.
async fn transactional_runners_dropped<DB: Db>(broker: Broker<DB>) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("tx_drop"));
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    let handled = std::sync::Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
    let rounds = async {
        for round in 0..60u64 {
            q.publish_batch((0..24).map(|i| Message::text(i.to_string()))).await.unwrap();
            let handled = handled.clone();
            let runner = q.subscribe().workers(2).batch(4).run_batch_tx(move |_conn, messages| {
                let handled = handled.clone();
                Box::pin(async move {
                    handled.lock().unwrap().extend(messages.iter().map(|m| m.id()));
                    Ok::<_, String>(())
                })
            });
            let runner = tokio::spawn(runner);
            // The runner goes on on the other worker meanwhile: claims, handlers, commits.
            std::thread::sleep(Duration::from_micros(500 + round * 173 % 4000));
            runner.abort();
            let _ = runner.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), rounds)
        .await
        .expect("60 rounds took over two minutes: the pool was short of connections");
    trickle::every_connection_back(broker.pool(), CONNECTIONS).await;
    // The attempts the runners left run to their end: then every message was handled
    // (committed with its handler, once) or is still ready.
    let left = async {
        loop {
            let (ready, in_flight) = q.depth("").await.unwrap();
            let handled = handled.lock().unwrap().len() as i64;
            if in_flight == 0 && ready + handled >= 60 * 24 {
                return (ready, handled);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (ready, handled_n) =
        tokio::time::timeout(Duration::from_secs(20), left).await.expect("attempts still open");
    let mut ids = handled.lock().unwrap().clone();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as i64, handled_n, "a message was handled twice");
    assert_eq!(ready + handled_n, 60 * 24, "{ready} ready and {handled_n} handled");
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_runners_dropped_postgres() {
    let pool = trickle::postgres(PG, CONNECTIONS).await;
    transactional_runners_dropped(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_runners_dropped_mariadb() {
    let pool = trickle::mariadb(MARIADB, CONNECTIONS).await;
    transactional_runners_dropped(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}
