//! Snoozing: a message put back for later without counting its attempt, by a handler's
//! outcome (workers, batches, transactional handlers) or by `Delivery::snooze`; the
//! queue's counts table that records it for every process to read; and the operator's
//! paged view of the messages in a queue table, which tells them apart. Against the real
//! PostgreSQL and MariaDB and a temporary SQLite file.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use futures::StreamExt;
use rowbus::stats::{QueueCounts, TableState};
use rowbus::{
    Broker, BrokerOptions, Db, Error, Message, MessagePage, MessageState, Outcome, Queue, RetryPolicy,
};
use sqlx::{Encode, Executor, IntoArguments, Type};

use common::place_test as database_test;

/// How long a message that should come may take to.
const ARRIVES: Duration = Duration::from_secs(20);

/// The snooze the tests ask for: long beside a poll interval, short for a test.
const SNOOZE: Duration = Duration::from_millis(1500);

/// Polling every 50 ms; one attempt only, so that any counted attempt would dead-letter.
fn one_attempt() -> BrokerOptions {
    BrokerOptions {
        poll_interval: Duration::from_millis(50),
        retry: RetryPolicy { max_attempts: 1, ..RetryPolicy::default() },
        ..BrokerOptions::default()
    }
}

/// A deployed queue of the test's own, dropped by `cleanup` should the test fail.
async fn queue<DB: Db>(broker: &Broker<DB>, cleanup: &Cleanup, prefix: &str) -> Queue<DB> {
    let queue = broker.queue(&cleanup.queue(&unique(prefix))).unwrap();
    queue.deploy().await.unwrap();
    queue
}

/// The queue's counts, which must be readable.
async fn counts<DB: Db>(q: &Queue<DB>) -> QueueCounts {
    q.counts().await.unwrap().expect("a deployed queue has a counts table")
}

/// Waits until `done` says the broker's figures are there, at most [`ARRIVES`].
async fn until<DB: Db>(broker: &Broker<DB>, what: &str, done: impl Fn(&rowbus::stats::Stats) -> bool) {
    let deadline = Instant::now() + ARRIVES;
    while !done(&broker.stats()) {
        assert!(Instant::now() < deadline, "{what}: not within {ARRIVES:?}: {:?}", broker.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `Delivery::snooze`: the message is delayed (not ready, not in flight) until the delay
/// has passed, then comes back as the same attempt, its last error as it was; the counts
/// table says so, twice snoozed twice counted. A delay over the longest duration is
/// refused, the message staying leased.
async fn a_snoozed_message_comes_back_after_its_delay<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, one_attempt()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "snooze").await;
    assert_eq!(counts(&q).await, QueueCounts::default());
    q.publish(Message::text("later")).await.unwrap();
    let mut sub = q.subscribe().poll_interval(Duration::from_millis(50)).stream().await.unwrap();
    for round in 1..=2 {
        let d = tokio::time::timeout(ARRIVES, sub.next()).await.expect("delivered").unwrap().unwrap();
        assert_eq!((d.text().unwrap(), d.attempt()), ("later", 1), "round {round}");
        let (id, snoozed) = (d.id(), Instant::now());
        d.snooze(SNOOZE).await.unwrap();
        let g = &q.group_stats().await.unwrap()[0];
        assert_eq!((g.depth, g.ready, g.in_flight, g.delayed()), (1, 0, 0, 1), "round {round}: {g:?}");
        let back = tokio::time::timeout(ARRIVES, sub.next()).await.expect("back").unwrap().unwrap();
        // Not before the delay (less a margin for the clocks of the database and this
        // process), and the attempt not counted.
        assert!(
            snoozed.elapsed() >= SNOOZE - Duration::from_millis(200),
            "back after {:?}",
            snoozed.elapsed()
        );
        assert_eq!((back.id(), back.attempt()), (id, 1));
        assert_eq!(counts(&q).await.snoozed, round);
        if round == 2 {
            let far = rowbus::limits::MAX_DURATION + Duration::from_secs(1);
            match back.snooze(far).await {
                Err(Error::InvalidDuration { .. }) => {}
                other => panic!("a snooze past the longest duration: {other:?}"),
            }
            let g = &q.group_stats().await.unwrap()[0];
            assert_eq!(g.in_flight, 1, "a refused snooze leaves the message leased");
        } else {
            // Given back at once, unstarted, for the next round.
            back.release().await.unwrap();
        }
    }
    assert_eq!(broker.stats().snoozed, 2);
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(a_snoozed_message_comes_back_after_its_delay);

/// `Outcome::Snooze` from a worker's handler, with one attempt allowed: the message runs
/// three times, each its first attempt, and is acknowledged; nothing is dead-lettered. A
/// snooze past the longest duration is the attempt's failure: with one attempt, a dead
/// letter whose error names the snooze's delay.
async fn workers_snooze_without_using_attempts<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, one_attempt()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "snoozew").await;
    q.publish(Message::text("thrice")).await.unwrap();
    q.publish(Message::text("forever")).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let runner = {
        let seen = seen.clone();
        tokio::spawn(q.subscribe().workers(2).poll_interval(Duration::from_millis(50)).run(move |d| {
            let seen = seen.clone();
            async move {
                let text = d.text().unwrap().to_owned();
                let runs = {
                    let mut seen = seen.lock().unwrap();
                    seen.push((text.clone(), d.attempt()));
                    seen.iter().filter(|(t, _)| *t == text).count()
                };
                Ok::<_, Error>(match (text.as_str(), runs) {
                    ("thrice", 1 | 2) => Outcome::Snooze(Duration::from_millis(200)),
                    ("forever", _) => Outcome::Snooze(rowbus::limits::MAX_DURATION * 2),
                    _ => Outcome::Ack,
                })
            }
        }))
    };
    until(&broker, "one acknowledged, one dead-lettered", |s| s.acked == 1 && s.dead_lettered == 1).await;
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    let thrice: Vec<u32> = seen.iter().filter(|(t, _)| t == "thrice").map(|(_, a)| *a).collect();
    assert_eq!(thrice, [1, 1, 1], "each run of a snoozed message is its first attempt");
    assert_eq!(q.depth("").await.unwrap(), (0, 1));
    let dead = q.dead_letters(&Default::default()).await.unwrap();
    assert_eq!(dead[0].payload, b"forever");
    let error = dead[0].last_error.as_deref().unwrap_or_default();
    assert!(error.contains("snooze delay"), "{error}");
    assert_eq!(counts(&q).await.snoozed, 2);
    assert_eq!(broker.stats().snoozed, 2);
    q.undeploy().await.unwrap();
}
on_each_database!(workers_snooze_without_using_attempts);

/// `Outcome::Snooze` from a batch handler snoozes every message of the batch, each back
/// as its first attempt; the counts table adds the batch's size (in one statement).
async fn a_snoozed_batch_comes_back_whole<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, one_attempt()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "snoozeb").await;
    q.publish_batch((0..5).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    let batches = Arc::new(Mutex::new(Vec::new()));
    let runner = {
        let batches = batches.clone();
        tokio::spawn(q.subscribe().batch(10).poll_interval(Duration::from_millis(50)).run_batch(move |ds| {
            let batches = batches.clone();
            async move {
                let attempts: Vec<u32> = ds.iter().map(|d| d.attempt()).collect();
                let mut batches = batches.lock().unwrap();
                let outcome = if batches.is_empty() { Outcome::Snooze(SNOOZE) } else { Outcome::Ack };
                batches.push(attempts);
                Ok::<_, Error>(outcome)
            }
        }))
    };
    until(&broker, "the batch acknowledged after its snooze", |s| s.acked == 5).await;
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    let batches = batches.lock().unwrap().clone();
    // Back each at its own due time: maybe in more than one batch.
    assert_eq!(batches[0], [1; 5], "{batches:?}");
    assert_eq!(batches[1..].concat(), [1; 5], "{batches:?}");
    assert_eq!(counts(&q).await.snoozed, 5);
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    q.undeploy().await.unwrap();
}
on_each_database!(a_snoozed_batch_comes_back_whole);

/// A transactional handler's snooze undoes its writes (the message runs again later, and
/// its effects must happen once) and puts the message back, its attempt not counted: with
/// one attempt allowed, it runs again and commits.
async fn a_transactional_snooze_undoes_its_writes<DB: Brokers>(place: Place)
where
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let broker = DB::broker(&place, one_attempt()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "snoozet").await;
    let effects = cleanup.table(&format!("{}_fx", q.table().channel()));
    place.exec(format!("CREATE TABLE {effects} (run BIGINT NOT NULL PRIMARY KEY)")).await;
    q.publish(Message::text("tx")).await.unwrap();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let insert = match DB::BACKEND {
        rowbus::Backend::Postgres => format!("INSERT INTO {effects} (run) VALUES ($1)"),
        _ => format!("INSERT INTO {effects} (run) VALUES (?)"),
    };
    let runner = {
        let runs = runs.clone();
        tokio::spawn(q.subscribe().poll_interval(Duration::from_millis(50)).run_tx(move |conn, m| {
            let (runs, insert) = (runs.clone(), insert.clone());
            Box::pin(async move {
                let run = {
                    let mut runs = runs.lock().unwrap();
                    runs.push(m.attempt());
                    runs.len() as i64
                };
                sqlx::query(sqlx::AssertSqlSafe(insert)).bind(run).execute(&mut *conn).await?;
                Ok::<_, sqlx::Error>(if run == 1 {
                    Outcome::Snooze(Duration::from_millis(300))
                } else {
                    Outcome::Ack
                })
            })
        }))
    };
    until(&broker, "acknowledged after its snooze", |s| s.acked == 1).await;
    broker.shutdown(Duration::from_secs(5)).await;
    runner.await.unwrap().unwrap();
    assert_eq!(runs.lock().unwrap().clone(), [1, 1], "the snoozed run did not count");
    assert_eq!(place.ints(format!("SELECT run FROM {effects}")).await, [2], "the snoozed run's write undone");
    assert_eq!((counts(&q).await.snoozed, broker.stats().snoozed), (1, 1));
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
    q.undeploy().await.unwrap();
}
on_each_database!(a_transactional_snooze_undoes_its_writes);

/// A queue without its counts table (deployed by an older rowbus): snoozes still settle
/// (the count is only logged as failed), `counts` says there is none; deploying again adds
/// the table, which then counts; undeploying drops it.
async fn a_deploy_adds_the_counts_table<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, one_attempt()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "snoozeu").await;
    let count_table = format!("{}_count", q.table().channel());
    place.exec(format!("DROP TABLE {count_table}")).await;
    assert_eq!(q.counts().await.unwrap(), None);
    q.publish(Message::text("old")).await.unwrap();
    let mut sub = q.subscribe().poll_interval(Duration::from_millis(50)).stream().await.unwrap();
    let d = tokio::time::timeout(ARRIVES, sub.next()).await.expect("delivered").unwrap().unwrap();
    d.snooze(Duration::from_millis(100)).await.expect("a snooze settles without the counts table");
    let d = tokio::time::timeout(ARRIVES, sub.next()).await.expect("back").unwrap().unwrap();
    assert_eq!(d.attempt(), 1);
    q.deploy().await.unwrap();
    assert_eq!(counts(&q).await, QueueCounts::default());
    d.snooze(Duration::from_millis(100)).await.unwrap();
    assert_eq!(counts(&q).await.snoozed, 1);
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
    let state = broker.queue(&count_table).unwrap().state().await.unwrap();
    assert_eq!(state, TableState::Missing, "undeploy drops the counts table");
}
on_each_database!(a_deploy_adds_the_counts_table);

/// `Queue::messages` pages through the queue table lowest id first, each message with its
/// state: queued, delayed (published with a delay), in flight (claimed, with its lease
/// left), retrying (failed once, waiting); a group's page holds only that group's; the
/// last page says there is no next.
async fn messages_page_through_the_queue<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "msgs").await;
    q.publish(Message::text("held")).await.unwrap();
    q.publish(Message::text("failing")).await.unwrap();
    q.publish(Message::text("ready").key("k").priority(3)).await.unwrap();
    q.publish(Message::text("later").delay(Duration::from_secs(600))).await.unwrap();
    q.publish(Message::new(vec![0xff, 0]).group("other")).await.unwrap();
    let mut sub = q.subscribe().batch(2).stream().await.unwrap();
    let claimed = tokio::time::timeout(ARRIVES, sub.next()).await.expect("claimed").unwrap().unwrap();
    assert_eq!(claimed.text().unwrap(), "held");
    let failing = tokio::time::timeout(ARRIVES, sub.next()).await.expect("claimed").unwrap().unwrap();
    assert_eq!(failing.text().unwrap(), "failing");
    failing.fail("it broke").await.unwrap();

    let mut seen = Vec::new();
    let mut page = MessagePage::default().limit(2);
    let mut pages = 0;
    loop {
        let got = q.messages(&page).await.unwrap();
        pages += 1;
        assert!(got.messages.len() <= 2);
        seen.extend(got.messages);
        match got.next {
            Some(after) => page = page.after(after),
            None => break,
        }
    }
    assert!(pages >= 3, "{pages} pages of two for five messages");
    let states: Vec<(&[u8], MessageState, i64)> =
        seen.iter().map(|m| (m.payload.as_slice(), m.state, m.attempts)).collect();
    assert_eq!(
        states,
        [
            (&b"held"[..], MessageState::InFlight, 1),
            (&b"failing"[..], MessageState::Retrying, 1),
            (&b"ready"[..], MessageState::Queued, 0),
            (&b"later"[..], MessageState::Delayed, 0),
            (&[0xff, 0][..], MessageState::Queued, 0),
        ]
    );
    assert!(seen.windows(2).all(|w| w[0].id < w[1].id), "lowest id first");
    assert!(seen[0].lease_left.is_some_and(|left| left > Duration::ZERO));
    assert_eq!(seen[1].last_error.as_deref(), Some("it broke"));
    assert_eq!((seen[2].key.as_deref(), seen[2].priority), (Some("k"), 3));
    assert!(seen[3].visible_in > Duration::from_secs(500), "{:?}", seen[3].visible_in);
    assert_eq!(seen[4].group, "other");
    let other = q.messages(&MessagePage::default().group("other")).await.unwrap();
    assert_eq!((other.messages.len(), other.next), (1, None));
    assert_eq!(other.messages[0].id, seen[4].id);
    drop((claimed, sub));
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(messages_page_through_the_queue);
