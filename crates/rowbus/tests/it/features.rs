//! Priorities, ordering keys, deduplication ids and headers, against the real PostgreSQL
//! and MariaDB and a temporary SQLite file: the same meaning on all three; and a queue
//! table made by the previous version brought up to date by a deploy.

use crate::common;

use std::time::Duration;

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use futures::StreamExt;
use rowbus::{Broker, BrokerOptions, Db, DbPool, Delivery, Error, Message, Outcome, Queue, Subscription};
use sqlx::MySql;
use tokio::sync::mpsc;

/// Longer than any test: a subscription that sees a message at all was woken.
const FOREVER: Duration = Duration::from_secs(3600);
/// How long a message a subscription should take may take to arrive.
const ARRIVES: Duration = Duration::from_secs(20);
/// How long a subscription is watched for a message it must not take: many of its poll
/// intervals.
const QUIET: Duration = Duration::from_millis(1000);

use common::place_test as database_test;

fn quick() -> BrokerOptions {
    BrokerOptions { poll_interval: Duration::from_millis(100), ..BrokerOptions::default() }
}

/// A deployed queue of the test's own, dropped by `cleanup` should the test fail.
async fn queue<DB: Db>(broker: &Broker<DB>, cleanup: &Cleanup, prefix: &str) -> Queue<DB> {
    let queue = broker.queue(&cleanup.queue(&unique(prefix))).unwrap();
    queue.deploy().await.unwrap();
    queue
}

/// A stream claiming up to ten at a time, polling every 100 ms.
async fn stream<DB: Db>(queue: &Queue<DB>) -> Subscription<DB> {
    queue.subscribe().batch(10).poll_interval(Duration::from_millis(100)).stream().await.unwrap()
}

/// The next delivery, which must come within [`ARRIVES`].
async fn next<DB: Db>(sub: &mut Subscription<DB>, what: &str) -> Delivery<DB> {
    tokio::time::timeout(ARRIVES, sub.next())
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {ARRIVES:?}"))
        .expect("the stream runs")
        .unwrap()
}

/// The payloads of the next `n` deliveries, which are kept.
async fn take<DB: Db>(sub: &mut Subscription<DB>, n: usize, what: &str) -> Vec<Delivery<DB>> {
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(next(sub, what).await);
    }
    got
}

fn texts<DB: Db>(deliveries: &[Delivery<DB>]) -> Vec<String> {
    deliveries.iter().map(|d| d.text().unwrap().to_owned()).collect()
}

/// Asserts the stream yields nothing for [`QUIET`].
async fn nothing<DB: Db>(sub: &mut Subscription<DB>, what: &str) {
    if let Ok(got) = tokio::time::timeout(QUIET, sub.next()).await {
        panic!("{what}: got {:?}", got.map(|d| d.map(|d| d.text().unwrap().to_owned())));
    }
}

/// Lower priorities are claimed first, publish order within a priority, delayed ones
/// only when due; a claim of two takes the two most urgent.
async fn priorities_order_claims<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "prio").await;
    let m = |text: &str, priority: i16| Message::text(text).priority(priority);
    q.publish_batch([m("a0", 0), m("b5", 5), m("c-1", -1), m("d0", 0), m("e-1", -1)]).await.unwrap();
    q.publish(m("late", -100).delay(FOREVER)).await.unwrap();
    q.publish(m("f-1", -1)).await.unwrap();

    let mut sub = q.subscribe().batch(2).poll_interval(Duration::from_millis(100)).stream().await.unwrap();
    let got = take(&mut sub, 6, "the ready messages").await;
    assert_eq!(texts(&got), ["c-1", "e-1", "f-1", "a0", "d0", "b5"]);
    assert_eq!(got[0].priority(), -1);
    for d in got {
        d.ack().await.unwrap();
    }
    nothing(&mut sub, "a delayed message, however urgent").await;
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(priorities_order_claims);

/// A key's messages go one at a time in publish order; other keys and unkeyed messages
/// beside them. The next goes once the one before is acknowledged or dead-lettered, not
/// while it waits for a retry.
async fn keys_go_one_at_a_time<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "keys").await;
    let k = |text: &str, key: &str| Message::text(text).key(key);
    q.publish_batch([k("a1", "A"), k("a2", "A"), k("b1", "B"), Message::text("n"), k("a3", "A")])
        .await
        .unwrap();
    // A more urgent message of a key still waits for the earlier one.
    q.publish(k("a4", "A").priority(-5)).await.unwrap();

    let mut sub = stream(&q).await;
    let first = take(&mut sub, 3, "the head of each key and the unkeyed one").await;
    let mut heads = texts(&first);
    heads.sort();
    assert_eq!(heads, ["a1", "b1", "n"]);
    nothing(&mut sub, "A's second while its first is in flight").await;
    let [a1, b1, n] = <[Delivery<DB>; 3]>::try_from(sort(first)).ok().unwrap();
    assert_eq!(a1.key(), Some("A"));
    assert_eq!(n.key(), None);

    a1.ack().await.unwrap();
    let a2 = next(&mut sub, "A's second once the first is acknowledged").await;
    assert_eq!(a2.text().unwrap(), "a2");
    a2.retry(Duration::from_millis(300), "again").await.unwrap();
    let a2 = next(&mut sub, "A's second again, after its retry delay").await;
    assert_eq!((a2.text().unwrap(), a2.attempt()), ("a2", 2), "the retried message comes before a3");
    nothing(&mut sub, "A's third while its second is in flight again").await;
    a2.dead_letter("poison").await.unwrap();
    let a3 = next(&mut sub, "A's third once the second is dead-lettered").await;
    assert_eq!(a3.text().unwrap(), "a3");
    a3.ack().await.unwrap();
    let a4 = next(&mut sub, "A's fourth").await;
    assert_eq!(a4.text().unwrap(), "a4");
    for d in [a4, b1, n] {
        d.ack().await.unwrap();
    }
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(keys_go_one_at_a_time);

/// A batch of one key's messages committed while a claim is under way still goes one at
/// a time. The window is widened on purpose: 20,000 messages held behind an earlier one of
/// their key, in flight, make each claim scan for a while (each is read and refused), and
/// another broker's transaction commits the batch while claims run back to back. InnoDB's
/// locking read sees the rows committed during the scan; a key check reading the
/// statement's snapshot would not see their earlier rows and pass the whole batch.
async fn a_batch_committed_during_a_claim_keeps_its_key_order<DB: Brokers>(place: Place) {
    const HELD: usize = 20_000;
    const ATTEMPTS: usize = 6;
    let broker = DB::broker(&place, quick()).await;
    let publisher = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "keyrace").await;

    q.publish(Message::text("head").key("held")).await.unwrap();
    let mut holder = q.subscribe().batch(1).lease(Duration::from_secs(3600)).stream().await.unwrap();
    let head = next(&mut holder, "the held key's head").await;
    for chunk in 0..HELD / 1000 {
        q.publish_batch((0..1000).map(|i| Message::text(format!("held {}", chunk * 1000 + i)).key("held")))
            .await
            .unwrap();
    }

    // Claims back to back, each scanning the held messages, driven by a task of their own.
    let mut sub = q
        .subscribe()
        .batch(100)
        .poll_interval(Duration::from_millis(1))
        .lease(Duration::from_secs(3600))
        .stream()
        .await
        .unwrap();
    let (deliveries, mut received) = mpsc::unbounded_channel();
    let claiming = tokio::spawn(async move {
        while let Some(Ok(delivery)) = sub.next().await {
            if deliveries.send(delivery).is_err() {
                break;
            }
        }
    });
    let on_publisher = publisher.queue(&q.table().to_string()).unwrap();
    for attempt in 0..ATTEMPTS {
        let key = format!("k{attempt}");
        let mut tx = publisher.begin().await.unwrap();
        tx.publish_batch(&on_publisher, (1..=10).map(|i| Message::text(format!("{key}:{i}")).key(&key)))
            .await
            .unwrap();
        // Claims begin while the batch is written but not committed: the one under way at
        // the commit reaches the batch's rows after it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.commit().await.unwrap();
        let mut of_key = Vec::new();
        let mut taken = Vec::new();
        // Until the key's first comes (each claim scans the held rows: slow on a loaded
        // machine), then 1.5 s more of claims, in which no other of the key may come.
        let mut deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while let Ok(Some(delivery)) = tokio::time::timeout_at(deadline, received.recv()).await {
            if delivery.key() == Some(key.as_str()) {
                if of_key.is_empty() {
                    deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
                }
                of_key.push(delivery.text().unwrap().to_owned());
            }
            taken.push(delivery);
        }
        assert_eq!(of_key, [format!("{key}:1")], "attempt {attempt}: in flight at once for one key");
        for delivery in taken {
            delivery.ack().await.unwrap();
        }
    }
    claiming.abort();
    let _ = claiming.await;
    head.ack().await.unwrap();
    drop(holder);
    publisher.shutdown(Duration::from_secs(1)).await;
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(a_batch_committed_during_a_claim_keeps_its_key_order);

fn sort<DB: Db>(mut deliveries: Vec<Delivery<DB>>) -> Vec<Delivery<DB>> {
    deliveries.sort_by(|a, b| a.text().unwrap().cmp(b.text().unwrap()));
    deliveries
}

/// The acknowledgement that frees a key wakes the subscription that can take its next
/// message, in another broker too (as another process would be): with a poll interval of
/// an hour, only that wake-up can bring it. Workers of `run` and of `run_tx` alike.
async fn freeing_a_key_wakes_others<DB: Brokers>(place: Place) {
    let options = BrokerOptions { poll_interval: FOREVER, listen_notify: true, ..BrokerOptions::default() };
    let (theirs, mine) = (DB::broker(&place, options.clone()).await, DB::broker(&place, options).await);
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("keywake"));
    let (their_q, my_q) = (theirs.queue(&name).unwrap(), mine.queue(&name).unwrap());
    my_q.deploy().await.unwrap();
    for transactional in [false, true] {
        let tag = if transactional { "tx" } else { "lease" };
        my_q.publish_batch([
            Message::text(format!("{tag}1")).key(tag),
            Message::text(format!("{tag}2")).key(tag),
        ])
        .await
        .unwrap();
        // They take the first; a runner here starts, finds the second held, and waits.
        let mut their_sub = stream(&their_q).await;
        let first = next(&mut their_sub, "the key's first").await;
        assert_eq!(first.text().unwrap(), format!("{tag}1"));
        let (tx, mut handled) = mpsc::unbounded_channel();
        let sub = my_q.subscribe().workers(2);
        let runner = tokio::spawn(async move {
            if transactional {
                sub.run_tx(move |_conn, message| {
                    let tx = tx.clone();
                    Box::pin(async move {
                        let _ = tx.send(message.text()?.to_owned());
                        Ok::<_, Error>(Outcome::Ack)
                    })
                })
                .await
            } else {
                sub.run(move |d| {
                    let tx = tx.clone();
                    async move {
                        let _ = tx.send(d.text()?.to_owned());
                        Ok::<_, Error>(())
                    }
                })
                .await
            }
        });
        assert!(
            tokio::time::timeout(QUIET, handled.recv()).await.is_err(),
            "nothing for the runner while the key's first is in flight"
        );
        first.ack().await.unwrap();
        let got = tokio::time::timeout(ARRIVES, handled.recv())
            .await
            .unwrap_or_else(|_| panic!("{tag}: the freed key's next message woke nobody"));
        assert_eq!(got.as_deref(), Some(&*format!("{tag}2")));
        runner.abort();
        drop(their_sub);
    }
    theirs.shutdown(Duration::from_secs(1)).await;
    mine.shutdown(Duration::from_secs(1)).await;
    my_q.undeploy().await.unwrap();
}
on_each_database!(freeing_a_key_wakes_others);

/// A deduplication id stores one message while it is in the queue (ready, delayed or in
/// flight), reports the others, and publishes again once that one is acknowledged or
/// dead-lettered; concurrent publishers of one id store it once.
async fn dedup_ids_store_one<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "dedup").await;
    let d = |text: &str, id: &str| Message::text(text).dedup_id(id);

    let first = q.publish(d("x1", "x")).await.unwrap();
    assert_eq!((first.stored, first.all_stored()), (1, true));
    let again = q.publish(d("x2", "x")).await.unwrap();
    assert_eq!((again.stored, again.duplicates), (0, vec!["x".to_owned()]));
    let batch =
        q.publish_batch([d("x3", "x"), d("y1", "y"), Message::text("plain"), d("y2", "y")]).await.unwrap();
    assert_eq!((batch.stored, batch.duplicates), (2, vec!["x".to_owned(), "y".to_owned()]));
    q.publish(d("later", "z").delay(FOREVER)).await.unwrap();
    assert_eq!(q.publish(d("z again", "z")).await.unwrap().duplicates, ["z"], "a delayed one holds its id");

    let mut sub = stream(&q).await;
    let mut got = sort(take(&mut sub, 3, "x1, y1 and plain").await);
    assert_eq!(texts(&got), ["plain", "x1", "y1"]);
    assert_eq!(got[1].dedup_id(), Some("x"));
    assert_eq!(q.publish(d("x4", "x")).await.unwrap().stored, 0, "in flight, it holds its id");
    let y1 = got.pop().unwrap();
    let x1 = got.pop().unwrap();
    x1.ack().await.unwrap();
    y1.dead_letter("dead").await.unwrap();
    let after = q.publish_batch([d("x5", "x"), d("y3", "y")]).await.unwrap();
    assert_eq!((after.stored, after.duplicates.len()), (2, 0), "acknowledged and dead-lettered ids are free");

    // Eight publishers of one id at once: one stores it.
    let racing: Vec<_> = (0..8)
        .map(|i| {
            let q = q.clone();
            tokio::spawn(
                async move { q.publish(Message::text(format!("r{i}")).dedup_id("race")).await.unwrap() },
            )
        })
        .collect();
    let mut stored = 0;
    for publish in racing {
        stored += publish.await.unwrap().stored;
    }
    assert_eq!(stored, 1);
    drop((sub, got));
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(dedup_ids_store_one);

/// Headers, priority and key travel with the message: to its delivery, through a failed
/// transactional attempt (the rows go back with all they had, the id still held), and to
/// its dead letter.
async fn headers_travel_with_the_message<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "headers").await;
    let m =
        Message::text("h").header("trace", "abc").header("lang", "é\"ü").priority(3).key("k").dedup_id("d");
    q.publish(m.clone()).await.unwrap();

    let (tx, mut handled) = mpsc::unbounded_channel();
    let sub = q.subscribe().workers(1).poll_interval(Duration::from_millis(100));
    let runner = tokio::spawn(async move {
        sub.run_tx(move |_conn, message| {
            let tx = tx.clone();
            Box::pin(async move {
                let seen = (
                    message.attempt(),
                    message.headers().clone(),
                    message.priority(),
                    message.key().map(str::to_owned),
                );
                let _ = tx.send(seen);
                match message.attempt() {
                    1 => Ok(Outcome::Retry(Duration::from_millis(300))),
                    _ => Err(Error::ShuttingDown),
                }
            })
        })
        .await
    });
    for attempt in 1..=2 {
        let (seen, headers, priority, key) =
            tokio::time::timeout(ARRIVES, handled.recv()).await.expect("handled").unwrap();
        assert_eq!((seen, &headers, priority, key.as_deref()), (attempt, m.headers(), 3, Some("k")));
        if attempt == 1 {
            assert_eq!(
                q.publish(Message::text("dup").dedup_id("d")).await.unwrap().stored,
                0,
                "restored with its id"
            );
        }
    }
    runner.abort();
    // The second attempt failed: retried with the policy's backoff, or dead-lettered when
    // it used its attempts. Dead-letter it through a lease to see the letter.
    let mut sub = stream(&q).await;
    let letter = loop {
        if let Some(letter) = q.dead_letters(&Default::default()).await.unwrap().pop() {
            break letter;
        }
        if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(200), sub.next()).await {
            d.dead_letter("enough").await.unwrap();
        }
    };
    assert_eq!((&letter.headers, letter.priority, letter.key.as_deref()), (m.headers(), 3, Some("k")));
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(headers_travel_with_the_message);

/// Keys and deduplication ids rowbus cannot keep the same on every database are refused
/// before anything is sent.
async fn bad_keys_are_refused<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "badkeys").await;
    for bad in [Message::text("x").key("trailing "), Message::text("x").dedup_id("d".repeat(256))] {
        match q.publish_batch([Message::text("fine"), bad]).await {
            Err(Error::InvalidMessage { .. }) => {}
            other => panic!("expected InvalidMessage, got {other:?}"),
        }
    }
    assert_eq!(q.depth("").await.unwrap().0, 0, "nothing of a refused batch was published");
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(bad_keys_are_refused);

/// The queue and dead-letter tables the previous version made (without priority, key,
/// dedup id and headers), and a message in each.
fn previous_version(backend: rowbus::Backend, t: &str) -> Vec<String> {
    match backend {
        rowbus::Backend::Postgres => vec![
            format!(
                "CREATE TABLE \"{t}\" (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, \
                 group_name TEXT NOT NULL DEFAULT '', payload BYTEA NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, \
                 visible_at TIMESTAMPTZ NOT NULL DEFAULT now(), lease BIGINT, lease_until TIMESTAMPTZ, \
                 created_at TIMESTAMPTZ NOT NULL DEFAULT now(), last_error TEXT)"
            ),
            format!("CREATE INDEX \"{t}_claim\" ON \"{t}\" (group_name, visible_at, id)"),
            format!(
                "CREATE TABLE \"{t}_dead\" (id BIGINT PRIMARY KEY, group_name TEXT NOT NULL, payload BYTEA NOT NULL, \
                 attempts INTEGER NOT NULL, created_at TIMESTAMPTZ NOT NULL, \
                 failed_at TIMESTAMPTZ NOT NULL DEFAULT now(), last_error TEXT)"
            ),
            format!("INSERT INTO \"{t}\" (payload) VALUES ('old')"),
            format!(
                "INSERT INTO \"{t}_dead\" (id, group_name, payload, attempts, created_at) VALUES (100, '', 'dead', 3, now())"
            ),
        ],
        rowbus::Backend::MySql => vec![
            format!(
                "CREATE TABLE `{t}` (`id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, \
                 `group_name` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '', \
                 `payload` LONGBLOB NOT NULL, `attempts` INT NOT NULL DEFAULT 0, \
                 `visible_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), `lease` BIGINT NULL, \
                 `lease_until` DATETIME(6) NULL, `created_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), \
                 `last_error` TEXT NULL, PRIMARY KEY (`group_name`, `visible_at`, `id`), UNIQUE KEY `{t}_id` (`id`)\
                 ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            ),
            format!(
                "CREATE TABLE `{t}_dead` (`id` BIGINT UNSIGNED NOT NULL, \
                 `group_name` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
                 `payload` LONGBLOB NOT NULL, `attempts` INT NOT NULL, `created_at` DATETIME(6) NOT NULL, \
                 `failed_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), `last_error` TEXT NULL, \
                 PRIMARY KEY (`id`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            ),
            format!("INSERT INTO `{t}` (payload) VALUES ('old')"),
            format!(
                "INSERT INTO `{t}_dead` (id, group_name, payload, attempts, created_at) \
                 VALUES (100, '', 'dead', 3, UTC_TIMESTAMP(6))"
            ),
        ],
        rowbus::Backend::Sqlite => {
            let now = "(CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))";
            vec![
                format!(
                    "CREATE TABLE `{t}` (`id` INTEGER PRIMARY KEY AUTOINCREMENT, `group_name` TEXT NOT NULL DEFAULT '', \
                     `payload` BLOB NOT NULL, `attempts` INTEGER NOT NULL DEFAULT 0, \
                     `visible_at` INTEGER NOT NULL DEFAULT ({now}), `lease` INTEGER, `lease_until` INTEGER, \
                     `created_at` INTEGER NOT NULL DEFAULT ({now}), `last_error` TEXT)"
                ),
                format!("CREATE INDEX `{t}_claim` ON `{t}` (`group_name`, `visible_at`, `id`)"),
                format!(
                    "CREATE TABLE `{t}_dead` (`id` INTEGER PRIMARY KEY, `group_name` TEXT NOT NULL, \
                     `payload` BLOB NOT NULL, `attempts` INTEGER NOT NULL, `created_at` INTEGER NOT NULL, \
                     `failed_at` INTEGER NOT NULL DEFAULT ({now}), `last_error` TEXT)"
                ),
                format!("INSERT INTO `{t}` (payload) VALUES (X'6F6C64')"),
                format!(
                    "INSERT INTO `{t}_dead` (id, group_name, payload, attempts, created_at) \
                     VALUES (100, '', X'64656164', 3, {now})"
                ),
            ]
        }
    }
}

/// Runs `statements` on `place` (test set-up: constant SQL of the test's own).
async fn run_sql(place: &Place, statements: &[String]) {
    use sqlx::Executor as _;
    let pool = place.pool().await;
    for sql in statements {
        let sql = sqlx::AssertSqlSafe(sql.clone());
        match &pool {
            DbPool::Postgres(p) => drop(p.execute(sql).await.unwrap()),
            DbPool::MySql(p) => drop(p.execute(sql).await.unwrap()),
            DbPool::Sqlite(p) => drop(p.execute(sql).await.unwrap()),
        }
    }
}

/// A deploy brings a queue table of the previous version up to date: its messages and
/// dead letters stay, and priorities, keys, deduplication ids and headers work on it.
/// Deploying again changes nothing.
async fn deploy_upgrades_an_older_table<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("upgrade"));
    run_sql(&place, &previous_version(DB::BACKEND, &name)).await;
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    q.deploy().await.unwrap();

    q.publish(Message::text("urgent").priority(-1).header("h", "v")).await.unwrap();
    assert_eq!(q.publish(Message::text("a").dedup_id("d")).await.unwrap().stored, 1);
    assert_eq!(q.publish(Message::text("b").dedup_id("d")).await.unwrap().stored, 0);
    let mut sub = stream(&q).await;
    let got = take(&mut sub, 3, "the old message and the new ones").await;
    assert_eq!(texts(&got), ["urgent", "old", "a"]);
    assert_eq!(got[0].header("h"), Some("v"));
    assert!(got[1].headers().is_empty() && got[1].key().is_none());
    let letters = q.dead_letters(&Default::default()).await.unwrap();
    assert_eq!((letters.len(), letters[0].payload.as_slice(), letters[0].priority), (1, &b"dead"[..], 0));
    drop((sub, got));
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(deploy_upgrades_an_older_table);

/// A full claim of many ready messages reads them in claim order: the stream takes them
/// all, each exactly once, most urgent first.
async fn many_priorities_drain_in_order<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "prio_many").await;
    let messages: Vec<Message> =
        (0..200).map(|i| Message::text(format!("{i}")).priority((i * 7 % 5) as i16 - 2)).collect();
    q.publish_batch(messages).await.unwrap();
    let mut sub = stream(&q).await;
    let got = take(&mut sub, 200, "all of them").await;
    let keys: Vec<(i16, i64)> = got.iter().map(|d| (d.priority(), d.id())).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "claimed by priority, then publish order");
    for d in got {
        d.ack().await.unwrap();
    }
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(many_priorities_drain_in_order);

/// Headers count towards a message's size: a message whose headers alone are over what the
/// server takes in one statement (MariaDB's `max_allowed_packet`) is refused before
/// anything is sent, naming the setting.
async fn headers_are_size_limited<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "bigheaders").await;
    let limit = q.max_message_bytes().await.unwrap();
    let big = Message::text("small").header("h", "x".repeat(usize::try_from(limit).unwrap()));
    match q.publish_batch([Message::text("before"), big]).await {
        Err(Error::MessageTooLarge { bytes, limit: said, setting }) => {
            assert!(bytes as u64 > said && said == limit, "{bytes} {said}");
            assert!(setting.contains("max_allowed_packet"), "{setting}");
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    assert_eq!(q.depth("").await.unwrap().0, 0, "nothing of the refused batch was published");
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_size_limited_on_mariadb() {
    headers_are_size_limited::<MySql>(Place::MariaDb).await;
}

/// The statistics of table `t`'s index `index` on MariaDB: how many columns it has (0: no
/// such index).
async fn index_columns(place: &Place, t: &str, index: &str) -> i64 {
    let sql = format!(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = '{t}' AND index_name = '{index}'"
    );
    place.ints(sql).await[0]
}

/// On MySQL/MariaDB deduplication ids live in `<queue>_dedup` and ordering keys in
/// `<queue>_keys`: a deploy moves those of a queue table made with indexes on them there
/// and drops the indexes; the ids and keys already held stay held, and free again once
/// their message is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_moves_deduplication_ids_and_keys_to_their_tables_on_mariadb() {
    let place = Place::MariaDb;
    let broker = MySql::broker(&place, quick()).await;
    let cleanup = Cleanup::new(rowbus::Backend::MySql);
    let name = cleanup.queue(&unique("dedup_up"));
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    // As the previous version left it: ids and keys in indexes, no tables of their own.
    run_sql(
        &place,
        &[
            format!("DROP TABLE `{name}_dedup`, `{name}_keys`"),
            format!("ALTER TABLE `{name}` ADD UNIQUE KEY `{name}_dedup` (`dedup_id`), ADD KEY `{name}_key` (`msg_key`, `id`)"),
            format!("INSERT INTO `{name}` (payload, dedup_id) VALUES ('old', 'd')"),
            format!("INSERT INTO `{name}` (payload, msg_key) VALUES ('old keyed', 'k')"),
        ],
    )
    .await;
    assert_eq!(index_columns(&place, &name, &format!("{name}_dedup")).await, 1);
    assert_eq!(index_columns(&place, &name, &format!("{name}_key")).await, 2);
    q.deploy().await.unwrap();
    q.deploy().await.unwrap();
    assert_eq!(index_columns(&place, &name, &format!("{name}_dedup")).await, 0, "the index is gone");
    assert_eq!(index_columns(&place, &name, &format!("{name}_key")).await, 0, "the index is gone");
    let count = |sql: String| place.ints(sql);
    let ids =
        count(format!("SELECT CAST(COUNT(*) AS SIGNED) FROM `{name}_dedup` WHERE dedup_id = 'd'")).await;
    assert_eq!(ids, [1], "the id taken before moved to the table");
    let keys = count(format!("SELECT CAST(COUNT(*) AS SIGNED) FROM `{name}_keys` WHERE msg_key = 'k'")).await;
    assert_eq!(keys, [1], "the key held before moved to the table");

    assert_eq!(q.publish(Message::text("again").dedup_id("d")).await.unwrap().duplicates, ["d"]);
    q.publish(Message::text("new keyed").key("k")).await.unwrap();
    let mut sub = stream(&q).await;
    let got = take(&mut sub, 2, "the old message and the old keyed one").await;
    assert_eq!(texts(&got), ["old", "old keyed"]);
    nothing(&mut sub, "the new keyed message waits for the old one").await;
    for delivery in got {
        delivery.ack().await.unwrap();
    }
    assert_eq!(texts(&take(&mut sub, 1, "the new keyed one").await), ["new keyed"]);
    assert_eq!(
        q.publish(Message::text("new d").dedup_id("d")).await.unwrap().stored,
        1,
        "free once acknowledged"
    );
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
    let left = count(format!(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.tables WHERE table_schema = DATABASE() \
         AND table_name IN ('{name}_dedup', '{name}_keys')"
    ))
    .await;
    assert_eq!(left, [0], "undeploy drops the ids' and the keys' tables");
}

/// The ids' table keeps a row per id taken, also after its message left (nothing that
/// removes a message looks at it); publishers delete those rows now and then, and keep
/// every row whose message is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_deduplication_ids_gone_are_cleaned_up_on_mariadb() {
    let place = Place::MariaDb;
    let broker = MySql::broker(&place, quick()).await;
    let cleanup = Cleanup::new(rowbus::Backend::MySql);
    let q = queue(&broker, &cleanup, "dedup_clean").await;
    let rows = || place.ints(format!("SELECT CAST(COUNT(*) AS SIGNED) FROM `{}_dedup`", q.table()));
    for i in 0..10 {
        q.publish(Message::text(format!("gone {i}")).dedup_id(format!("g{i}"))).await.unwrap();
    }
    let mut sub = stream(&q).await;
    for delivery in take(&mut sub, 10, "the ten to acknowledge").await {
        delivery.ack().await.unwrap();
    }
    drop(sub);
    assert_eq!(rows().await, [10], "acknowledging leaves the rows");
    // Enough publishes for a cleanup to run (one in 256).
    for i in 0..256 {
        q.publish(Message::text(format!("live {i}")).dedup_id(format!("l{i}"))).await.unwrap();
    }
    let (depth, _) = q.depth("").await.unwrap();
    assert_eq!(depth, 256);
    assert_eq!(rows().await, [256], "the rows of the acknowledged ten are gone, the live ones stay");
    assert_eq!(q.publish(Message::text("g0 again").dedup_id("g0")).await.unwrap().stored, 1);
    assert_eq!(q.publish(Message::text("l0 again").dedup_id("l0")).await.unwrap().duplicates, ["l0"]);
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}

/// A dead-lettered keyed message frees its key; requeued, it holds it again before the
/// key's later messages (it comes back under its id).
async fn a_requeued_keyed_message_holds_its_key_again<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup, "requeue_key").await;
    q.publish_batch([Message::text("k1").key("k"), Message::text("k2").key("k")]).await.unwrap();
    let mut sub = stream(&q).await;
    let first = next(&mut sub, "the key's first").await;
    assert_eq!(first.text().unwrap(), "k1");
    drop(sub);
    first.dead_letter("gave up").await.unwrap();
    assert_eq!(q.requeue_dead(&rowbus::dead::DeadLetters::All, Duration::ZERO).await.unwrap(), 1);
    let mut sub = stream(&q).await;
    let again = next(&mut sub, "the requeued first").await;
    assert_eq!(again.text().unwrap(), "k1", "the requeued message comes before the key's later one");
    nothing(&mut sub, "the key's second waits for the requeued first").await;
    again.ack().await.unwrap();
    assert_eq!(next(&mut sub, "the key's second").await.text().unwrap(), "k2");
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
on_each_database!(a_requeued_keyed_message_holds_its_key_again);

/// Waits up to five seconds for `rows` to count `want`, then fails with `what`.
async fn rows_become<F, Fut>(rows: &F, want: i64, what: &str)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<i64>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = rows().await;
        if now == [want] {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {now:?} rows, not {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// On MySQL/MariaDB the keys' table keeps a row per keyed message in the queue or its dead
/// letters: acknowledging deletes it (128 at a time, or within half a second), a
/// dead letter keeps it, and the rows nothing needs (left by a process that died, or by a
/// purged dead letter) go in a vacuum now and then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_keys_follow_their_messages_on_mariadb() {
    let place = Place::MariaDb;
    let broker = MySql::broker(&place, quick()).await;
    let cleanup = Cleanup::new(rowbus::Backend::MySql);
    let q = queue(&broker, &cleanup, "keys_rows").await;
    let rows = || place.ints(format!("SELECT CAST(COUNT(*) AS SIGNED) FROM `{}_keys`", q.table()));
    q.publish_batch((0..4).map(|i| Message::text(format!("m{i}")).key(format!("k{i}")))).await.unwrap();
    assert_eq!(rows().await, [4], "one row per keyed message");
    let mut sub = stream(&q).await;
    let mut got = take(&mut sub, 4, "four keyed").await;
    drop(sub);
    got.pop().unwrap().dead_letter("dead").await.unwrap();
    for delivery in got {
        delivery.ack().await.unwrap();
    }
    rows_become(&rows, 1, "acknowledged ones' rows go, the dead letter's stays").await;
    // A row nothing needs: a message that left while its process died before cleaning up.
    run_sql(&place, &[format!("INSERT INTO `{}_keys` (id, msg_key) VALUES (999999999, 'gone')", q.table())])
        .await;
    q.purge_dead(&rowbus::dead::DeadLetters::All).await.unwrap();
    // Enough settled keyed messages for a vacuum (one cleanup in 256).
    q.publish_batch((0..256).map(|i| Message::text(format!("v{i}")).key("v"))).await.unwrap();
    let mut sub = stream(&q).await;
    for i in 0..256 {
        next(&mut sub, &format!("v{i}")).await.ack().await.unwrap();
    }
    drop(sub);
    rows_become(&rows, 0, "the vacuum took the purged dead letter's row and the orphan").await;
    broker.shutdown(Duration::from_secs(1)).await;
    q.undeploy().await.unwrap();
}
