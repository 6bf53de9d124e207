//! The test harness (feature `testing`) against the real PostgreSQL and MariaDB and a
//! SQLite file of its own: drain runs a handler inline and says what became of each
//! message; make_due brings retries and delays forward; run_schedules_now publishes a
//! schedule's next tick at once, and its scheduler does not publish it again;
//! insert_only holds consumers off; cleanup, or the drop of a harness a failing test
//! left, drops its queues.

use crate::common;

use std::time::Duration;

use common::{MARIADB, PG};
use rowbus::schedule::{SCHEDULE_HEADER, Schedule};
use rowbus::testing::{Expected, Handled, TestBroker};
use rowbus::{BrokerOptions, Db, Message, Outcome, RetryPolicy};

fn options() -> BrokerOptions {
    BrokerOptions {
        retry: RetryPolicy { max_attempts: 2, base: Duration::from_secs(60), ..RetryPolicy::default() },
        ..BrokerOptions::default()
    }
}

async fn harness<DB: Db>(url: Option<&str>) -> TestBroker<DB> {
    match url {
        Some(url) => TestBroker::connect_with(url, options())
            .await
            .unwrap_or_else(|e| panic!("{url} must be reachable (run scripts/services.sh): {e}")),
        None => unreachable!("SQLite goes through sqlite_with"),
    }
}

macro_rules! on_each_database {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$scenario(super::harness::<sqlx::Postgres>(Some(super::PG)).await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mariadb() {
                super::$scenario(super::harness::<sqlx::MySql>(Some(super::MARIADB)).await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$scenario(rowbus::testing::TestBroker::sqlite_with(super::options()).await.unwrap())
                    .await;
            }
        }
    };
}

async fn drain_settles_each_message_and_says_how<DB: Db>(test: TestBroker<DB>) {
    let jobs = test.queue("drain").await.unwrap();
    for text in ["ok", "fail", "drop", "later", "follow"] {
        jobs.publish(Message::text(text).group(if text == "later" { "other" } else { "" })).await.unwrap();
    }
    let follow_up = jobs.clone();
    let drained = test
        .drain(&jobs, move |d| {
            let follow_up = follow_up.clone();
            async move {
                match d.text().map_err(|e| e.to_string())? {
                    "fail" => Err("it broke".to_owned()),
                    "drop" => Ok(Outcome::Drop),
                    "later" => Ok(Outcome::Retry(Duration::from_secs(30))),
                    "follow" => {
                        follow_up.publish(Message::text("followed")).await.map_err(|e| e.to_string())?;
                        Ok(Outcome::Ack)
                    }
                    _ => Ok(Outcome::Ack),
                }
            }
        })
        .await
        .unwrap();
    let summary: Vec<(String, u32, Handled)> = drained
        .iter()
        .map(|d| (String::from_utf8(d.payload.clone()).unwrap(), d.attempt, d.handled.clone()))
        .collect();
    assert_eq!(
        summary,
        [
            ("ok".to_owned(), 1, Handled::Acked),
            (
                "fail".to_owned(),
                1,
                Handled::Retried { after: Duration::from_secs(60), error: Some("it broke".into()) }
            ),
            ("drop".to_owned(), 1, Handled::Dropped),
            ("follow".to_owned(), 1, Handled::Acked),
            ("followed".to_owned(), 1, Handled::Acked),
            ("later".to_owned(), 1, Handled::Retried { after: Duration::from_secs(30), error: None }),
        ]
    );
    assert_eq!(test.drain(&jobs, |_| async { Ok::<_, String>(()) }).await.unwrap(), [], "nothing ready");

    // Both retries brought forward: the failure fails its last attempt.
    assert_eq!(test.make_due(&jobs).await.unwrap(), 2);
    let drained = test
        .drain(&jobs, |d| async move {
            if d.text().map_err(|e| e.to_string())? == "fail" {
                Err("still broken".to_owned())
            } else {
                Ok(())
            }
        })
        .await
        .unwrap();
    let handled: Vec<&Handled> = drained.iter().map(|d| &d.handled).collect();
    assert_eq!(handled, [&Handled::DeadLettered { error: "still broken".into() }, &Handled::Acked]);
    let stats = jobs.group_stats().await.unwrap();
    assert_eq!(stats.iter().map(|g| g.depth).sum::<i64>(), 0);
    assert_eq!(stats.iter().filter_map(|g| g.dead).sum::<i64>(), 1);
    test.cleanup().await.unwrap();
}
on_each_database!(drain_settles_each_message_and_says_how);

async fn schedules_tick_now_and_once<DB: Db>(test: TestBroker<DB>) {
    let jobs = test.queue("ticks").await.unwrap();
    jobs.schedule("hourly", Schedule::every(Duration::from_secs(3600)).payload("sweep")).await.unwrap();
    assert_eq!(test.run_schedules_now(&jobs).await.unwrap(), ["hourly"]);
    let drained = test
        .drain(&jobs, |d| async move {
            assert_eq!(d.header(SCHEDULE_HEADER), Some("hourly"));
            assert_eq!(d.text()?, "sweep");
            Ok::<_, rowbus::Error>(())
        })
        .await
        .unwrap();
    assert_eq!(drained.len(), 1);
    assert_eq!(drained[0].handled, Handled::Acked);
    test.cleanup().await.unwrap();
}
on_each_database!(schedules_tick_now_and_once);

async fn insert_only_holds_consumers_off<DB: Db>(test: TestBroker<DB>) {
    let jobs = test.queue("insert_only").await.unwrap();
    test.insert_only(&jobs).await.unwrap();
    jobs.publish(Message::text("kept").delay(Duration::from_secs(600))).await.unwrap();
    assert_eq!(test.make_due(&jobs).await.unwrap(), 1);
    assert_eq!(test.drain(&jobs, |_| async { Ok::<_, String>(()) }).await.unwrap(), []);
    assert_eq!(jobs.group_stats().await.unwrap()[0].ready, 1, "still there");
    test.consume_again(&jobs).await.unwrap();
    assert_eq!(test.drain(&jobs, |_| async { Ok::<_, String>(()) }).await.unwrap().len(), 1);
    test.cleanup().await.unwrap();
}
on_each_database!(insert_only_holds_consumers_off);

/// A harness dropped without its cleanup (a test that failed) drops its queues anyway;
/// one cleaned up has dropped them already.
async fn queues_go_with_the_harness<DB: Db>(test: TestBroker<DB>) {
    let (a, b) = (test.queue("gone").await.unwrap(), test.queue("gone").await.unwrap());
    assert_ne!(a.table(), b.table(), "names of their own");
    let names = [a.table().to_string(), b.table().to_string()];
    let (pool, url) = (test.broker().pool().clone(), test.url().to_owned());
    drop((a, b));
    drop(test);
    if DB::BACKEND == rowbus::Backend::Sqlite {
        let file = url.strip_prefix("sqlite://").unwrap();
        assert!(!std::path::Path::new(file).exists(), "{file} was left behind");
        return;
    }
    let broker = rowbus::Broker::new(pool, BrokerOptions::default()).await.unwrap();
    for name in names {
        assert!(!broker.queue(&name).unwrap().is_deployed().await.unwrap(), "{name} was left behind");
    }
}
on_each_database!(queues_go_with_the_harness);

async fn published_messages_are_read_and_asserted<DB: Db>(test: TestBroker<DB>) {
    let jobs = test.queue("published").await.unwrap();
    jobs.publish(
        Message::json(&serde_json::json!({"order": 7, "to": "a@b"})).unwrap().group("mail").key("c-3"),
    )
    .await
    .unwrap();
    jobs.publish(Message::text("later").delay(Duration::from_secs(600)).header("trace", "abc"))
        .await
        .unwrap();
    let all = test.published(&jobs).await.unwrap();
    assert_eq!(all.len(), 2);
    // JSON compared as a value, whatever its formatting and key order.
    let found = test
        .assert_published(
            &jobs,
            &Expected::json(&serde_json::json!({"to": "a@b", "order": 7})).group("mail").key("c-3"),
        )
        .await;
    assert_eq!(found.id, all[0].id);
    let later = test
        .assert_published(
            &jobs,
            &Expected::text("later").header("trace", "abc").delayed_at_least(Duration::from_secs(500)),
        )
        .await;
    assert_eq!(later.id, all[1].id);
    test.refute_published(&jobs, &Expected::text("later").delayed_at_least(Duration::from_secs(700))).await;
    test.refute_published(&jobs, &Expected::any().group("other")).await;
    // Nothing was claimed by reading.
    assert_eq!(jobs.group_stats().await.unwrap().iter().map(|g| g.in_flight).sum::<i64>(), 0);
    let missing = tokio::spawn({
        let (jobs, test) = (jobs.clone(), test.url().to_owned());
        async move {
            let again = TestBroker::<DB>::connect(&test).await;
            // On SQLite the harness's file: the same database.
            if let Ok(again) = again {
                again.assert_published(&jobs, &Expected::text("absent")).await;
            }
        }
    })
    .await;
    let panic = missing.expect_err("asserting an absent message panics");
    let said = panic.into_panic();
    let said = said.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(said.contains("it holds") && said.contains("later"), "{said}");
    test.cleanup().await.unwrap();
}
on_each_database!(published_messages_are_read_and_asserted);
