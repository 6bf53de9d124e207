//! Regression (found by `rowbus chaos`, scenario broker-tx): after one failed claim a
//! transactional runner (`run_tx`) stayed in the failed pace for good: every later round
//! waited the claim-error wait (1 s), deaf to wake-ups, and claimed one message per worker
//! per second. Under killed sessions the chaos run's consumers fell from hundreds of
//! messages per second to a few, and 89,297 of 108,012 messages were still queued after
//! the drain. One failed claim must cost one claim-error wait, no more.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Cleanup, MARIADB, PG, TempSqlite, unique};
use rowbus::{Broker, BrokerOptions, Db, DbPool, Message};
use sqlx::{AssertSqlSafe, Executor};

async fn exec<DB: Db>(broker: &Broker<DB>, sql: String)
where
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
{
    broker.pool().execute(AssertSqlSafe(sql)).await.unwrap();
}

async fn recovers_after_a_failed_claim<DB: Db>(broker: Broker<DB>, rename: fn(&str, &str) -> String)
where
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
{
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("txrec"));
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    let handled = Arc::new(AtomicU64::new(0));
    let runner = {
        let handled = handled.clone();
        // A short poll, so that a claim meets the renamed table soon (a publish cannot wake
        // the runner while the table is away); the pace under test waits 1 s a round.
        tokio::spawn(q.subscribe().workers(2).poll_interval(Duration::from_millis(500)).run_tx(
            move |_conn, _m| {
                let handled = handled.clone();
                Box::pin(async move {
                    handled.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, rowbus::Error>(())
                })
            },
        ))
    };
    // One claim fails: the table is away for a moment.
    let away = cleanup.table(&format!("{name}_away"));
    exec(&broker, rename(&name, &away)).await;
    let started = Instant::now();
    while broker.stats().claim_errors == 0 {
        assert!(started.elapsed() < Duration::from_secs(20), "no claim failed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    exec(&broker, rename(&away, &name)).await;
    cleanup.forget(&away);

    // 40 messages, two workers: at once when the runner is back to its pace; 20 s when it
    // still claims one message per worker per second.
    let total = 40;
    q.publish_batch((0..total).map(|i| Message::text(i.to_string()))).await.unwrap();
    let started = Instant::now();
    while handled.load(Ordering::Relaxed) < total {
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{} of {total} handled after {:?}: the runner stayed in the failed pace",
            handled.load(Ordering::Relaxed),
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}

fn rename_sql(from: &str, to: &str) -> String {
    format!("ALTER TABLE {from} RENAME TO {to}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_tx_recovers_after_a_failed_claim_postgres() {
    let DbPool::Postgres(pool) = DbPool::connect(PG).await.unwrap() else { unreachable!() };
    recovers_after_a_failed_claim(Broker::new(pool, BrokerOptions::default()).await.unwrap(), rename_sql)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_tx_recovers_after_a_failed_claim_mariadb() {
    let DbPool::MySql(pool) = DbPool::connect(MARIADB).await.unwrap() else { unreachable!() };
    let rename = |from: &str, to: &str| format!("RENAME TABLE `{from}` TO `{to}`");
    recovers_after_a_failed_claim(Broker::new(pool, BrokerOptions::default()).await.unwrap(), rename).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_tx_recovers_after_a_failed_claim_sqlite() {
    let file = TempSqlite::new();
    let DbPool::Sqlite(pool) = DbPool::connect_creating(&file.url, 8).await.unwrap() else { unreachable!() };
    recovers_after_a_failed_claim(Broker::new(pool, BrokerOptions::default()).await.unwrap(), rename_sql)
        .await;
}
