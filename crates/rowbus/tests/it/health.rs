//! `Queue::health` against the real PostgreSQL and MariaDB and a temporary SQLite file:
//! a transaction held open on another connection is named as what holds the horizon (its
//! pid or thread id, its application name), its age grows, and a user without the rights
//! to see it gets the reason instead of a figure. The servers are shared: another
//! program's transaction may be older than the test's, so the holder is either the
//! test's connection or at least as old as it.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{Cleanup, MARIADB, PG, TempSqlite, unique};
use rowbus::stats::{HolderKind, QueueHealth};
use rowbus::{Broker, BrokerOptions, Message};
use sqlx::Connection as _;

/// Runs `sql` as the servers' administrator with the command-line client; panics when it
/// fails.
fn admin(postgres: bool, sql: &str) {
    let out = if postgres {
        Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
    } else {
        Command::new("mysql")
            .args(["-h", "127.0.0.1", "-P", "3306", "-u", "root", "test", "-e", sql])
            .output()
    }
    .expect("the database's command-line client");
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A role (PostgreSQL) or user (MariaDB) of the test's own, dropped with it.
struct Login {
    postgres: bool,
    name: String,
}

impl Login {
    fn create(postgres: bool) -> Login {
        let name = unique("health_role");
        let create = match postgres {
            true => format!("CREATE ROLE \"{name}\" LOGIN"),
            false => format!("CREATE USER '{name}'@'%'"),
        };
        admin(postgres, &create);
        Login { postgres, name }
    }

    fn url(&self) -> String {
        match self.postgres {
            true => format!("postgres://{}@127.0.0.1:5432/test", self.name),
            false => format!("mysql://{}@127.0.0.1:3306/test", self.name),
        }
    }
}

impl Drop for Login {
    fn drop(&mut self) {
        let drop = match self.postgres {
            true => format!("DROP ROLE IF EXISTS \"{}\"", self.name),
            false => format!("DROP USER IF EXISTS '{}'@'%'", self.name),
        };
        admin(self.postgres, &drop);
    }
}

/// The holder a health names, with its age: `None` where it is not the connection `pid`.
fn ours(health: &QueueHealth, pid: i64) -> Option<Duration> {
    let holder = health.holder.as_ref().expect("readable").as_ref().expect("a holder");
    (holder.pid == Some(pid)).then(|| holder.age.clone().expect("its age readable").expect("an age"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_names_the_session_holding_the_horizon() {
    let cleanup = Cleanup::new(rowbus::Backend::Postgres);
    let pool = rowbus::connect::<sqlx::Postgres>(PG, 4).await.expect("the shared PostgreSQL");
    let broker = Broker::new(pool.clone(), BrokerOptions::default()).await.unwrap();
    let name = cleanup.queue(&unique("health"));
    let queue = broker.queue(&name).unwrap();
    queue.deploy().await.unwrap();

    let app = unique("health_app");
    let mut holder = sqlx::PgConnection::connect(PG).await.unwrap();
    sqlx::query("SELECT set_config('application_name', $1, false)")
        .bind(&app)
        .execute(&mut holder)
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class")
        .execute(&mut holder)
        .await
        .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut holder).await.unwrap();
    let pid = i64::from(pid);

    // Rows deleted while the snapshot is held stay dead.
    queue.publish_batch((0..50).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DELETE FROM \"{name}\""))).execute(&pool).await.unwrap();

    let first = queue.health().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let second = queue.health().await.unwrap();
    let h = second.holder.as_ref().unwrap().as_ref().expect("a holder");
    match (ours(&first, pid), ours(&second, pid)) {
        (Some(before), Some(after)) => {
            assert_eq!(h.kind, HolderKind::Session);
            assert_eq!(h.application.as_deref(), Some(app.as_str()));
            assert!(after > before && after >= Duration::from_millis(1200), "{before:?} -> {after:?}");
            assert!(second.held_past(Duration::from_secs(1)) && !second.held_past(Duration::from_secs(3600)));
        }
        _ => {
            // Another program's transaction is older: at least as old as ours.
            eprintln!("an older holder than the test's session: {h:?}");
            let our_age: i32 =
                sqlx::query_scalar("SELECT age(backend_xmin) FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid as i32)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert!(h.xid_age.unwrap() >= our_age as u64, "{h:?} older than ours ({our_age})");
        }
    }
    assert!(second.bytes.clone().unwrap().unwrap() > 0, "{second:?}");
    let dead = second.dead_rows.clone().unwrap().unwrap();
    assert!(!dead.server_wide);
    // The statistics reach the view within a second or so.
    let mut dead_rows = dead.rows;
    for _ in 0..50 {
        if dead_rows >= 50 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        dead_rows = queue.health().await.unwrap().dead_rows.unwrap().unwrap().rows;
    }
    assert!(dead_rows >= 50, "50 rows deleted under a held snapshot: {dead_rows} dead");
    drop(holder);
    broker.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_says_when_a_role_may_not_see_the_holder_s_age() {
    let cleanup = Cleanup::new(rowbus::Backend::Postgres);
    let name = cleanup.queue(&unique("health"));
    let owner =
        Broker::new(rowbus::connect::<sqlx::Postgres>(PG, 2).await.unwrap(), BrokerOptions::default())
            .await
            .unwrap();
    owner.queue(&name).unwrap().deploy().await.unwrap();
    let login = Login::create(true);

    let mut holder = sqlx::PgConnection::connect(PG).await.unwrap();
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").execute(&mut holder).await.unwrap();

    let pool = rowbus::connect::<sqlx::Postgres>(&login.url(), 2).await.unwrap();
    let broker = Broker::new(pool.clone(), BrokerOptions::default()).await.unwrap();
    let health = broker.queue(&name).unwrap().health().await.unwrap();
    let h = health.holder.as_ref().unwrap().as_ref().expect("a holder: ours at least");
    // Every session with a snapshot is another role's: its pid shows, its start does not.
    if h.kind == HolderKind::Session {
        let why = h.age.clone().unwrap_err().why;
        assert!(why.contains("pg_read_all_stats"), "{why}");
        assert!(!health.held_past(Duration::ZERO), "no warning from an age not read");
    }
    assert!(health.bytes.clone().unwrap().unwrap() > 0);

    admin(true, &format!("GRANT pg_read_all_stats TO \"{}\"", login.name));
    let health = broker.queue(&name).unwrap().health().await.unwrap();
    let h = health.holder.as_ref().unwrap().as_ref().unwrap();
    if h.kind == HolderKind::Session {
        assert!(h.age.clone().unwrap().is_some(), "with pg_read_all_stats: {h:?}");
    }
    pool.close().await;
    drop(holder);
    owner.shutdown(Duration::ZERO).await;
    drop(login);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_names_the_transaction_holding_the_horizon() {
    let cleanup = Cleanup::new(rowbus::Backend::MySql);
    let pool = rowbus::connect::<sqlx::MySql>(MARIADB, 4).await.expect("the shared MariaDB");
    let broker = Broker::new(pool.clone(), BrokerOptions::default()).await.unwrap();
    let queue = broker.queue(&cleanup.queue(&unique("health"))).unwrap();
    queue.deploy().await.unwrap();

    let mut holder = sqlx::MySqlConnection::connect(MARIADB).await.unwrap();
    sqlx::raw_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT").execute(&mut holder).await.unwrap();
    let thread: i64 =
        sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)").fetch_one(&mut holder).await.unwrap();

    let first = queue.health().await.unwrap();
    // trx_started has whole seconds.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let second = queue.health().await.unwrap();
    let h = second.holder.as_ref().unwrap().as_ref().expect("a holder");
    assert_eq!(h.kind, HolderKind::Transaction);
    match (ours(&first, thread), ours(&second, thread)) {
        (Some(before), Some(after)) => {
            assert!(after > before && after >= Duration::from_secs(1), "{before:?} -> {after:?}");
            assert!(h.name.as_deref().is_some_and(|n| n.starts_with("root@")), "{h:?}");
        }
        _ => {
            eprintln!("an older holder than the test's transaction: {h:?}");
            let our_age: i64 = sqlx::query_scalar(
                "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, trx_started, NOW(6)) AS SIGNED) \
                 FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ?",
            )
            .bind(thread)
            .fetch_one(&pool)
            .await
            .unwrap();
            let age = h.age.clone().unwrap().unwrap();
            assert!(
                age + Duration::from_secs(1) >= Duration::from_micros(our_age as u64),
                "{h:?}: ours {our_age} µs"
            );
        }
    }
    assert!(second.dead_rows.clone().unwrap().unwrap().server_wide);
    assert!(second.bytes.clone().unwrap().unwrap() > 0, "{second:?}");
    drop(holder);
    broker.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_says_what_a_user_without_process_lacks() {
    let cleanup = Cleanup::new(rowbus::Backend::MySql);
    let name = cleanup.queue(&unique("health"));
    let owner =
        Broker::new(rowbus::connect::<sqlx::MySql>(MARIADB, 2).await.unwrap(), BrokerOptions::default())
            .await
            .unwrap();
    owner.queue(&name).unwrap().deploy().await.unwrap();
    let login = Login::create(false);
    admin(false, &format!("GRANT SELECT ON test.`{name}` TO '{}'@'%'", login.name));

    let pool = rowbus::connect::<sqlx::MySql>(&login.url(), 2).await.unwrap();
    let broker = Broker::new(pool.clone(), BrokerOptions::default()).await.unwrap();
    let health = broker.queue(&name).unwrap().health().await.unwrap();
    for (figure, why) in
        [("dead rows", health.dead_rows.clone().map(|_| ())), ("holder", health.holder.clone().map(|_| ()))]
    {
        let why = why.unwrap_err().why;
        assert!(why.contains("PROCESS"), "{figure}: {why}");
    }
    assert!(health.bytes.clone().unwrap().unwrap() > 0, "the table is granted: {health:?}");
    pool.close().await;
    owner.shutdown(Duration::ZERO).await;
    drop(login);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_shows_the_wal_frames_a_reader_holds() {
    let file = TempSqlite::new();
    let pool = rowbus::connect_creating::<sqlx::Sqlite>(&file.url, 2).await.unwrap();
    let broker = Broker::new(pool.clone(), BrokerOptions::default()).await.unwrap();
    let queue = broker.queue(&unique("health")).unwrap();
    queue.deploy().await.unwrap();
    queue.publish_batch((0..20).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    let calm = queue.health().await.unwrap();
    assert!(calm.holder.clone().unwrap().is_none(), "{calm:?}");
    assert_eq!(calm.wal.map(|w| w.frames_left), Some(0));
    assert!(calm.dead_rows.clone().unwrap().is_none());

    let mut reader = sqlx::SqliteConnection::connect(&file.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN; SELECT count(*) FROM \"{}\"", queue.table())))
        .execute(&mut reader)
        .await
        .unwrap();
    queue.publish_batch((0..20).map(|i| Message::text(format!("after {i}")))).await.unwrap();
    let held = queue.health().await.unwrap();
    let wal = held.wal.expect("a WAL");
    assert!(wal.frames_left > 0 && wal.bytes > 0, "{wal:?}");
    assert_eq!(held.holder.clone().unwrap().unwrap().kind, HolderKind::WalReader);
    assert!(held.held_past(Duration::from_secs(3600)));
    let bytes = held.bytes.clone().unwrap().unwrap();
    assert!(bytes > wal.bytes, "the file and its WAL: {bytes} bytes");

    sqlx::raw_sql("COMMIT").execute(&mut reader).await.unwrap();
    let free = queue.health().await.unwrap();
    assert_eq!(free.wal.map(|w| w.frames_left), Some(0), "{free:?}");
    assert!(free.holder.unwrap().is_none());
    drop(reader);
    broker.shutdown(Duration::ZERO).await;
    pool.close().await;
}
