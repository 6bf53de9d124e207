//! The driver mechanics shared by the three sqlx databases: running a statement with its
//! binds and decoding the rows rowbus reads, behind the sealed [`sealed::Driver`] trait (a
//! database is one of rowbus's when it implements it, through [`driver!`]). What differs
//! between the databases is their dialect, one level up.

use std::sync::Arc;

use futures::future::BoxFuture;
use notify_table::{Statement, Value};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Database, Encode, Type};

/// A bind value of a broker statement.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Text(&'a str),
    Int(i64),
    Bytes(&'a [u8]),
    /// A NULL text.
    Null,
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
    pub priority: i64,
    pub key: Option<String>,
    pub dedup_id: Option<String>,
    /// A JSON object of strings, or NULL for none.
    pub headers: Option<String>,
}

/// A dead letter's row as [`TableSql::dead_list`](crate::sql::TableSql::dead_list) reads it.
#[derive(Debug, Clone)]
pub struct DeadRow {
    pub id: i64,
    pub group: String,
    pub payload: Vec<u8>,
    pub attempts: i64,
    /// Microseconds since the Unix epoch: when it was published.
    pub created_at: i64,
    /// Microseconds since the Unix epoch: when it was dead-lettered.
    pub failed_at: i64,
    pub last_error: Option<String>,
    pub priority: i64,
    pub key: Option<String>,
    /// A JSON object of strings, or NULL for none.
    pub headers: Option<String>,
}

/// A history row as [`HistorySql::list`](crate::sql::HistorySql::list) reads it: the
/// dead letter's columns (`failed_at` is when it was handled), then its outcome.
#[derive(Debug, Clone)]
pub struct HistoryRow {
    pub row: DeadRow,
    pub outcome: String,
}

/// A queue table's row as [`TableSql::messages_list`](crate::sql::TableSql::messages_list)
/// reads it.
#[derive(Debug, Clone)]
pub struct QueuedRow {
    pub id: i64,
    pub group: String,
    pub payload: Vec<u8>,
    pub attempts: i64,
    /// Microseconds since the Unix epoch: when it was published.
    pub created_at: i64,
    /// Microseconds since `visible_at` (negative: before it) by the database's clock.
    pub visible_age: i64,
    /// Microseconds since `lease_until` (negative: before it); `None` without a lease.
    pub lease_age: Option<i64>,
    pub priority: i64,
    pub key: Option<String>,
    pub last_error: Option<String>,
    /// The headers as stored: a JSON object, or none.
    pub headers: Option<String>,
}

/// Sealed: the driver mechanics, the same for every database, as trait methods rather
/// than generic functions so that no async function carries the higher-ranked `Encode`
/// and `Decode` bounds (their futures would not be provably `Send`). Implemented by
/// [`driver!`] in each database's module.
pub(crate) mod sealed {
    use super::*;

    pub trait Driver: Database {
        fn statement(stmt: &Statement) -> Query<'static, Self, Self::Arguments>;
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
        /// Runs a query; its rows, each decoded as a `T` (`with` says how, where a row
        /// type needs telling).
        fn fetch<'c, T: Decoded>(
            conn: &'c mut Self::Connection,
            sql: &Arc<str>,
            args: &[Arg<'_>],
            with: T::With,
        ) -> BoxFuture<'c, Result<Vec<T>, sqlx::Error>>;
        /// Runs a claim; its rows.
        fn fetch_claimed<'c>(
            c: &'c mut Self::Connection,
            sql: &Arc<str>,
            args: &[Arg<'_>],
        ) -> Fetched<'c, ClaimedRow> {
            Self::fetch(c, sql, args, ())
        }
        /// Runs a dead-letter query; its rows.
        fn fetch_dead<'c>(
            c: &'c mut Self::Connection,
            sql: &Arc<str>,
            args: &[Arg<'_>],
        ) -> Fetched<'c, DeadRow> {
            Self::fetch(c, sql, args, ())
        }
        /// Runs a history query; its rows.
        fn fetch_history<'c>(
            c: &'c mut Self::Connection,
            sql: &Arc<str>,
            args: &[Arg<'_>],
        ) -> Fetched<'c, HistoryRow> {
            Self::fetch(c, sql, args, ())
        }
        /// Runs a query of a queue table's messages; its rows.
        fn fetch_queued<'c>(
            c: &'c mut Self::Connection,
            sql: &Arc<str>,
            args: &[Arg<'_>],
        ) -> Fetched<'c, QueuedRow> {
            Self::fetch(c, sql, args, ())
        }
        /// Runs a query; each row's columns as nullable integers after `texts` text columns.
        fn fetch_rows<'c>(
            c: &'c mut Self::Connection,
            sql: &Arc<str>,
            args: &[Arg<'_>],
            texts: usize,
        ) -> Fetched<'c, TextsAndInts> {
            Self::fetch(c, sql, args, texts)
        }
    }

    /// What a fetch of `T` rows returns.
    pub type Fetched<'c, T> = BoxFuture<'c, Result<Vec<T>, sqlx::Error>>;

    /// A row type rowbus reads, decoded from any of its databases' rows.
    pub trait Decoded: Sized + Send + 'static {
        /// What the decoding needs to be told besides the row (`()` for most).
        type With: Copy + Send + 'static;

        /// `row` as a `Self`.
        fn decode(row: &impl Columns, with: Self::With) -> Result<Self, sqlx::Error>;
    }

    /// A row's columns by the types rowbus reads: every sqlx row that decodes them.
    pub trait Columns {
        /// How many columns the row has.
        fn width(&self) -> usize;
        /// Column `i` as an integer.
        fn int(&self, i: usize) -> Result<i64, sqlx::Error>;
        /// Column `i` as an integer or NULL.
        fn opt_int(&self, i: usize) -> Result<Option<i64>, sqlx::Error>;
        /// Column `i` as text.
        fn text(&self, i: usize) -> Result<String, sqlx::Error>;
        /// Column `i` as text or NULL.
        fn opt_text(&self, i: usize) -> Result<Option<String>, sqlx::Error>;
        /// Column `i` as bytes.
        fn bytes(&self, i: usize) -> Result<Vec<u8>, sqlx::Error>;
    }

    impl<R> Columns for R
    where
        R: sqlx::Row,
        usize: sqlx::ColumnIndex<R>,
        for<'r> i64: sqlx::Decode<'r, R::Database> + Type<R::Database>,
        for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + Type<R::Database>,
        for<'r> String: sqlx::Decode<'r, R::Database> + Type<R::Database>,
        for<'r> Option<String>: sqlx::Decode<'r, R::Database> + Type<R::Database>,
        for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + Type<R::Database>,
    {
        fn width(&self) -> usize {
            self.len()
        }
        fn int(&self, i: usize) -> Result<i64, sqlx::Error> {
            self.try_get(i)
        }
        fn opt_int(&self, i: usize) -> Result<Option<i64>, sqlx::Error> {
            self.try_get(i)
        }
        fn text(&self, i: usize) -> Result<String, sqlx::Error> {
            self.try_get(i)
        }
        fn opt_text(&self, i: usize) -> Result<Option<String>, sqlx::Error> {
            self.try_get(i)
        }
        fn bytes(&self, i: usize) -> Result<Vec<u8>, sqlx::Error> {
            self.try_get(i)
        }
    }
}

/// A result row: its first columns as text, the rest as integers (`None` for NULL).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextsAndInts {
    pub texts: Vec<String>,
    pub ints: Vec<Option<i64>>,
}

impl TextsAndInts {
    /// `row`'s first `texts` columns as text, the rest as nullable integers.
    pub(crate) fn of(row: &impl sealed::Columns, texts: usize) -> Result<Self, sqlx::Error> {
        Ok(TextsAndInts {
            texts: (0..texts).map(|i| row.text(i)).collect::<Result<_, _>>()?,
            ints: (texts..row.width()).map(|i| row.opt_int(i)).collect::<Result<_, _>>()?,
        })
    }

    /// Integer column `i` (after the text columns), 0 for NULL or a missing column.
    pub fn int(&self, i: usize) -> i64 {
        self.ints.get(i).copied().flatten().unwrap_or(0)
    }

    /// Text column `i`, empty when missing.
    pub fn text(&self, i: usize) -> &str {
        self.texts.get(i).map_or("", String::as_str)
    }
}

impl sealed::Decoded for TextsAndInts {
    /// How many text columns come first.
    type With = usize;

    fn decode(row: &impl sealed::Columns, texts: usize) -> Result<Self, sqlx::Error> {
        TextsAndInts::of(row, texts)
    }
}

impl sealed::Decoded for ClaimedRow {
    type With = ();

    fn decode(row: &impl sealed::Columns, (): ()) -> Result<Self, sqlx::Error> {
        Ok(ClaimedRow {
            id: row.int(0)?,
            group: row.text(1)?,
            payload: row.bytes(2)?,
            attempts: row.int(3)?,
            created_at: row.int(4)?,
            priority: row.int(5)?,
            key: row.opt_text(6)?,
            dedup_id: row.opt_text(7)?,
            headers: row.opt_text(8)?,
        })
    }
}

impl DeadRow {
    /// A dead letter's first seven columns, id to last error: all a history row keeps of it
    /// (no priority, key or headers: see `HistoryEntry`).
    fn head(row: &impl sealed::Columns) -> Result<Self, sqlx::Error> {
        Ok(DeadRow {
            id: row.int(0)?,
            group: row.text(1)?,
            payload: row.bytes(2)?,
            attempts: row.int(3)?,
            created_at: row.int(4)?,
            failed_at: row.int(5)?,
            last_error: row.opt_text(6)?,
            priority: 0,
            key: None,
            headers: None,
        })
    }
}

impl sealed::Decoded for DeadRow {
    type With = ();

    fn decode(row: &impl sealed::Columns, (): ()) -> Result<Self, sqlx::Error> {
        Ok(DeadRow {
            priority: row.int(7)?,
            key: row.opt_text(8)?,
            headers: row.opt_text(9)?,
            ..DeadRow::head(row)?
        })
    }
}

impl sealed::Decoded for HistoryRow {
    type With = ();

    /// The dead letter's first seven columns, then the outcome.
    fn decode(row: &impl sealed::Columns, (): ()) -> Result<Self, sqlx::Error> {
        Ok(HistoryRow { row: DeadRow::head(row)?, outcome: row.text(7)? })
    }
}

impl sealed::Decoded for QueuedRow {
    type With = ();

    fn decode(row: &impl sealed::Columns, (): ()) -> Result<Self, sqlx::Error> {
        Ok(QueuedRow {
            id: row.int(0)?,
            group: row.text(1)?,
            payload: row.bytes(2)?,
            attempts: row.int(3)?,
            created_at: row.int(4)?,
            visible_age: row.int(5)?,
            lease_age: row.opt_int(6)?,
            priority: row.int(7)?,
            key: row.opt_text(8)?,
            last_error: row.opt_text(9)?,
            headers: row.opt_text(10)?,
        })
    }
}

/// A notify-table row whose ids are signed (`BIGINT`, SQLite's `INTEGER`), as the core
/// takes it.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn notify_row<R>(r: &R) -> Result<notify_table::Row, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(notify_table::Row {
        id: signed_id(r)?,
        channel: r.try_get(1)?,
        payload: r.try_get(2)?,
        pid: u64::try_from(r.try_get::<i64, _>(3)?).unwrap_or_default(),
        cutoff: r.try_get(4)?,
        at: r.try_get(5)?,
    })
}

/// A signed id in the first column, as the core takes ids.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn signed_id<R>(r: &R) -> Result<u64, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(u64::try_from(r.try_get::<i64, _>(0)?).unwrap_or_default())
}

/// Implements [`sealed::Driver`] for one sqlx database. With `unnamed` (an expression,
/// read on each statement), statements are not named on the server and one made outside
/// a transaction runs in one of its own: what PostgreSQL through PgBouncer in transaction
/// pooling mode needs (see `postgres::unnamed`). sqlx prepares a statement and binds it
/// after separate syncs, and the pooler may hand each sync's transaction another server
/// connection unless a transaction holds it.
macro_rules! driver {
    ($db:ty) => {
        $crate::driver::driver!($db, false);
    };
    ($db:ty, $unnamed:expr) => {
        /// Runs `$query` with `$run` on `$conn`, in a transaction of its own when
        /// statements are unnamed and `$conn` is in none.
        macro_rules! run_alone {
            ($conn:ident, $unnamed_now:ident, |$c:ident| $run:expr) => {{
                if $unnamed_now && !sqlx::Connection::is_in_transaction(&*$conn) {
                    let mut tx = sqlx::Connection::begin(&mut *$conn).await?;
                    let result = {
                        let $c = &mut *tx;
                        $run
                    };
                    match result {
                        Ok(done) => {
                            tx.commit().await?;
                            done
                        }
                        Err(e) => {
                            let _ = tx.rollback().await;
                            return Err(e);
                        }
                    }
                } else {
                    let $c = $conn;
                    $run?
                }
            }};
        }

        impl $crate::driver::sealed::Driver for $db {
            fn statement(
                stmt: &notify_table::Statement,
            ) -> sqlx::query::Query<'static, Self, Self::Arguments> {
                $crate::driver::query(&stmt.sql, &$crate::driver::args_of(stmt), !$unnamed)
            }

            fn execute<'c>(
                conn: &'c mut Self::Connection,
                sql: &std::sync::Arc<str>,
                args: &[$crate::driver::Arg<'_>],
            ) -> futures::future::BoxFuture<'c, Result<u64, sqlx::Error>> {
                let unnamed = $unnamed;
                let query = $crate::driver::query::<$db>(sql, args, !unnamed);
                Box::pin(async move {
                    let done = run_alone!(conn, unnamed, |c| query.execute(c).await);
                    Ok(done.rows_affected())
                })
            }

            fn simple<'c>(
                conn: &'c mut Self::Connection,
                sql: &'static str,
            ) -> futures::future::BoxFuture<'c, Result<(), sqlx::Error>> {
                Box::pin(async move { sqlx::raw_sql(sql).execute(conn).await.map(drop) })
            }

            fn fetch<'c, T: $crate::driver::sealed::Decoded>(
                conn: &'c mut Self::Connection,
                sql: &std::sync::Arc<str>,
                args: &[$crate::driver::Arg<'_>],
                with: T::With,
            ) -> futures::future::BoxFuture<'c, Result<Vec<T>, sqlx::Error>> {
                let unnamed = $unnamed;
                let query = $crate::driver::query::<$db>(sql, args, !unnamed);
                Box::pin(async move {
                    let rows = run_alone!(conn, unnamed, |c| query.fetch_all(c).await);
                    rows.iter().map(|row| T::decode(row, with)).collect()
                })
            }
        }
    };
}
pub(crate) use driver;

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

/// `sql` with its binds; a `persistent` statement is named and kept on the connection
/// (sqlx's default), another is the server's unnamed one, parsed again each time.
pub(crate) fn query<DB>(
    sql: &Arc<str>,
    args: &[Arg<'_>],
    persistent: bool,
) -> Query<'static, DB, DB::Arguments>
where
    DB: Database + sqlx::database::HasStatementCache,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB>,
{
    let mut query = sqlx::query(AssertSqlSafe(sql.clone())).persistent(persistent);
    for arg in args {
        query = match *arg {
            Arg::Text(text) => query.bind(text),
            Arg::Int(int) => query.bind(int),
            Arg::Bytes(bytes) => query.bind(bytes),
            Arg::Null => query.bind(None::<&str>),
        };
    }
    query
}
