//! Shared by the integration tests: the servers, one test per database, unique names,
//! temporary SQLite files, the guard that drops what a test made, transactions on any
//! backend, and waiting for events with a deadline.
#![allow(dead_code)]

pub mod binlog;
pub mod bouncer;
mod cleanup;
mod place;
pub mod throwaway;
pub mod trickle;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rowbus::{DbPool, Event, Listener, ListenerOptions, Notification, Notifier, NotifyConfig};
use sqlx::{Executor, MySql, Postgres, Sqlite, Transaction};

#[allow(unused_imports)]
pub use cleanup::{Cleanup, queue_tables};
#[allow(unused_imports)]
pub(crate) use place::place_test;
#[allow(unused_imports)]
pub use place::{Brokers, Place};

/// The PostgreSQL server every test uses (scripts/services.sh starts it).
pub const PG: &str = cleanup::PG_URL;
/// The MariaDB server every test uses.
pub const MARIADB: &str = cleanup::MARIADB_URL;

/// Runs `scenario` as one test per database, named after the database in a module named
/// after the scenario (`scenario::postgres`, `scenario::mariadb`, `scenario::sqlite`);
/// `on a, b` names the databases it runs on when not all three. What one such test is, the
/// test file says with its own `database_test!(database, scenario)`, defined before its
/// first use of this: how it gets that database ready and hands it to the scenario.
#[allow(unused_macros)]
macro_rules! on_each_database {
    ($scenario:ident) => {
        crate::common::on_each_database!($scenario on postgres, mariadb, sqlite);
    };
    ($scenario:ident on $($database:ident),+) => {
        mod $scenario {
            use super::*;

            $(database_test!($database, $scenario);)+
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_each_database;

/// A `database_test!` for [`on_each_database!`] (a file takes it as
/// `use common::env_test as database_test;`): a pool on the database's [`Place`], turned
/// into the scenario's argument by the file's own `async fn env(pool, db, place)`, which
/// keeps the place (and so a SQLite file) as long as it needs it.
#[allow(unused_macros)]
macro_rules! env_test {
    ($database:ident, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $database() {
            let place = crate::common::Place::named(stringify!($database));
            let db = place.pool().await;
            match db.clone() {
                rowbus::DbPool::Postgres(pool) => super::$scenario(super::env(pool, db, place).await).await,
                rowbus::DbPool::MySql(pool) => super::$scenario(super::env(pool, db, place).await).await,
                rowbus::DbPool::Sqlite(pool) => super::$scenario(super::env(pool, db, place).await).await,
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use env_test;

/// A name no other test (or test process) uses: the process id and a count, after the
/// run's tag when `scripts/test.sh` set one (`ROWBUS_TEST_RUN`), by which it tells what
/// its run made from what other programs made on the same servers meanwhile.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}_{}{}_{}", cleanup::run_tag(), std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A SQLite database file removed when dropped.
pub struct TempSqlite {
    path: PathBuf,
    pub url: String,
}

impl TempSqlite {
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(format!("{}.sqlite", unique("rowbus_test")));
        let url = format!("sqlite://{}", path.display());
        TempSqlite { path, url }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempSqlite {
    fn drop(&mut self) {
        cleanup::remove_sqlite(&self.path);
    }
}

/// `server`'s URL, or for `None` a new temporary SQLite file's, with the file (removed
/// when dropped).
pub fn url_for(server: Option<&str>) -> (String, Option<TempSqlite>) {
    let sqlite = server.is_none().then(TempSqlite::new);
    let url = server.map(str::to_owned).unwrap_or_else(|| sqlite.as_ref().unwrap().url.clone());
    (url, sqlite)
}

/// One database to test against: its URL, a pool, and (off PostgreSQL) a notify table
/// of the test's own, deployed, and dropped by [`Env::cleanup`] or, should the test fail
/// first, by the guard.
pub struct Env {
    pub url: String,
    pub db: DbPool,
    pub config: NotifyConfig,
    pub notifier: Notifier,
    _sqlite: Option<TempSqlite>,
    // Last: dropped after the pool.
    guard: Cleanup,
}

/// Connects to `url` (`None`: a new temporary SQLite file, made by connecting) and deploys
/// a notify table named for the test, polled every 50 ms. Panics, loudly, when the server
/// is down.
pub async fn env(url: Option<&str>) -> Env {
    env_with(url, |_| {}).await
}

pub async fn env_with(url: Option<&str>, adjust: impl FnOnce(&mut NotifyConfig)) -> Env {
    env_made(url, adjust, false).await
}

/// [`env_with`] whose notifier and notify table are durable ones: on PostgreSQL, the
/// notify table is deployed and notifications write rows to it as well.
pub async fn durable_env_with(url: Option<&str>, adjust: impl FnOnce(&mut NotifyConfig)) -> Env {
    env_made(url, adjust, true).await
}

async fn env_made(url: Option<&str>, adjust: impl FnOnce(&mut NotifyConfig), durable: bool) -> Env {
    let (url, sqlite) = url_for(url);
    let db = DbPool::connect_creating(&url, 8).await.unwrap_or_else(|e| {
        panic!("the test database {url} must be reachable (run scripts/services.sh): {e}")
    });
    let mut config = NotifyConfig {
        table: unique("nt"),
        poll_interval: Duration::from_millis(50),
        lookback: Duration::from_secs(5),
        ..NotifyConfig::default()
    };
    adjust(&mut config);
    let guard = Cleanup::new(db.backend());
    guard.notify_table(&config.table);
    let notifier = if durable {
        db.deploy_durable_notify_table(&config).await.expect("deploy the notify table");
        Notifier::durable(config.clone()).unwrap()
    } else {
        db.deploy_notify_table(&config).await.expect("deploy the notify table");
        Notifier::new(config.clone()).unwrap()
    };
    Env { url, db, config, notifier, _sqlite: sqlite, guard }
}

impl Env {
    pub fn options(&self) -> ListenerOptions {
        ListenerOptions {
            notify_table: self.config.clone(),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_millis(500),
            ..ListenerOptions::default()
        }
    }

    pub async fn listener(&self) -> Listener {
        Listener::connect_with(&self.url, self.options()).await.expect("connect a listener")
    }

    pub async fn notify(&self, channel: &str, payload: &str) {
        self.db.notify_with(&self.notifier, channel, payload).await.expect("notify");
    }

    pub async fn begin(&self) -> Tx {
        match &self.db {
            DbPool::Postgres(pool) => Tx::Pg(pool.begin().await.unwrap()),
            DbPool::MySql(pool) => Tx::My(pool.begin().await.unwrap()),
            DbPool::Sqlite(pool) => Tx::Lite(pool.begin().await.unwrap()),
        }
    }

    /// Runs raw SQL without binds (test set-up only).
    pub async fn exec(&self, sql: &'static str) {
        match &self.db {
            DbPool::Postgres(pool) => drop(pool.execute(sql).await.unwrap()),
            DbPool::MySql(pool) => drop(pool.execute(sql).await.unwrap()),
            DbPool::Sqlite(pool) => drop(pool.execute(sql).await.unwrap()),
        }
    }

    /// Rows in the notify table on `channel`.
    pub async fn count(&self, channel: &str) -> i64 {
        let table = &self.config.table;
        match &self.db {
            DbPool::MySql(pool) => {
                let sql = sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM `{table}` WHERE channel = ?"));
                sqlx::query_scalar(sql).bind(channel).fetch_one(pool).await.unwrap()
            }
            DbPool::Sqlite(pool) => {
                let sql = sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM `{table}` WHERE channel = ?"));
                sqlx::query_scalar(sql).bind(channel).fetch_one(pool).await.unwrap()
            }
            DbPool::Postgres(pool) => {
                let sql = sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM \"{table}\" WHERE channel = $1"));
                sqlx::query_scalar(sql).bind(channel).fetch_one(pool).await.unwrap()
            }
        }
    }

    /// Drops the test's notify table (MariaDB keeps tables across runs).
    pub async fn cleanup(self) {
        let positions = format!("{}_positions", self.config.table);
        match &self.db {
            DbPool::MySql(pool) => {
                let sql = format!("DROP TABLE IF EXISTS `{}`, `{positions}`", self.config.table);
                pool.execute(sqlx::query(sqlx::AssertSqlSafe(sql))).await.unwrap();
            }
            DbPool::Postgres(pool) => {
                let sql = format!("DROP TABLE IF EXISTS \"{}\", \"{positions}\"", self.config.table);
                pool.execute(sqlx::query(sqlx::AssertSqlSafe(sql))).await.unwrap();
            }
            DbPool::Sqlite(_) => {}
        }
        self.guard.forget(&self.config.table);
        self.guard.forget(&positions);
        self.db.close().await;
    }
}

/// A transaction on any of the three databases.
pub enum Tx {
    Pg(Transaction<'static, Postgres>),
    My(Transaction<'static, MySql>),
    Lite(Transaction<'static, Sqlite>),
}

impl Tx {
    pub async fn notify(&mut self, notifier: &Notifier, channel: &str, payload: &str) {
        match self {
            Tx::Pg(tx) => notifier.notify(&mut **tx, channel, payload).await,
            Tx::My(tx) => notifier.notify(&mut **tx, channel, payload).await,
            Tx::Lite(tx) => notifier.notify(&mut **tx, channel, payload).await,
        }
        .expect("notify in a transaction")
    }

    pub async fn commit(self) {
        match self {
            Tx::Pg(tx) => tx.commit().await,
            Tx::My(tx) => tx.commit().await,
            Tx::Lite(tx) => tx.commit().await,
        }
        .expect("commit")
    }

    pub async fn rollback(self) {
        match self {
            Tx::Pg(tx) => tx.rollback().await,
            Tx::My(tx) => tx.rollback().await,
            Tx::Lite(tx) => tx.rollback().await,
        }
        .expect("rollback")
    }
}

/// The next event, or `None` after `within`.
pub async fn event_within(listener: &mut Listener, within: Duration) -> Option<Event> {
    tokio::time::timeout(within, listener.recv()).await.ok().map(|e| e.expect("listener alive"))
}

/// The next event, which must be a notification arriving within 10 s.
pub async fn notification(listener: &mut Listener) -> Notification {
    match event_within(listener, Duration::from_secs(10)).await {
        Some(Event::Notification(n)) => n,
        other => panic!("expected a notification, got {other:?}"),
    }
}

/// Asserts nothing arrives for `quiet`.
pub async fn silence(listener: &mut Listener, quiet: Duration) {
    if let Some(event) = event_within(listener, quiet).await {
        panic!("expected nothing, got {event:?}");
    }
}

/// (channel, payload) of a notification.
pub fn cp(n: &Notification) -> (&str, &str) {
    (n.channel.as_str(), n.payload.as_str())
}

/// The next message `sub` delivers: within 20 s, or the test fails.
pub async fn next_delivery<DB: rowbus::Db>(sub: &mut rowbus::Subscription<DB>) -> rowbus::Delivery<DB> {
    use futures::StreamExt as _;
    tokio::time::timeout(Duration::from_secs(20), sub.next())
        .await
        .expect("a message within 20 s")
        .expect("the stream goes on")
        .expect("a claim")
}
