//! The three sqlx databases behind one trait, so the listener and the broker are written
//! once.

use std::sync::Arc;

use futures::future::BoxFuture;
use notify_table::{Statement, Value};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Database, Encode, MySql, Postgres, Row as _, Sqlite, Type};

use crate::backend::Backend;

/// A bind value of a broker statement.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Text(&'a str),
    Int(i64),
    Bytes(&'a [u8]),
}

/// A message row as a claim returns it.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: i64,
    pub group: String,
    pub payload: Vec<u8>,
    pub attempts: i64,
    /// Microseconds since the Unix epoch.
    pub created_at: i64,
}

/// The sqlx databases rowbus works on: [`Postgres`], [`MySql`] and [`Sqlite`].
pub trait Db: Database<Arguments: sqlx::IntoArguments<Self>> + sealed::Sealed {
    /// Which backend this is.
    const BACKEND: Backend;
}

pub(crate) mod sealed {
    use super::*;

    /// Where the three databases differ in Rust types. Trait methods, not generic
    /// functions, so that no async function carries the higher-ranked `Encode` and
    /// `Decode` bounds (their futures would not be provably `Send`).
    pub trait Sealed: Database {
        fn rows_affected(result: &Self::QueryResult) -> u64;
        fn statement(stmt: &Statement) -> Query<'static, Self, Self::Arguments>;
        fn query(sql: &Arc<str>, args: &[Arg<'_>]) -> Query<'static, Self, Self::Arguments>;
        fn claimed(row: &Self::Row) -> Result<ClaimedRow, sqlx::Error>;
        /// Runs a statement; the rows it affected.
        fn execute<'c>(
            conn: &'c mut Self::Connection,
            sql: &Arc<str>,
            args: &[Arg<'_>],
        ) -> BoxFuture<'c, Result<u64, sqlx::Error>>;
        /// Runs constant SQL, one statement or several, unprepared (no binds).
        fn simple<'c>(
            conn: &'c mut Self::Connection,
            sql: &'static str,
        ) -> BoxFuture<'c, Result<(), sqlx::Error>>;
        /// Runs a claim; its rows.
        fn fetch_claimed<'c>(
            conn: &'c mut Self::Connection,
            sql: &Arc<str>,
            args: &[Arg<'_>],
        ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>>;
        /// Runs a query; the first column of each row as an integer.
        fn fetch_ints<'c>(
            conn: &'c mut Self::Connection,
            sql: &Arc<str>,
            args: &[Arg<'_>],
        ) -> BoxFuture<'c, Result<Vec<i64>, sqlx::Error>>;
    }
}

macro_rules! db {
    ($db:ty, $backend:expr) => {
        impl Db for $db {
            const BACKEND: Backend = $backend;
        }

        impl sealed::Sealed for $db {
            fn rows_affected(result: &Self::QueryResult) -> u64 {
                result.rows_affected()
            }

            fn statement(stmt: &Statement) -> Query<'static, Self, Self::Arguments> {
                query(&stmt.sql, &args_of(stmt))
            }

            fn query(sql: &Arc<str>, args: &[Arg<'_>]) -> Query<'static, Self, Self::Arguments> {
                query(sql, args)
            }

            fn execute<'c>(
                conn: &'c mut Self::Connection,
                sql: &Arc<str>,
                args: &[Arg<'_>],
            ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
                let query = query::<$db>(sql, args);
                Box::pin(async move { Ok(query.execute(conn).await?.rows_affected()) })
            }

            fn simple<'c>(
                conn: &'c mut Self::Connection,
                sql: &'static str,
            ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
                Box::pin(async move { sqlx::raw_sql(sql).execute(conn).await.map(drop) })
            }

            fn fetch_claimed<'c>(
                conn: &'c mut Self::Connection,
                sql: &Arc<str>,
                args: &[Arg<'_>],
            ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
                let query = query::<$db>(sql, args);
                Box::pin(async move { query.fetch_all(conn).await?.iter().map(Self::claimed).collect() })
            }

            fn fetch_ints<'c>(
                conn: &'c mut Self::Connection,
                sql: &Arc<str>,
                args: &[Arg<'_>],
            ) -> BoxFuture<'c, Result<Vec<i64>, sqlx::Error>> {
                let query = query::<$db>(sql, args);
                Box::pin(async move {
                    query.fetch_all(conn).await?.iter().map(|row| row.try_get::<i64, _>(0)).collect()
                })
            }

            fn claimed(row: &Self::Row) -> Result<ClaimedRow, sqlx::Error> {
                Ok(ClaimedRow {
                    id: row.try_get(0)?,
                    group: row.try_get(1)?,
                    payload: row.try_get(2)?,
                    attempts: row.try_get(3)?,
                    created_at: row.try_get(4)?,
                })
            }
        }
    };
}
db!(Postgres, Backend::Postgres);
db!(MySql, Backend::MySql);
db!(Sqlite, Backend::Sqlite);

/// A notify-table statement's binds as [`Arg`]s.
pub(crate) fn args_of(stmt: &Statement) -> Vec<Arg<'_>> {
    stmt.binds
        .iter()
        .map(|v| match v {
            Value::Text(text) => Arg::Text(text),
            Value::Int(int) => Arg::Int(*int),
        })
        .collect()
}

fn query<DB>(sql: &Arc<str>, args: &[Arg<'_>]) -> Query<'static, DB, DB::Arguments>
where
    DB: Database,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
{
    let mut query = sqlx::query(AssertSqlSafe(sql.clone()));
    for arg in args {
        query = match *arg {
            Arg::Text(text) => query.bind(text),
            Arg::Int(int) => query.bind(int),
            Arg::Bytes(bytes) => query.bind(bytes),
        };
    }
    query
}
