//! Publishing: storing messages, with a deduplication id or ordering keys, and what a
//! database keeps about keys beside the queue table.

use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::Pool;

use super::{Schema, TableSql};
use crate::driver::Arg;

/// How messages are stored, and what is kept about their keys and ids.
pub trait Publishing: Schema {
    /// The largest statement (with its binds) the database takes, in bytes, and the
    /// setting that says so; `Some` query when the server decides it at run time.
    const STATEMENT_LIMIT: (u64, &'static str);

    /// A query returning the server's statement size limit, where it is a setting.
    const STATEMENT_LIMIT_SQL: Option<&'static str> = None;

    /// Whether an `INSERT` can return what it stored (`RETURNING`).
    const RETURNS_INSERTED: bool = true;

    /// What a `SELECT` of constants only says where its `FROM` would be, to take a
    /// `WHERE`: nothing, or MySQL's ` FROM DUAL`.
    const FROM_NOTHING: &'static str = "";

    /// Runs a hand-off's insert ([`TableSql::hand_off`], binds `args`): the id and
    /// `created_at` µs of the message it stored, `None` when a pause or a limit held it.
    /// By default what its `RETURNING` returns.
    fn insert_handed<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        args: &'c [Arg<'c>],
    ) -> BoxFuture<'c, Result<Option<(i64, i64)>, sqlx::Error>> {
        Box::pin(async move {
            let rows = Self::fetch_rows(conn, &sql.hand_off, args, 0).await?;
            Ok(rows.first().and_then(|row| match row.ints[..] {
                [Some(id), Some(created_at), ..] => Some((id, created_at)),
                _ => None,
            }))
        })
    }

    /// A query returning, as a BIGINT, the id the connection's last INSERT of a queue row
    /// generated (asked only right after one that stored a message).
    const LAST_ID_SQL: &'static str;

    /// Stores one message with a deduplication id unless a message with that id is in the
    /// queue (ready, delayed or in flight); whether it stored it. Binds: those of
    /// [`TableSql::insert`], then the id. `alone`: no transaction is open on `conn` (else
    /// this runs in the caller's, and leaves it as it found it when it stores nothing). By
    /// default one `INSERT` that a partial unique index on the id refuses
    /// ([`TableSql::insert_dedup`]).
    fn insert_deduplicated<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        args: &'c [Arg<'c>],
        alone: bool,
    ) -> BoxFuture<'c, Result<bool, sqlx::Error>> {
        let _ = alone;
        Box::pin(async move { Ok(Self::execute(conn, &sql.insert_dedup, args).await? > 0) })
    }

    /// Runs `insert` (binds `args`), an INSERT of messages into the queue table; `keyed`:
    /// some of them have an ordering key. The rows it stored. By default the statement
    /// alone.
    fn insert_messages<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        insert: &'c Arc<str>,
        args: &'c [Arg<'c>],
        keyed: bool,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        let _ = (sql, keyed);
        Self::execute(conn, insert, args)
    }

    /// After keyed messages `ids` were settled (committed): what the dialect keeps about
    /// their keys goes, now or a little later, for those that left for good, on a
    /// connection of `pool`; those still in the queue or its dead letters keep it. A
    /// failure leaves the cleanup to later. By default nothing.
    fn keyed_gone<'c>(
        pool: &'c Pool<Self>,
        sql: &'c Arc<TableSql<Self>>,
        ids: &'c [i64],
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        let _ = (pool, sql, ids);
        Box::pin(async { Ok(()) })
    }

    /// In a requeue's transaction, after the dead letters `ids` were copied back into the
    /// queue table: what the dialect keeps about keys, for them too. By default nothing.
    fn requeued<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        ids: &'c [Arg<'c>],
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        let _ = (conn, sql, ids);
        Box::pin(async { Ok(()) })
    }
}
