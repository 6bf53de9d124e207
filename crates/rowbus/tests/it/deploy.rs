//! Deploying against the real PostgreSQL and MariaDB and a temporary SQLite file: every
//! replica of an app may deploy the same queue (and notify table) at start-up at once,
//! and a deploy never builds a queue over a table that is not one.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Cleanup, MARIADB, PG, TempSqlite, on_each_database, unique};
use futures::StreamExt;
use rowbus::stats::TableState;
use rowbus::{Broker, BrokerOptions, Db, DbPool, Error, Message, NotifyConfig, NotifyDeploy};
use tokio::sync::Barrier;

/// How many replicas deploy at once.
const REPLICAS: usize = 4;

/// One test of `scenario` on `database`, for [`on_each_database!`]: the scenario gets the
/// database's URL (on SQLite a new file's, removed after).
macro_rules! database_test {
    (postgres, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn postgres() {
            super::$scenario::<sqlx::Postgres>(PG).await;
        }
    };
    (mariadb, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn mariadb() {
            super::$scenario::<sqlx::MySql>(MARIADB).await;
        }
    };
    (sqlite, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sqlite() {
            let file = TempSqlite::new();
            super::$scenario::<sqlx::Sqlite>(&file.url).await;
        }
    };
}

/// A broker on a pool of its own, as each replica of an app has (deploying, it may create
/// the SQLite file).
async fn broker<DB: Db>(url: &str, options: BrokerOptions) -> Broker<DB> {
    let pool = rowbus::connect_creating::<DB>(url, 2)
        .await
        .unwrap_or_else(|e| panic!("{url} must be reachable (run scripts/services.sh): {e}"));
    Broker::new(pool, options).await.unwrap()
}

/// Runs `sql` (test set-up and clean-up: constant text and generated names).
async fn exec<DB: Db>(broker: &Broker<DB>, sql: String)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    sqlx::Executor::execute(broker.pool(), sqlx::AssertSqlSafe(sql)).await.unwrap();
}

/// Runs `deploy` on every replica at once (released together by a barrier); each
/// replica's result.
async fn all_at_once<T, F>(replicas: Vec<F>) -> Vec<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let start = Arc::new(Barrier::new(replicas.len()));
    let tasks: Vec<_> = replicas
        .into_iter()
        .map(|deploy| {
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                deploy.await
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

/// Four replicas, each with its own pool and broker, deploy one new queue at once: all
/// succeed, and the queue works across them.
async fn replicas_deploy_one_queue_at_once<DB: Db>(url: &str) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("replicas"));
    let mut brokers = Vec::new();
    for _ in 0..REPLICAS {
        brokers.push(broker::<DB>(url, BrokerOptions::default()).await);
    }
    let queues: Vec<_> = brokers.iter().map(|b| b.queue(&name).unwrap()).collect();
    let deploys = queues.iter().cloned().map(|q| async move { q.deploy().await }).collect();
    for (replica, result) in all_at_once(deploys).await.into_iter().enumerate() {
        result.unwrap_or_else(|e| panic!("replica {replica}'s deploy failed: {e}"));
    }

    let (first, last) = (&queues[0], &queues[REPLICAS - 1]);
    assert_eq!(first.state().await.unwrap(), TableState::Deployed);
    first.publish(Message::text("after the race")).await.unwrap();
    let mut sub = last.subscribe().stream().await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(d.text().unwrap(), "after the race");
    d.ack().await.unwrap();
    // The depth reads the dead-letter table too: it exists.
    assert_eq!(last.depth("").await.unwrap(), (0, 0));
    first.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(replicas_deploy_one_queue_at_once);

/// Four replicas deploy one new notify table at once: all succeed, and it carries
/// notifications.
async fn replicas_deploy_the_notify_table_at_once<DB: Db>(url: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let cleanup = Cleanup::new(DB::BACKEND);
    let config =
        NotifyConfig { table: cleanup.notify_table(&unique("nt_replicas")), ..NotifyConfig::default() };
    let mut pools = Vec::new();
    for _ in 0..REPLICAS {
        pools.push(DbPool::connect_creating(url, 2).await.unwrap());
    }
    let deploys = pools
        .iter()
        .cloned()
        .map(|db| {
            let config = config.clone();
            async move { db.deploy_notify_table(&config).await }
        })
        .collect();
    for (replica, result) in all_at_once(deploys).await.into_iter().enumerate() {
        let done = result.unwrap_or_else(|e| panic!("replica {replica}'s deploy failed: {e}"));
        assert_eq!(done, NotifyDeploy::TableReady { table: config.table.clone() });
    }

    let notifier = rowbus::Notifier::new(config.clone()).unwrap();
    pools[0].notify_with(&notifier, "replicas", "after the race").await.unwrap();
    let b = broker::<DB>(url, BrokerOptions::default()).await;
    assert_eq!(b.notify_table_stats(&config).await.unwrap().map(|s| s.rows), Some(1));
    exec(&b, format!("DROP TABLE {}", config.table)).await;
    cleanup.forget(&config.table);
}
on_each_database!(replicas_deploy_the_notify_table_at_once on mariadb, sqlite);

/// A deploy over a table that is not a queue table (here `(id INTEGER, name TEXT)`)
/// refuses in one error naming the table and the columns it lacks, and creates nothing:
/// no dead-letter table, no notify table; an undeploy of the name refuses and drops nothing.
async fn deploy_over_a_foreign_table_creates_nothing<DB: Db>(url: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let cleanup = Cleanup::new(DB::BACKEND);
    let notify =
        NotifyConfig { table: cleanup.notify_table(&unique("nt_foreign")), ..NotifyConfig::default() };
    let options =
        BrokerOptions { listen_notify: true, notify_table: notify.clone(), ..BrokerOptions::default() };
    let b = broker::<DB>(url, options).await;
    let name = cleanup.queue(&unique("foreign"));
    exec(&b, format!("CREATE TABLE {name} (id INTEGER, name TEXT)")).await;
    let q = b.queue(&name).unwrap();

    let lacks = vec!["group_name", "payload", "attempts", "visible_at", "lease", "lease_until"];
    let err = q.deploy().await.expect_err("a deploy over a table that is not a queue");
    assert!(
        matches!(&err, Error::NotAQueueTable { table, missing } if *table == name && *missing == lacks),
        "{err:?}"
    );
    let message = err.to_string();
    for needle in [
        &format!("`{name}`"),
        "not a rowbus queue table",
        "group_name",
        "lease_until",
        "rowbus deploy --queue",
    ] {
        assert!(message.contains(needle), "expected {needle:?} in: {message}");
    }
    assert_eq!(q.state().await.unwrap(), TableState::NotAQueue { missing: lacks.clone() });
    assert!(matches!(q.is_deployed().await, Err(Error::NotAQueueTable { .. })));
    let dead = b.queue(&format!("{name}_dead")).unwrap();
    assert_eq!(dead.state().await.unwrap(), TableState::Missing, "{name}_dead was created");
    assert_eq!(b.notify_table_stats(&notify).await.unwrap(), None, "the notify table was created");

    // Nor does an undeploy of the name drop the table.
    let err = q.undeploy().await.expect_err("an undeploy of a table that is not a queue");
    assert!(matches!(&err, Error::NotAQueueTable { table, .. } if *table == name), "{err:?}");
    assert_eq!(q.state().await.unwrap(), TableState::NotAQueue { missing: lacks });

    exec(&b, format!("DROP TABLE {name}")).await;
    cleanup.forget(&name);
    b.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(deploy_over_a_foreign_table_creates_nothing);

/// A deploy waits for the lock another session holds (`lock`, released by `unlock`),
/// creating nothing meanwhile, and completes once it is released. `lock` and `unlock` are
/// given the queue's name.
async fn deploy_waits_for_the_lock<DB: Db>(url: &str, lock: fn(&str) -> String, unlock: fn(&str) -> String)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let cleanup = Cleanup::new(DB::BACKEND);
    let (b, other) = (
        broker::<DB>(url, BrokerOptions::default()).await,
        broker::<DB>(url, BrokerOptions::default()).await,
    );
    let name = cleanup.queue(&unique("held"));
    let mut holder = other.pool().acquire().await.unwrap();
    // Other tests deploy in the same database at the same time: the lock is waited for,
    // and taken for sure before the deploy below starts.
    sqlx::Executor::execute(&mut *holder, sqlx::AssertSqlSafe(lock(&name))).await.unwrap();
    let q = b.queue(&name).unwrap();
    let deploy = tokio::spawn({
        let q = q.clone();
        async move { q.deploy().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!deploy.is_finished(), "the deploy did not wait for the lock: {:?}", deploy.await);
    assert_eq!(q.state().await.unwrap(), TableState::Missing);
    sqlx::Executor::execute(&mut *holder, sqlx::AssertSqlSafe(unlock(&name))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), deploy).await.unwrap().unwrap().unwrap();
    assert_eq!(q.state().await.unwrap(), TableState::Deployed);
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}

/// PostgreSQL: one advisory key for every deploy in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_waits_for_the_lock_on_postgres() {
    deploy_waits_for_the_lock::<sqlx::Postgres>(
        PG,
        |_| "SELECT pg_advisory_lock(hashtextextended('rowbus deploy', 0))".into(),
        |_| "SELECT pg_advisory_unlock(hashtextextended('rowbus deploy', 0))".into(),
    )
    .await;
}

/// MariaDB: a named lock per database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_waits_for_the_lock_on_mariadb() {
    deploy_waits_for_the_lock::<sqlx::MySql>(
        MARIADB,
        |_| {
            "BEGIN NOT ATOMIC IF GET_LOCK(CONCAT('rowbus deploy ', DATABASE()), 60) IS NOT TRUE THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the deploy lock was not taken'; END IF; END"
                .into()
        },
        |_| "SELECT RELEASE_LOCK(CONCAT('rowbus deploy ', DATABASE()))".into(),
    )
    .await;
}

/// Deploys of `q` and `q_dead` race, from two brokers (two pools) released together:
/// every round, one of them is refused as colliding with the other, whichever came
/// second, and the other's tables stand. The name check and the creation are one step
/// under the deploy lock, which is one per database.
async fn racing_deploys_of_colliding_queues_refuse_one<DB: Db>(url: &str) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let (a, b) = (
        broker::<DB>(url, BrokerOptions::default()).await,
        broker::<DB>(url, BrokerOptions::default()).await,
    );
    for _ in 0..4 {
        let base = cleanup.queue(&unique("race"));
        let dead = cleanup.queue(&format!("{base}_dead"));
        let barrier = Arc::new(Barrier::new(2));
        let deploy = |broker: &Broker<DB>, name: &str| {
            let (queue, barrier) = (broker.queue(name).unwrap(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                queue.deploy().await
            })
        };
        let (first, second) = (deploy(&a, &base), deploy(&b, &dead));
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        let (won, err) = match (first, second) {
            (Ok(()), Err(err)) => (base.clone(), err),
            (Err(err), Ok(())) => (dead.clone(), err),
            (first, second) => panic!("one of `{base}` and `{dead}` must be refused: {first:?}, {second:?}"),
        };
        assert!(matches!(err, Error::QueueNameCollides { .. }), "{err:?}");
        assert_eq!(a.queue(&won).unwrap().state().await.unwrap(), TableState::Deployed);
        a.queue(&won).unwrap().undeploy().await.unwrap();
        cleanup.forget(&base);
        cleanup.forget(&dead);
    }
    a.shutdown(Duration::from_secs(1)).await;
    b.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(racing_deploys_of_colliding_queues_refuse_one);

/// SQLite: the database's write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_waits_for_the_lock_on_sqlite() {
    let file = TempSqlite::new();
    deploy_waits_for_the_lock::<sqlx::Sqlite>(&file.url, |_| "BEGIN IMMEDIATE".into(), |_| "COMMIT".into())
        .await;
}

/// The names a deploy of a queue takes besides its own, where a table's name could be
/// taken: its side tables, and (PostgreSQL, SQLite) its indexes, which share the tables'
/// names there.
fn taken_names(backend: rowbus::Backend) -> Vec<&'static str> {
    let mut suffixes =
        vec!["_dead", "_pause", "_sched", "_ticks", "_hist", "_keep", "_count", "_limits", "_starts"];
    match backend {
        rowbus::Backend::MySql => suffixes.extend(["_dedup", "_keys"]),
        _ => suffixes.extend(["_ready", "_key", "_dedup", "_hidx"]),
    }
    suffixes
}

/// Asserts `err` refuses deploying `queue` because the name `table` is also queue
/// `other`'s, in words an operator can act on.
fn assert_collides(err: &Error, queue: &str, table: &str, other: &str) {
    assert!(
        matches!(err, Error::QueueNameCollides { queue: q, table: t, other: o } if q == queue && t == table && o == other),
        "{err:?}"
    );
    let message = err.to_string();
    for needle in [format!("`{queue}`"), format!("`{table}`"), format!("`{other}`")] {
        assert!(message.contains(&needle), "expected {needle:?} in: {message}");
    }
}

/// Two queues never share a table: a queue named as another's side table (`q_dead` after
/// `q`, even once `q_dead` was dropped by hand), and a queue one of whose side tables is
/// another queue (`q` after `q_dead`), are refused, for every side table and index name,
/// creating nothing; redeploying a queue is still accepted.
async fn deploy_refuses_queues_that_share_a_table<DB: Db>(url: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let cleanup = Cleanup::new(DB::BACKEND);
    let b = broker::<DB>(url, BrokerOptions::default()).await;
    let q = cleanup.queue(&unique("shared"));
    let queue = b.queue(&q).unwrap();
    queue.deploy().await.unwrap();
    queue.deploy().await.expect("a redeploy of the same queue");
    let quote = |name: &str| match DB::BACKEND {
        rowbus::Backend::MySql => format!("`{name}`"),
        _ => format!("\"{name}\""),
    };
    // The dead-letter table dropped by hand: its name is still the queue's.
    exec(&b, format!("DROP TABLE {}", quote(&format!("{q}_dead")))).await;
    for suffix in taken_names(DB::BACKEND) {
        let side = cleanup.queue(&format!("{q}{suffix}"));
        let err = b.queue(&side).unwrap().deploy().await.expect_err("a queue named as another's side table");
        assert_collides(&err, &side, &side, &q);
    }
    assert_eq!(b.queue(&format!("{q}_dead_dead")).unwrap().state().await.unwrap(), TableState::Missing);
    queue.deploy().await.expect("the redeploy that brings the dead-letter table back");

    // The other way round: the side-table name is a queue first.
    for suffix in taken_names(DB::BACKEND) {
        let base = cleanup.queue(&unique("shared"));
        let side = cleanup.queue(&format!("{base}{suffix}"));
        let other = b.queue(&side).unwrap();
        other.deploy().await.unwrap();
        let err = b.queue(&base).unwrap().deploy().await.expect_err("a queue whose side table is a queue");
        assert_collides(&err, &base, &side, &side);
        assert_eq!(b.queue(&base).unwrap().state().await.unwrap(), TableState::Missing, "{base} was created");
        other.undeploy().await.unwrap();
    }
    queue.undeploy().await.unwrap();
    b.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(deploy_refuses_queues_that_share_a_table);

/// Whether PostgreSQL has schema `name`.
async fn pg_schema_exists(broker: &Broker<sqlx::Postgres>, name: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(name)
        .fetch_one(broker.pool())
        .await
        .unwrap()
}

/// A queue in a schema that does not exist is refused, naming the schema, and nothing is
/// made; asked to, the deploy creates the schema (then a plain deploy finds it). The
/// cleanup drops the schema with everything in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deploy_refuses_a_missing_schema_unless_asked() {
    let cleanup = Cleanup::new(rowbus::Backend::Postgres);
    let schema = cleanup.schema(&unique("typo"));
    let broker = broker::<sqlx::Postgres>(PG, BrokerOptions::default()).await;
    let queue = broker.queue(&format!("{schema}.jobs")).unwrap();
    for refused in [queue.deploy().await, queue.deploy_keeping(Duration::from_secs(60)).await] {
        match refused {
            Err(Error::MissingSchema { schema: named }) => assert_eq!(named, schema),
            other => panic!("a missing schema was not refused: {other:?}"),
        }
    }
    assert!(!pg_schema_exists(&broker, &schema).await, "the refused deploy made the schema");
    assert_eq!(queue.state().await.unwrap(), TableState::Missing);

    let options = rowbus::DeployOptions::default().create_schema(true).keep(Duration::from_secs(60));
    queue.deploy_with(&options).await.unwrap();
    assert!(pg_schema_exists(&broker, &schema).await);
    assert_eq!(queue.state().await.unwrap(), TableState::Deployed);
    assert_eq!(queue.keep().await.unwrap(), Some(Duration::from_secs(60)));
    queue.deploy().await.expect("the schema exists now");
    queue.publish(Message::text("in the new schema")).await.unwrap();
    broker.shutdown(Duration::from_secs(1)).await;
}

/// On MySQL/MariaDB a queue's qualifier is a database, which rowbus never creates: a
/// missing one is refused, asked to create it or not, and nothing is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_deploy_refuses_a_missing_database_even_asked() {
    let database = unique("typo");
    let broker = broker::<sqlx::MySql>(MARIADB, BrokerOptions::default()).await;
    let queue = broker.queue(&format!("{database}.jobs")).unwrap();
    for create_schema in [false, true] {
        let options = rowbus::DeployOptions::default().create_schema(create_schema);
        match queue.deploy_with(&options).await {
            Err(e @ Error::MissingMySqlDatabase { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains(&format!("`{database}`")) && text.contains("does not create databases"),
                    "{text}"
                );
            }
            other => panic!("a missing database was not refused: {other:?}"),
        }
    }
    let made: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?")
            .bind(&database)
            .fetch_one(broker.pool())
            .await
            .unwrap();
    assert_eq!(made, 0);
    broker.shutdown(Duration::from_secs(1)).await;
}

/// A PostgreSQL table's storage options (`fillfactor=50`).
async fn pg_options(broker: &Broker<sqlx::Postgres>, table: &str) -> Option<Vec<String>> {
    sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE relname = $1")
        .bind(table)
        .fetch_one(broker.pool())
        .await
        .unwrap()
}

/// A PostgreSQL queue table is a ring of partitions, each leaving half of its pages free;
/// a deploy again changes nothing, and an operator's own fill factor stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_partitions_leave_room_on_their_pages() {
    let cleanup = Cleanup::new(rowbus::Backend::Postgres);
    let name = cleanup.queue(&unique("older"));
    let broker = broker::<sqlx::Postgres>(PG, BrokerOptions::default()).await;
    let queue = broker.queue(&name).unwrap();
    queue.deploy().await.unwrap();
    for slot in 0..4 {
        assert_eq!(
            pg_options(&broker, &format!("{name}_p{slot}")).await,
            Some(vec!["fillfactor=50".to_owned()])
        );
    }
    exec(&broker, format!("ALTER TABLE \"{name}_p1\" SET (fillfactor = 70)")).await;
    queue.deploy().await.unwrap();
    assert_eq!(
        pg_options(&broker, &format!("{name}_p1")).await,
        Some(vec!["fillfactor=70".to_owned()]),
        "the operator's choice"
    );
    broker.shutdown(Duration::from_secs(1)).await;
}

/// The page each row of a PostgreSQL queue table is on, by id.
async fn pg_pages(broker: &Broker<sqlx::Postgres>, table: &str) -> std::collections::HashMap<i64, i64> {
    let sql = format!("SELECT id, (ctid::text::point)[0]::BIGINT FROM \"{table}\"");
    sqlx::query_as::<_, (i64, i64)>(sqlx::AssertSqlSafe(sql))
        .fetch_all(broker.pool())
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// A PostgreSQL queue table leaves room on its pages for the rows' claimed versions: a
/// claim writes most of them beside the row it replaces (a heap-only update, which inserts
/// into no index). With the pages filled at insert, as tables are by default, every row
/// on a full page moves, which is all but the last page's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_update_rows_on_their_own_page() {
    let cleanup = Cleanup::new(rowbus::Backend::Postgres);
    let name = cleanup.queue(&unique("pages"));
    let broker = broker::<sqlx::Postgres>(PG, BrokerOptions::default()).await;
    let queue = broker.queue(&name).unwrap();
    queue.deploy().await.unwrap();

    let n = 1000;
    queue.publish_batch((0..n).map(|i| Message::text(format!("message {i:>24}")))).await.unwrap();
    let before = pg_pages(&broker, &name).await;
    let pages: std::collections::HashSet<i64> = before.values().copied().collect();
    assert!(pages.len() >= 4, "the rows fill several pages: {}", pages.len());
    // One claim of them all: the stream's first message comes from it.
    let mut sub = queue.subscribe().batch(n).stream().await.unwrap();
    let first = sub.next().await.unwrap().unwrap();
    assert_eq!(broker.stats().claimed, n as u64, "all claimed at once");
    let after = pg_pages(&broker, &name).await;
    let stayed = before.iter().filter(|(id, page)| after.get(id) == Some(page)).count();
    assert!(stayed * 4 >= n * 3, "{stayed} of {n} claimed rows stayed on their page");
    drop((first, sub));
    broker.shutdown(Duration::from_secs(1)).await;
}
