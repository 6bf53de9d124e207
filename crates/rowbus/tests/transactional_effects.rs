//! Transactional batches from several subscriptions at once, some of whose handlers fail:
//! each batch's writes commit with its messages' deletion, or neither does. On SQLite the
//! batches of a broker share commits (one writer: a batch that finds others waiting leaves
//! its transaction to them); a failed handler there must still undo only its own writes.
//! On the real PostgreSQL and MariaDB and a temporary SQLite file.

mod common;

use std::time::{Duration, Instant};

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use rowbus::{Backend, BrokerOptions, Message, Outcome};
use sqlx::{Encode, Executor, IntoArguments, Type};

use common::place_test as database_test;

const MESSAGES: i64 = 600;
const SUBSCRIPTIONS: usize = 6;
const BATCH: usize = 10;

/// `INSERT INTO t (id) VALUES` for `n` ids, in the database's placeholders.
fn insert_ids(backend: Backend, table: &str, n: usize) -> String {
    let values: Vec<String> = (1..=n)
        .map(|i| match backend {
            Backend::Postgres => format!("(${i})"),
            _ => "(?)".to_owned(),
        })
        .collect();
    format!("INSERT INTO {table} (id) VALUES {}", values.join(", "))
}

/// Six subscriptions drain 600 messages in transactional batches of ten; each handler
/// writes its messages' ids into a table keyed by id, and a batch holding a message whose
/// id is a multiple of seven fails on that message's first attempt, after writing. Had a failed batch's
/// writes stayed, its next attempt would break the key and never succeed: every message
/// ends up written exactly once, the queue empty, nothing dead-lettered.
async fn each_batch_commits_its_own_writes<DB: Brokers>(place: Place)
where
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let options = BrokerOptions { poll_interval: Duration::from_millis(50), ..BrokerOptions::default() };
    let broker = DB::broker(&place, options).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("txfx"));
    let queue = broker.queue(&name).unwrap();
    queue.deploy().await.unwrap();
    let effects = cleanup.table(&format!("{name}_fx"));
    place.exec(format!("CREATE TABLE {effects} (id BIGINT NOT NULL PRIMARY KEY)")).await;
    queue.publish_batch((0..MESSAGES).map(|i| Message::text(format!("m{i}")))).await.unwrap();

    let runners: Vec<_> = (0..SUBSCRIPTIONS)
        .map(|_| {
            let effects = effects.clone();
            tokio::spawn(queue.subscribe().batch(BATCH).run_batch_tx(move |conn, messages| {
                let sql = insert_ids(DB::BACKEND, &effects, messages.len());
                Box::pin(async move {
                    let mut insert = sqlx::query(sqlx::AssertSqlSafe(sql));
                    for m in &messages {
                        insert = insert.bind(m.id());
                    }
                    insert.execute(&mut *conn).await.map_err(|e| e.to_string())?;
                    if messages.iter().any(|m| m.id() % 7 == 0 && m.attempt() == 1) {
                        return Err("fails once, after its writes".to_owned());
                    }
                    Ok(Outcome::Ack)
                })
            }))
        })
        .collect();
    let started = Instant::now();
    while queue.depth("").await.unwrap() != (0, 0) || broker.stats().acked < MESSAGES as u64 {
        assert!(started.elapsed() < Duration::from_secs(60), "not drained: {:?}", broker.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.shutdown(Duration::from_secs(5)).await;
    for runner in runners {
        runner.await.unwrap().unwrap();
    }
    let stats = broker.stats();
    assert!(stats.retried > 0, "no batch failed: {stats:?}");
    assert_eq!((stats.acked, stats.dead_lettered), (MESSAGES as u64, 0), "{stats:?}");
    let written = place.ints(format!("SELECT COUNT(*) FROM {effects}")).await;
    assert_eq!(written, [MESSAGES], "each message's write committed once");
    queue.undeploy().await.unwrap();
}
on_each_database!(each_batch_commits_its_own_writes);
