//! Claims and settling: how a claim's transaction begins, each claim in its database's
//! shape, and the savepoint a transactional handler runs behind.

use futures::future::BoxFuture;

use super::{Floor, Limiting, Schema, TableSql, quoted};
use crate::driver::{Arg, ClaimedRow};
use crate::names::QueueTable;

/// The most acknowledgements one statement carries (a claim that carries them, on a
/// database whose claims do, has this many placeholders for them).
pub const ACK_BATCH: usize = 256;

/// How rows are claimed under a lease or locked for a transactional handler.
pub trait Claiming: Schema {
    /// A condition true for a row of the queue table (aliased `q` in the claim) that has
    /// no ordering key, or whose key has no earlier message in the table: ready, delayed,
    /// waiting for a retry or in flight, an earlier message holds its key's later ones.
    /// One probe of the key index per keyed candidate. A plain read, never a locking one
    /// (a claim's `SKIP LOCKED` must not skip the earlier row and so free its key).
    fn key_free(table: &QueueTable) -> String {
        format!(
            "(q.msg_key IS NULL OR NOT EXISTS (SELECT 1 FROM {} AS e WHERE e.msg_key = q.msg_key AND e.id < q.id))",
            quoted::<Self>(table, "")
        )
    }

    /// How a lease claim's transaction begins.
    const LEASE_CLAIM_BEGIN: &'static str;

    /// How a transactional handler's claim begins.
    const LOCKED_CLAIM_BEGIN: &'static str;

    /// How a transaction that writes begins ([`BrokerTx`](crate::BrokerTx), dead letters).
    const WRITE_BEGIN: &'static str = "BEGIN";

    /// The savepoint before a transactional handler's own statements.
    const HANDLER_SAVEPOINT: &'static str = "SAVEPOINT rowbus_handler";

    /// Whether a lease claim with nothing to acknowledge needs a transaction of its own
    /// (one statement is its own transaction where it both locks and marks the rows).
    const CLAIM_IN_TRANSACTION: bool = true;

    /// Whether a runner's acknowledgements ride on its next claim's transaction.
    const CLAIMS_CARRY_ACKS: bool = false;

    /// Whether the database runs one write transaction at a time (SQLite): a broker's
    /// transactional claims then wait for each other in the process, handed over the
    /// moment one commits, rather than in the database's busy handler, which retries
    /// after sleeps of up to 100 ms; and consecutive ones share a commit (see
    /// `broker::writer`). Publishes that fit one statement merge whatever their size.
    const ONE_WRITER: bool = false;

    /// The lease claim statement: binds group, limit, lease µs, token; a database whose
    /// claim has another shape (or binds a [`Floor`]) says so in [`claim`](Self::claim).
    fn claim_sql(table: &QueueTable) -> String;

    /// A transactional handler's claim: up to `limit` ready rows, locked and deleted
    /// (the transaction's commit acknowledges them). Binds: group, limit (and a floor
    /// where [`take_locked`](Self::take_locked) binds one).
    fn claim_locked_sql(table: &QueueTable) -> String;

    /// Claims up to `limit` rows of `group` under lease `token` on `conn`, from `floor`
    /// where the database's claims start at one ([`Rotating`](super::Rotating)).
    #[allow(clippy::too_many_arguments)]
    fn claim<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        group: &'c str,
        limit: i64,
        lease: i64,
        token: i64,
        floor: Floor,
    ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
        let _ = floor;
        let args = [Arg::Text(group), Arg::Int(limit), Arg::Int(lease), Arg::Int(token)];
        Self::fetch_claimed(conn, &sql.claim, &args)
    }

    /// The lease claim statement of a limited group: [`claim_sql`](Self::claim_sql)
    /// without the [`Limiting::not_limited`] check, and with `per_key` messages
    /// of a key at once where that is more than one.
    fn limited_claim_sql(table: &QueueTable, per_key: i64) -> String
    where
        Self: Limiting,
    {
        // Every occurrence: a claim read in parts carries the checks in each.
        let claim = Self::claim_sql(table);
        let unchecked = claim.replace(&Self::not_limited_in_claim(table), "1 = 1");
        debug_assert_ne!(claim, unchecked, "the claim carries the limits check");
        if per_key > 1 {
            unchecked.replace(&Self::key_free(table), &Self::key_within(table, per_key))
        } else {
            unchecked
        }
    }

    /// Claims up to `limit` rows of `group` under lease `token` with `claim`, a
    /// [`Limiting::limited_claim_sql`](super::Limiting::limited_claim_sql) of `per_key`, in the caller's
    /// transaction: as [`claim`](Self::claim) does with the plain claim.
    #[allow(clippy::too_many_arguments)]
    fn claim_limited<'c>(
        conn: &'c mut Self::Connection,
        _sql: &'c TableSql<Self>,
        claim: &'c std::sync::Arc<str>,
        _per_key: i64,
        group: &'c str,
        limit: i64,
        lease: i64,
        token: i64,
        floor: Floor,
    ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
        let _ = floor;
        let args = [Arg::Text(group), Arg::Int(limit), Arg::Int(lease), Arg::Int(token)];
        Self::fetch_claimed(conn, claim, &args)
    }

    /// A claim of this process failed by a deadlock or a certification conflict (and is
    /// tried again): another consumer took the same rows. MariaDB on a Galera cluster
    /// keeps its claims to the node's own lane for a while; other databases do nothing.
    fn claim_conflicted() {}

    /// Takes up to `limit` ready rows of `group` in the caller's transaction, locked and
    /// deleted, then (when it took some) sets [`HANDLER_SAVEPOINT`](Self::HANDLER_SAVEPOINT)
    /// for the handler that gets them.
    fn take_locked<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        group: &'c str,
        limit: i64,
        floor: Floor,
    ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
        let _ = floor;
        Box::pin(async move {
            let rows =
                Self::fetch_claimed(conn, &sql.claim_locked, &[Arg::Text(group), Arg::Int(limit)]).await?;
            if !rows.is_empty() {
                Self::simple(conn, Self::HANDLER_SAVEPOINT).await?;
            }
            Ok(rows)
        })
    }
}
