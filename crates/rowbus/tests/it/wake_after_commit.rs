//! Wake-ups of other processes (`listen_notify`) against the real PostgreSQL and MariaDB
//! and a temporary SQLite file: a listener on another connection hears a publish and a
//! committed `BrokerTx`, never a rolled-back one, also after the broker shut down, and
//! hears what was pending when a broker was dropped. On PostgreSQL the notification is no
//! part of the publishing transaction (it is sent after the commit, from the broker's
//! wake-up sender), and a burst of commits is told in fewer notifications than commits
//! while every subscription elsewhere is still woken.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{
    Brokers, Cleanup, MARIADB, PG, Place, cp, event_within, notification, on_each_database, silence, unique,
};
use rowbus::{Broker, BrokerOptions, Db, Event, Listener, ListenerOptions, Message, NotifyConfig, Queue};
use sqlx::Postgres;

use common::place_test as database_test;

/// Longer than any test: a subscription that sees a message at all was woken.
const FOREVER: Duration = Duration::from_secs(3600);
/// How long nothing must arrive where nothing is sent.
const QUIET: Duration = Duration::from_millis(500);

/// `listen_notify` on, through a notify table of the test's own on MySQL/MariaDB and
/// SQLite (deployed with the first queue).
fn notifying(cleanup: &Cleanup) -> BrokerOptions {
    let notify_table = NotifyConfig {
        table: cleanup.notify_table(&unique("nt")),
        poll_interval: Duration::from_millis(50),
        ..NotifyConfig::default()
    };
    BrokerOptions { listen_notify: true, notify_table, ..BrokerOptions::default() }
}

fn url(place: &Place) -> String {
    match place {
        Place::Postgres => PG.to_owned(),
        Place::MariaDb => MARIADB.to_owned(),
        Place::Sqlite(file) => file.url.clone(),
    }
}

/// A deployed queue of the test's own on `broker`, dropped by `cleanup`.
async fn queue<DB: Db>(broker: &Broker<DB>, cleanup: &Cleanup) -> Queue<DB> {
    let queue = broker.queue(&cleanup.queue(&unique("wq"))).unwrap();
    queue.deploy().await.unwrap();
    queue
}

/// A listener on its own connection, listening on `queue`'s channel (LISTEN on
/// PostgreSQL, the broker's notify table elsewhere).
async fn listener<DB: Db>(place: &Place, queue: &Queue<DB>) -> Listener {
    let options =
        ListenerOptions { notify_table: queue.broker().options().notify_table.clone(), ..Default::default() };
    let listener = Listener::connect_with(&url(place), options).await.expect("connect a listener");
    listener.listen(queue.table().channel()).await.unwrap();
    listener
}

/// A publish and a committed transaction wake a listener on another connection, with the
/// group as the payload; a rolled-back transaction wakes nobody, and nothing is sent
/// before a commit. After the broker's shutdown, publishes still wake it.
async fn listeners_hear_commits<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let broker = DB::broker(&place, notifying(&cleanup)).await;
    let q = queue(&broker, &cleanup).await;
    let channel = q.table().channel().to_owned();
    let mut listener = listener(&place, &q).await;

    q.publish(Message::text("plain")).await.unwrap();
    assert_eq!(cp(&notification(&mut listener).await), (channel.as_str(), ""));

    let mut tx = broker.begin().await.unwrap();
    tx.publish(&q, Message::text("in a transaction").group("g")).await.unwrap();
    tx.publish(&q, Message::text("twice, one wake-up").group("g")).await.unwrap();
    silence(&mut listener, QUIET).await;
    tx.commit().await.unwrap();
    assert_eq!(cp(&notification(&mut listener).await), (channel.as_str(), "g"));

    let mut tx = broker.begin().await.unwrap();
    tx.publish(&q, Message::text("never").group("rolled")).await.unwrap();
    tx.rollback().await.unwrap();
    silence(&mut listener, QUIET).await;

    // Shut down (what was pending sent), the broker still publishes, and still wakes.
    q.publish(Message::text("right before the shutdown").group("last")).await.unwrap();
    broker.shutdown(Duration::from_secs(1)).await;
    assert_eq!(cp(&notification(&mut listener).await), (channel.as_str(), "last"));
    q.publish(Message::text("after the shutdown").group("after")).await.unwrap();
    assert_eq!(cp(&notification(&mut listener).await), (channel.as_str(), "after"));
    let mut tx = broker.begin().await.unwrap();
    tx.publish(&q, Message::text("committed after the shutdown").group("tx after")).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(cp(&notification(&mut listener).await), (channel.as_str(), "tx after"));
    silence(&mut listener, QUIET).await;
}
on_each_database!(listeners_hear_commits);

/// A broker dropped without a shutdown still sends what it had pending: its wake-up
/// sender ends with it, after sending.
async fn a_dropped_broker_sends_what_is_pending<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let broker = DB::broker(&place, notifying(&cleanup)).await;
    let q = queue(&broker, &cleanup).await;
    let channel = q.table().channel().to_owned();
    let mut listener = listener(&place, &q).await;
    // The second most likely waits for the millisecond after the first one's statement.
    let mut tx = broker.begin().await.unwrap();
    tx.publish(&q, Message::text("x").group("first")).await.unwrap();
    tx.commit().await.unwrap();
    q.publish(Message::text("y").group("dropped")).await.unwrap();
    drop((q, broker));
    assert_eq!(cp(&notification(&mut listener).await), (channel.as_str(), "first"));
    assert_eq!(cp(&notification(&mut listener).await), (channel.as_str(), "dropped"));
    silence(&mut listener, QUIET).await;
}
on_each_database!(a_dropped_broker_sends_what_is_pending);

/// The check that fails when a publishing transaction on PostgreSQL notifies itself: a
/// `pg_notify(text, text)` of the test's own, ahead of `pg_catalog`'s in the
/// transaction's `search_path` (set right before the commit), records every call made in
/// that transaction instead of notifying. It must record nothing, and the listener must
/// still hear the wake-up, sent after the commit on a connection with the usual path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishing_transaction_holds_no_notification_postgres() {
    let place = Place::Postgres;
    let cleanup = Cleanup::new(place.backend());
    let broker = Postgres::broker(&place, notifying(&cleanup)).await;
    let q = queue(&broker, &cleanup).await;
    let channel = q.table().channel().to_owned();
    let spy = cleanup.schema(&unique("spy"));
    place.exec(format!("CREATE SCHEMA \"{spy}\"")).await;
    place.exec(format!("CREATE TABLE \"{spy}\".calls (channel TEXT, payload TEXT)")).await;
    place
        .exec(format!(
            "CREATE FUNCTION \"{spy}\".pg_notify(channel TEXT, payload TEXT) RETURNS void LANGUAGE sql \
             AS $$ INSERT INTO \"{spy}\".calls VALUES (channel, payload) $$"
        ))
        .await;
    let mut listener = listener(&place, &q).await;

    let mut tx = broker.begin().await.unwrap();
    tx.publish(&q, Message::text("x").group("g")).await.unwrap();
    let path = format!("SET LOCAL search_path = \"{spy}\", pg_catalog, \"$user\", public");
    sqlx::query(sqlx::AssertSqlSafe(path)).execute(&mut *tx).await.unwrap();
    // The spy is what an unqualified `pg_notify` means in this transaction now.
    let probe = format!("SELECT pg_notify('{channel}', 'probe')");
    sqlx::query(sqlx::AssertSqlSafe(probe)).execute(&mut *tx).await.unwrap();
    let calls = format!("SELECT COUNT(*)::BIGINT FROM \"{spy}\".calls");
    let recorded: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(calls.clone())).fetch_one(&mut *tx).await.unwrap();
    assert_eq!(recorded, 1, "the spy answers pg_notify in the transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM \"{spy}\".calls"))).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!(place.ints(calls).await, vec![0], "the publishing transaction called pg_notify");
    assert_eq!(cp(&notification(&mut listener).await), (channel.as_str(), "g"), "sent after the commit");
    silence(&mut listener, QUIET).await;
    broker.shutdown(Duration::from_secs(1)).await;
}

/// A burst of commits from many tasks, over four groups: each of four other brokers (as
/// other processes), subscribed to one group and polling once an hour, handles every
/// message of its group, so each was woken after the last commit of its group; and the
/// listener hears fewer notifications than there were commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_told_in_fewer_notifications_postgres() {
    const GROUPS: u64 = 4;
    const TASKS: u64 = 16;
    const EACH: u64 = 15;
    let place = Place::Postgres;
    let cleanup = Cleanup::new(place.backend());
    let options = notifying(&cleanup);
    let broker = Postgres::broker(&place, options.clone()).await;
    let q = queue(&broker, &cleanup).await;
    let name = q.table().to_string();
    let mut listener = listener(&place, &q).await;

    let handled = Arc::new(AtomicU64::new(0));
    let mut elsewhere = Vec::new();
    let mut runners = Vec::new();
    for g in 0..GROUPS {
        let other = Postgres::broker(&place, options.clone()).await;
        let queue = other.queue(&name).unwrap();
        let handled = handled.clone();
        let subscription = queue.subscribe().group(format!("g{g}")).poll_interval(FOREVER).workers(4);
        runners.push(tokio::spawn(subscription.run(move |_: rowbus::Delivery<Postgres>| {
            handled.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), rowbus::Error>(()) }
        })));
        elsewhere.push(other);
    }
    // Each subscription makes its first (empty) claim and waits.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let commits = TASKS * EACH;
    let publishers = (0..TASKS).map(|t| {
        let (broker, q) = (broker.clone(), q.clone());
        tokio::spawn(async move {
            for i in 0..EACH {
                let group = format!("g{}", (t * EACH + i) % GROUPS);
                let mut tx = broker.begin().await.unwrap();
                tx.publish(&q, Message::text("burst").group(group)).await.unwrap();
                tx.commit().await.unwrap();
            }
        })
    });
    for publisher in publishers.collect::<Vec<_>>() {
        publisher.await.unwrap();
    }

    let started = Instant::now();
    while handled.load(Ordering::Relaxed) < commits {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} of {commits} handled: a subscription elsewhere was not woken",
            handled.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut heard = Vec::new();
    while let Some(event) = event_within(&mut listener, QUIET).await {
        match event {
            Event::Notification(n) => heard.push(n.payload),
            other => panic!("expected notifications, got {other:?}"),
        }
    }
    for g in 0..GROUPS {
        assert!(heard.contains(&format!("g{g}")), "group g{g} not notified: {heard:?}");
    }
    assert!(
        (heard.len() as u64) < commits,
        "{} notifications for {commits} commits: nothing gathered",
        heard.len()
    );
    for other in &elsewhere {
        other.shutdown(Duration::from_secs(5)).await;
    }
    for runner in runners {
        runner.await.unwrap().unwrap();
    }
    broker.shutdown(Duration::from_secs(1)).await;
    assert_eq!(q.depth("").await.unwrap(), (0, 0));
}
