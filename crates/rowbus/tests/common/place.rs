//! Where a broker test makes its brokers: one database, on SQLite one file shared by the
//! test's brokers (as several processes would share it); and the test-per-database macro
//! for scenarios that take a [`Place`].

use std::sync::Arc;

use rowbus::{Broker, BrokerOptions, Db, DbPool};
use sqlx::{MySql, Postgres, Sqlite};

use super::{MARIADB, PG, TempSqlite};

/// Makes brokers on one database: on SQLite, on one file.
#[derive(Clone)]
pub enum Place {
    Postgres,
    MariaDb,
    Sqlite(Arc<TempSqlite>),
}

impl Place {
    /// The place of the database a test is named after (`postgres`, `mariadb`; any other
    /// name: SQLite, in a new file).
    pub fn named(database: &str) -> Place {
        match database {
            "postgres" => Place::Postgres,
            "mariadb" => Place::MariaDb,
            _ => Place::Sqlite(Arc::new(TempSqlite::new())),
        }
    }

    /// The place's database URL.
    pub fn url(&self) -> String {
        match self {
            Place::Postgres => PG.to_owned(),
            Place::MariaDb => MARIADB.to_owned(),
            Place::Sqlite(file) => file.url.clone(),
        }
    }

    /// A new pool of 8 connections on the place's database; panics, loudly, when the
    /// server is down.
    pub async fn pool(&self) -> DbPool {
        self.pool_of(8).await
    }

    /// A new pool of `connections` on the place's database; panics, loudly, when the
    /// server is down.
    pub async fn pool_of(&self, connections: u32) -> DbPool {
        let url = self.url();
        DbPool::connect_creating(&url, connections)
            .await
            .unwrap_or_else(|e| panic!("{url} must be reachable (run scripts/services.sh): {e}"))
    }

    pub fn backend(&self) -> rowbus::Backend {
        match self {
            Place::Postgres => rowbus::Backend::Postgres,
            Place::MariaDb => rowbus::Backend::MySql,
            Place::Sqlite(_) => rowbus::Backend::Sqlite,
        }
    }

    /// Runs a statement of the test's own (set-up and inspection only).
    pub async fn exec(&self, sql: String) {
        let sql = sqlx::AssertSqlSafe(sql);
        match self.pool().await {
            DbPool::Postgres(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
            DbPool::MySql(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
            DbPool::Sqlite(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
        }
    }

    /// The integers of the first column of a query of the test's own, in order.
    pub async fn ints(&self, sql: String) -> Vec<i64> {
        let sql = sqlx::AssertSqlSafe(sql);
        match self.pool().await {
            DbPool::Postgres(pool) => sqlx::query_scalar(sql).fetch_all(&pool).await.unwrap(),
            DbPool::MySql(pool) => sqlx::query_scalar(sql).fetch_all(&pool).await.unwrap(),
            DbPool::Sqlite(pool) => sqlx::query_scalar(sql).fetch_all(&pool).await.unwrap(),
        }
    }
}

/// A broker on `place` with `options`.
pub trait Brokers: Db {
    /// On a pool of 8 connections.
    fn broker(place: &Place, options: BrokerOptions) -> impl Future<Output = Broker<Self>> + Send {
        Self::broker_of(place, 8, options)
    }

    /// On a pool of `connections`.
    fn broker_of(
        place: &Place,
        connections: u32,
        options: BrokerOptions,
    ) -> impl Future<Output = Broker<Self>> + Send;
}

macro_rules! brokers {
    ($db:ty, $variant:ident) => {
        impl Brokers for $db {
            async fn broker_of(place: &Place, connections: u32, options: BrokerOptions) -> Broker<Self> {
                let DbPool::$variant(pool) = place.pool_of(connections).await else { unreachable!() };
                Broker::new(pool, options).await.unwrap()
            }
        }
    };
}
brokers!(Postgres, Postgres);
brokers!(MySql, MySql);
brokers!(Sqlite, Sqlite);

/// One test of `scenario` on `database` for [`on_each_database!`](super::on_each_database):
/// it gets the place to make its brokers. A test file says
/// `use common::place_test as database_test;`.
#[allow(unused_macros)]
macro_rules! place_test {
    (postgres, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn postgres() {
            super::$scenario::<sqlx::Postgres>(crate::common::Place::Postgres).await;
        }
    };
    (mariadb, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn mariadb() {
            super::$scenario::<sqlx::MySql>(crate::common::Place::MariaDb).await;
        }
    };
    (sqlite, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sqlite() {
            let file = std::sync::Arc::new(crate::common::TempSqlite::new());
            super::$scenario::<sqlx::Sqlite>(crate::common::Place::Sqlite(file)).await;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use place_test;
