//! The queue table's layout: claims that start at a floor (where ready rows are looked for
//! in the index) on every database, and on PostgreSQL the ring of partitions a deploy
//! converts an older table into, with every message as it was.

use crate::common;

use std::time::Duration;

use common::{Brokers, Cleanup, PG, Place, on_each_database, place_test as database_test, unique};
use futures::StreamExt;
use rowbus::{Broker, BrokerOptions, Message};

/// A broker polling every 50 ms.
fn quick() -> BrokerOptions {
    BrokerOptions { poll_interval: Duration::from_millis(50), ..BrokerOptions::default() }
}

/// The next delivery of a stream, within 30 s.
async fn next<DB: rowbus::Db>(sub: &mut rowbus::Subscription<DB>, what: &str) -> rowbus::Delivery<DB> {
    match tokio::time::timeout(Duration::from_secs(30), sub.next()).await {
        Ok(Some(Ok(d))) => d,
        other => panic!("{what}: no delivery ({:?})", other.map(|o| o.map(|r| r.map(|d| d.id())))),
    }
}

/// A message more urgent than any waiting when the floor was computed (the floor starts
/// at the priority most ready messages have) is still claimed before them.
async fn a_more_urgent_message_published_later_is_claimed_first<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = broker.queue(&cleanup.queue(&unique("urgent"))).unwrap();
    q.deploy().await.unwrap();
    q.publish_batch((0..50).map(|i| Message::text(format!("plain {i}")))).await.unwrap();
    let mut sub = q.subscribe().batch(1).lease(Duration::from_secs(60)).stream().await.unwrap();
    let first = next(&mut sub, "the first plain message").await;
    assert_eq!(first.text().unwrap(), "plain 0");
    first.ack().await.unwrap();
    // Passes of the broker's upkeep compute the floor from what waits: priority 0.
    for i in 1..10 {
        let d = next(&mut sub, "a plain message").await;
        assert_eq!(d.text().unwrap(), format!("plain {i}"));
        d.ack().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    q.publish(Message::text("urgent").priority(-7)).await.unwrap();
    let urgent = next(&mut sub, "the urgent message").await;
    assert_eq!(urgent.text().unwrap(), "urgent", "claimed before the 40 plain messages");
    urgent.ack().await.unwrap();
    broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(a_more_urgent_message_published_later_is_claimed_first);

/// A message whose transaction committed long after it began (its `visible_at` is the
/// transaction's start, earlier than the floor the claims meanwhile moved to) is claimed
/// all the same, within a pass of the upkeep and a poll. (SQLite has one writer: the open
/// transaction would hold the other publishes.)
async fn a_message_committed_long_after_its_insert_is_claimed<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, quick()).await;
    let publisher = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = broker.queue(&cleanup.queue(&unique("late"))).unwrap();
    q.deploy().await.unwrap();
    let on_publisher = publisher.queue(&q.table().to_string()).unwrap();
    let mut sub = q.subscribe().batch(10).stream().await.unwrap();
    let mut tx = publisher.begin().await.unwrap();
    tx.publish(&on_publisher, Message::text("late")).await.unwrap();
    // Meanwhile the subscription claims and others publish: its floor moves past the
    // late message's start.
    for i in 0..20 {
        q.publish(Message::text(format!("early {i}"))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut early = 0;
    while early < 20 {
        let d = next(&mut sub, "an early message").await;
        assert!(d.text().unwrap().starts_with("early"), "{}", d.text().unwrap());
        d.ack().await.unwrap();
        early += 1;
    }
    tx.commit().await.unwrap();
    let late = next(&mut sub, "the late message").await;
    assert_eq!(late.text().unwrap(), "late");
    late.ack().await.unwrap();
    broker.shutdown(Duration::from_secs(1)).await;
    publisher.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(a_message_committed_long_after_its_insert_is_claimed on postgres, mariadb);

/// A message given back by one broker (its `visible_at` as it was, behind the floors of
/// other brokers' claims) is claimed by another.
async fn a_message_given_back_is_claimed_by_another_broker<DB: Brokers>(place: Place) {
    let one = DB::broker(&place, quick()).await;
    let other = DB::broker(&place, quick()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = one.queue(&cleanup.queue(&unique("given"))).unwrap();
    q.deploy().await.unwrap();
    let on_other = other.queue(&q.table().to_string()).unwrap();
    q.publish(Message::text("given back")).await.unwrap();
    let mut mine = q.subscribe().batch(1).lease(Duration::from_secs(3600)).stream().await.unwrap();
    let held = next(&mut mine, "the message").await;
    let mut theirs = on_other.subscribe().batch(1).stream().await.unwrap();
    // The other broker's claims go on, and its floor with them.
    for i in 0..10 {
        on_other.publish(Message::text(format!("other {i}"))).await.unwrap();
        next(&mut theirs, "another message").await.ack().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    held.release().await.unwrap();
    let again = next(&mut theirs, "the message given back").await;
    assert_eq!(again.text().unwrap(), "given back");
    again.ack().await.unwrap();
    one.shutdown(Duration::from_secs(1)).await;
    other.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(a_message_given_back_is_claimed_by_another_broker);

/// A broker on the test PostgreSQL, of its own pool.
async fn pg_broker() -> Broker<sqlx::Postgres> {
    let pool = rowbus::connect::<sqlx::Postgres>(PG, 4).await.expect("the test PostgreSQL must be reachable");
    Broker::new(pool, quick()).await.unwrap()
}

/// Runs `sql` on PostgreSQL (test set-up: constant text and generated names).
async fn exec(broker: &Broker<sqlx::Postgres>, sql: String) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(broker.pool()).await.unwrap();
}

/// One integer a query returns.
async fn int(broker: &Broker<sqlx::Postgres>, sql: String) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql)).fetch_one(broker.pool()).await.unwrap()
}

/// A queue table as the release before partitions deployed it (its statements, verbatim
/// but for the names), with a message in every state a message can be in, a dead letter
/// and a wake-up trigger; a deploy converts it to the ring of partitions, and every message
/// is there as it was: ids, leases, attempts, errors, keys, deduplication ids, priorities,
/// headers, times. The id sequence goes on, the deduplication id still refuses a second
/// message, the holder of the lease acknowledges its message, the trigger still fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deploy_converts_a_table_of_the_release_before() {
    let cleanup = Cleanup::new(rowbus::Backend::Postgres);
    let name = cleanup.queue(&unique("convert"));
    let broker = pg_broker().await;
    exec(
        &broker,
        format!(
            "CREATE TABLE \"{name}\" (
               id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
               group_name TEXT NOT NULL DEFAULT '',
               priority SMALLINT NOT NULL DEFAULT 0,
               msg_key TEXT,
               dedup_id TEXT,
               headers TEXT,
               payload BYTEA NOT NULL,
               attempts INTEGER NOT NULL DEFAULT 0,
               visible_at TIMESTAMPTZ NOT NULL DEFAULT now(),
               lease BIGINT,
               lease_until TIMESTAMPTZ,
               created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
               last_error TEXT
             ) WITH (fillfactor = 50);
             CREATE INDEX \"{name}_ready\" ON \"{name}\" (group_name, priority, visible_at, id);
             CREATE INDEX \"{name}_key\" ON \"{name}\" (msg_key, id) WHERE msg_key IS NOT NULL;
             CREATE UNIQUE INDEX \"{name}_dedup\" ON \"{name}\" (dedup_id) WHERE dedup_id IS NOT NULL;
             CREATE TABLE \"{name}_dead\" (
               id BIGINT PRIMARY KEY, group_name TEXT NOT NULL, priority SMALLINT NOT NULL DEFAULT 0,
               msg_key TEXT, headers TEXT, payload BYTEA NOT NULL, attempts INTEGER NOT NULL,
               created_at TIMESTAMPTZ NOT NULL, failed_at TIMESTAMPTZ NOT NULL DEFAULT now(), last_error TEXT
             );
             CREATE OR REPLACE FUNCTION rowbus_wake() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN PERFORM pg_notify(TG_ARGV[0], NEW.group_name); RETURN NULL; END $$;
             CREATE TRIGGER \"{name}_wake\" AFTER INSERT ON \"{name}\" FOR EACH ROW EXECUTE FUNCTION rowbus_wake('{name}');
             INSERT INTO \"{name}\" (payload) VALUES ('ready');
             INSERT INTO \"{name}\" (payload, visible_at) VALUES ('delayed', now() + interval '1 hour');
             INSERT INTO \"{name}\" (payload, lease, lease_until, attempts) VALUES ('in flight', 42, now() + interval '1 hour', 1);
             INSERT INTO \"{name}\" (payload, lease, lease_until, attempts) VALUES ('lease ran out', 43, now() - interval '1 minute', 1);
             INSERT INTO \"{name}\" (payload, attempts, last_error, visible_at) VALUES ('retried', 2, 'boom', now() - interval '1 second');
             INSERT INTO \"{name}\" (payload, msg_key) VALUES ('key first', 'k'), ('key second', 'k');
             INSERT INTO \"{name}\" (payload, priority) VALUES ('urgent', -5);
             INSERT INTO \"{name}\" (payload, dedup_id) VALUES ('deduplicated', 'd-1');
             INSERT INTO \"{name}\" (payload, headers, group_name) VALUES ('with headers', '{{\"a\":\"b\"}}', 'g');
             INSERT INTO \"{name}_dead\" (id, group_name, payload, attempts, created_at, last_error)
               VALUES (1000, '', 'dead', 5, now(), 'gave up');
             SELECT setval(pg_get_serial_sequence('\"{name}\"', 'id'), 1000);"
        ),
    )
    .await;
    let columns = "id, group_name, priority, msg_key, dedup_id, headers, payload, attempts, visible_at, lease, \
                   lease_until, created_at, last_error";
    let snapshot = |table: String| {
        format!("SELECT COALESCE(string_agg(row({columns})::text, '|' ORDER BY id), '') FROM \"{table}\"")
    };
    let rows_before: String = sqlx::query_scalar(sqlx::AssertSqlSafe(snapshot(name.clone())))
        .fetch_one(broker.pool())
        .await
        .unwrap();

    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    assert_eq!(
        int(
            &broker,
            format!("SELECT COUNT(*) FROM pg_class WHERE oid = '\"{name}\"'::regclass AND relkind = 'p'")
        )
        .await,
        1,
        "partitioned"
    );
    assert_eq!(keyed_by_id(&broker, &name).await, 4, "a key on id in each partition");
    let rows_after: String = sqlx::query_scalar(sqlx::AssertSqlSafe(snapshot(name.clone())))
        .fetch_one(broker.pool())
        .await
        .unwrap();
    assert_eq!(rows_after, rows_before, "every message as it was");
    assert_eq!(int(&broker, format!("SELECT COUNT(*) FROM \"{name}_dead\"")).await, 1, "the dead letter");
    // Deploying again changes nothing.
    q.deploy().await.unwrap();

    // The sequence goes on; the wake-up trigger fires on the new table.
    let mut listener = rowbus::Listener::connect(PG).await.unwrap();
    listener.listen(&name).await.unwrap();
    let id = q.publish_with_id(Message::text("after").group("woken")).await.unwrap().expect("stored");
    assert!(id > 1000, "the id sequence goes on: {id}");
    let woken = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await;
    assert!(
        matches!(&woken, Ok(Ok(rowbus::Event::Notification(n))) if n.payload == "woken"),
        "the trigger's notification: {woken:?}"
    );
    // The deduplication id is still taken.
    let again = q.publish(Message::text("again").dedup_id("d-1")).await.unwrap();
    assert_eq!(again.duplicates, ["d-1"], "a duplicate");
    // The lease holder's acknowledgement.
    assert_eq!(
        int(&broker, format!("WITH d AS (DELETE FROM \"{name}\" WHERE payload = 'in flight' AND lease = 42 RETURNING 1) SELECT COUNT(*) FROM d")).await,
        1
    );
    // What is claimable comes in claim order: the urgent message, then by publish time, the
    // second of key `k` only once its first is gone.
    let mut sub = q.subscribe().batch(10).lease(Duration::from_secs(60)).stream().await.unwrap();
    let mut texts = Vec::new();
    while texts.len() < 6 {
        let d = next(&mut sub, "a converted message").await;
        texts.push(d.text().unwrap().to_owned());
        d.ack().await.unwrap();
    }
    assert_eq!(texts[0], "urgent", "{texts:?}");
    for text in ["ready", "lease ran out", "retried", "key first", "deduplicated"] {
        assert!(texts.contains(&text.to_owned()), "{text} among {texts:?}");
    }
    let second = next(&mut sub, "the key's second").await;
    assert!(["key second", "after"].contains(&second.text().unwrap()), "{}", second.text().unwrap());
    broker.shutdown(Duration::from_secs(1)).await;
}

/// The partitions of `name` whose unique index is on `id` alone.
async fn keyed_by_id(broker: &Broker<sqlx::Postgres>, name: &str) -> i64 {
    int(
        broker,
        format!(
            "SELECT COUNT(*) FROM pg_inherits h JOIN pg_index i ON i.indrelid = h.inhrelid \
             WHERE h.inhparent = '\"{name}\"'::regclass AND i.indisunique AND i.indnkeyatts = 1 \
             AND i.indkey[0] = (SELECT attnum FROM pg_attribute WHERE attrelid = h.inhrelid AND attname = 'id')"
        ),
    )
    .await
}

/// Each partition is keyed by `id` alone (the planner then reads a partition by its key for
/// a statement by ids, rather than the whole of it); a queue deployed with one key across
/// the partitions, `(id, slot)`, gets a key per partition from a deploy, every message kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_partitions_are_keyed_by_id() {
    let cleanup = Cleanup::new(rowbus::Backend::Postgres);
    let name = cleanup.queue(&unique("keyed"));
    let broker = pg_broker().await;
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    assert_eq!(keyed_by_id(&broker, &name).await, 4, "a key on id in each partition");
    let parent_keys = format!(
        "SELECT COUNT(*) FROM pg_constraint WHERE conrelid = '\"{name}\"'::regclass AND contype = 'p'"
    );
    assert_eq!(int(&broker, parent_keys.clone()).await, 0, "no key across the partitions");

    // As the release before made it: one key across partitions.
    let drops: String = (0..4)
        .map(|n| format!("ALTER TABLE \"{name}_p{n}\" DROP CONSTRAINT \"{name}_p{n}_pkey\";"))
        .collect();
    exec(&broker, format!("{drops} ALTER TABLE \"{name}\" ADD PRIMARY KEY (id, slot)")).await;
    assert_eq!(keyed_by_id(&broker, &name).await, 0);
    for n in 0..50 {
        q.publish(Message::text(format!("m{n}"))).await.unwrap();
    }
    q.deploy().await.unwrap();
    assert_eq!(keyed_by_id(&broker, &name).await, 4, "a key on id in each partition");
    assert_eq!(int(&broker, parent_keys).await, 0, "the key across the partitions dropped");
    // Deploying again changes nothing.
    q.deploy().await.unwrap();
    let mut sub = q.subscribe().batch(50).lease(Duration::from_secs(60)).stream().await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 50 {
        let d = next(&mut sub, "a message published before the deploy").await;
        seen.insert(d.text().unwrap().to_owned());
        d.ack().await.unwrap();
    }
    assert_eq!(
        int(&broker, format!("SELECT COUNT(*) FROM \"{name}\"")).await,
        0,
        "every message acknowledged"
    );
    broker.shutdown(Duration::from_secs(1)).await;
}
