//! A claim or a `Broker::begin` dropped part way (a `select!` that took another branch,
//! a timeout, a stream or a relay dropped) must leave the pool's connections as they were
//! and give back what it claimed. sqlx counts a transaction only once its `BEGIN` has
//! answered: a begin dropped while the statement was on its way put its connection back
//! into the pool inside a transaction nobody would end (on PostgreSQL, one failed statement
//! on it then failed every later one, 25P02, and what they wrote was never committed). On
//! MariaDB, dropped claims left connections the pool never got back. A claim dropped after
//! its commit held its messages for the whole lease. A subscription dropped stopped its
//! queue's scheduler wherever it was, on MariaDB in the middle of a statement: the pool
//! waited for that connection for good.

use crate::common;

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use common::{Cleanup, MARIADB, PG, TempSqlite, unique};
use futures::StreamExt;
use futures::future::join_all;
use rowbus::{Broker, BrokerOptions, Db, Message};
use sqlx::pool::PoolOptions;
use sqlx::{Executor, Row};

/// How many connections the broker's pool holds: few, so that every dropped future's
/// connection is met again by the next ones.
const CONNECTIONS: u32 = 2;

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

/// Polls `future` up to `polls` times, `apart` apart; drops it when it has not finished by
/// then. (The pause blocks the thread: a timer would not wait less than a millisecond.)
async fn poll_then_drop<F: Future>(future: F, polls: u64, apart: Duration) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    for _ in 0..polls {
        if let Poll::Ready(out) = futures::poll!(future.as_mut()) {
            return Some(out);
        }
        std::thread::sleep(apart);
    }
    None
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
    let rowbus::DbPool::Sqlite(pool) =
        rowbus::DbPool::connect_creating(&file.url, CONNECTIONS).await.unwrap()
    else {
        unreachable!()
    };
    nothing_left_open(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

/// A port that reaches the server at `127.0.0.1:port`, its answers passed on a few bytes
/// at a time: a statement's answer then arrives over many reads, and a future dropped
/// part way is met in the middle of one far more often than on the bare server. The relay
/// ends with the test's runtime.
async fn trickling(port: u16) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = relay.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = relay.accept().await {
            let server = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            // Each few bytes sent as they are written.
            inbound.set_nodelay(true).unwrap();
            server.set_nodelay(true).unwrap();
            let (mut from_client, mut to_client) = inbound.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut from_client, &mut to_server).await });
            tokio::spawn(async move {
                let mut buf = [0u8; 7];
                loop {
                    match from_server.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if to_client.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                            tokio::task::yield_now().await;
                        }
                    }
                }
            });
        }
    });
    local
}

/// How long a connection of the pool is waited for: a connection lost to the pool is
/// never given back, so the wait is all a test of it takes to fail.
const ACQUIRE: Duration = Duration::from_secs(10);

/// `url` (host 127.0.0.1) with its port replaced by `port`.
fn on_port(url: &str, port: u16) -> String {
    let (head, rest) = url.rsplit_once(':').unwrap();
    let path = &rest[rest.find('/').unwrap()..];
    format!("{head}:{port}{path}")
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
    // Each one held while the next is taken: all of them, or a connection lost.
    let conns = join_all((0..CONNECTIONS).map(|_| broker.pool().acquire())).await;
    let lost = conns.iter().filter(|conn| conn.is_err()).count();
    assert_eq!(lost, 0, "{lost} of the pool's {CONNECTIONS} connections never came back");
    drop(conns);
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_stop_between_statements_postgres() {
    let url = on_port(PG, trickling(5432).await);
    let pool = PoolOptions::<sqlx::Postgres>::new()
        .max_connections(CONNECTIONS)
        .acquire_timeout(ACQUIRE)
        .connect(&url)
        .await
        .unwrap();
    schedulers_stop_between_statements(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_stop_between_statements_mariadb() {
    let url = on_port(MARIADB, trickling(3306).await);
    let pool = PoolOptions::<sqlx::MySql>::new()
        .max_connections(CONNECTIONS)
        .acquire_timeout(ACQUIRE)
        .connect(&url)
        .await
        .unwrap();
    schedulers_stop_between_statements(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_stop_between_statements_sqlite() {
    let file = TempSqlite::new();
    let rowbus::DbPool::Sqlite(pool) =
        rowbus::DbPool::connect_creating(&file.url, CONNECTIONS).await.unwrap()
    else {
        unreachable!()
    };
    schedulers_stop_between_statements(Broker::new(pool, BrokerOptions::default()).await.unwrap()).await;
}
