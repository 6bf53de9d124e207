//! Transactional batches from several subscriptions at once, some of whose handlers fail:
//! each batch's writes commit with its messages' deletion, or neither does. On SQLite the
//! batches of a broker share commits (one writer: a batch that finds others waiting leaves
//! its transaction to them); a failed handler there must still undo only its own writes.
//! On the real PostgreSQL and MariaDB and a temporary SQLite file.

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use rowbus::dead::DeadLetterPage;
use rowbus::{Backend, BatchOutcome, BrokerOptions, Message, Outcome};
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

/// A batch whose handler answers [`BatchOutcome::Rollback`] the first time it sees its
/// messages, after writing them, and [`BatchOutcome::DeadLetter`] for every third message
/// the next time: the rollback leaves no trace (its writes undone, the messages back with
/// their attempt not counted, nothing counted), and the second time the named messages are
/// dead-lettered with their own reasons while the others are acknowledged with the
/// handler's writes. Several batches in flight, as the relay runs them.
async fn a_batch_dead_letters_some_and_rolls_back_without_a_trace<DB: Brokers>(place: Place)
where
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    const N: i64 = 120;
    let options = BrokerOptions { poll_interval: Duration::from_millis(50), ..BrokerOptions::default() };
    let broker = DB::broker(&place, options).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("txout"));
    let queue = broker.queue(&name).unwrap();
    queue.deploy().await.unwrap();
    let effects = cleanup.table(&format!("{name}_fx"));
    place.exec(format!("CREATE TABLE {effects} (id BIGINT NOT NULL PRIMARY KEY)")).await;
    queue.publish_batch((0..N).map(|i| Message::text(format!("m{i}")))).await.unwrap();

    let seen = Arc::new(Mutex::new(HashSet::new()));
    let (rollbacks, second_attempts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let runner = {
        let (seen, rollbacks, second_attempts, effects) =
            (seen.clone(), rollbacks.clone(), second_attempts.clone(), effects.clone());
        tokio::spawn(queue.subscribe().batch(BATCH).workers(3).run_batch_tx(move |conn, messages| {
            let first = {
                let mut seen = seen.lock().unwrap();
                messages.iter().map(|m| seen.insert(m.id())).fold(false, |any, new| any | new)
            };
            second_attempts
                .fetch_add(messages.iter().filter(|m| m.attempt() != 1).count() as u64, Ordering::Relaxed);
            let kept: Vec<i64> = messages.iter().map(|m| m.id()).filter(|id| first || id % 3 != 0).collect();
            let sql = insert_ids(DB::BACKEND, &effects, kept.len());
            let rollbacks = rollbacks.clone();
            Box::pin(async move {
                if !kept.is_empty() {
                    let mut insert = sqlx::query(sqlx::AssertSqlSafe(sql));
                    for id in &kept {
                        insert = insert.bind(*id);
                    }
                    insert.execute(&mut *conn).await.map_err(|e| e.to_string())?;
                }
                if first {
                    rollbacks.fetch_add(1, Ordering::Relaxed);
                    return Ok(BatchOutcome::Rollback);
                }
                let dead: Vec<(i64, String)> = messages
                    .iter()
                    .filter(|m| m.id() % 3 == 0)
                    .map(|m| (m.id(), format!("refused {}", m.id())))
                    .collect();
                Ok::<_, String>(BatchOutcome::DeadLetter(dead))
            })
        }))
    };
    let started = Instant::now();
    while queue.depth("").await.unwrap().0 != 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "not drained: {:?}", broker.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();

    assert!(rollbacks.load(Ordering::Relaxed) > 0);
    assert_eq!(second_attempts.load(Ordering::Relaxed), 0, "a rollback counted an attempt");
    let ids = seen.lock().unwrap().clone();
    let dead_ids: Vec<i64> = ids.iter().copied().filter(|id| id % 3 == 0).collect();
    let stats = broker.stats();
    let acked = N as u64 - dead_ids.len() as u64;
    assert_eq!(
        (stats.acked, stats.dead_lettered, stats.retried),
        (acked, dead_ids.len() as u64, 0),
        "{stats:?}"
    );
    let written = place.ints(format!("SELECT COUNT(*) FROM {effects}")).await;
    assert_eq!(written, [acked as i64], "only the committed batches' writes stayed, once each");
    let dead =
        queue.dead_letters(&DeadLetterPage { limit: 1_000, ..DeadLetterPage::default() }).await.unwrap();
    let mut dead_found: Vec<i64> = dead.iter().map(|d| d.id).collect();
    dead_found.sort_unstable();
    let mut dead_ids = dead_ids;
    dead_ids.sort_unstable();
    assert_eq!(dead_found, dead_ids);
    for letter in &dead {
        assert_eq!(letter.last_error.as_deref(), Some(format!("refused {}", letter.id).as_str()));
        assert_eq!(letter.attempts, 1, "the rollback's attempt was not counted, the dead-lettering's was");
    }
    queue.undeploy().await.unwrap();
}
on_each_database!(a_batch_dead_letters_some_and_rolls_back_without_a_trace);
