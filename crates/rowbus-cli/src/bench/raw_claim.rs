//! The baseline of `rowbus bench broker`: a claim-and-delete loop written with sqlx alone,
//! no rowbus, on a queue table of the same kind. Each turn is one transaction:
//! `BEGIN; SELECT id ... ORDER BY id LIMIT k FOR UPDATE SKIP LOCKED; DELETE ... WHERE id IN
//! (...); COMMIT` (`BEGIN IMMEDIATE` and no `FOR UPDATE` on SQLite), retried on a deadlock.

use std::sync::Arc;

use futures::future::try_join_all;
use rowbus::Backend;
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

/// The claim: up to `k` ids, oldest first, locked (skipping rows other transactions hold).
pub(crate) fn claim_sql(backend: Backend, table: &str, k: usize) -> String {
    match backend {
        // One writer at a time: `BEGIN IMMEDIATE` is the lock.
        Backend::Sqlite => format!("SELECT id FROM {table} ORDER BY id LIMIT {k}"),
        _ => format!("SELECT id FROM {table} ORDER BY id LIMIT {k} FOR UPDATE SKIP LOCKED"),
    }
}

/// The delete of `n` claimed ids, bound as parameters.
pub(crate) fn delete_sql(backend: Backend, table: &str, n: usize) -> String {
    let params: Vec<String> = (1..=n)
        .map(|i| match backend {
            Backend::Postgres => format!("${i}"),
            _ => "?".to_owned(),
        })
        .collect();
    format!("DELETE FROM {table} WHERE id IN ({})", params.join(", "))
}

/// Whether a driver error is a deadlock or serialization failure (MySQL 1213, lock wait
/// timeout 1205, SQLSTATE 40001 or 40P01): the turn is tried again.
fn is_retryable(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else { return false };
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return matches!(my.number(), 1213 | 1205);
    }
    matches!(db.code().as_deref(), Some("40001" | "40P01"))
}

/// What the loops did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Drained {
    /// Rows deleted.
    pub(crate) rows: u64,
    /// Turns that deadlocked and were tried again.
    pub(crate) retries: u64,
}

/// Runs `connections` loops claiming `k` rows a turn until the table is empty.
pub(crate) async fn drain<DB>(
    pool: &Pool<DB>,
    backend: Backend,
    table: &str,
    k: usize,
    connections: usize,
    progress: &indicatif::ProgressBar,
) -> Result<Drained, sqlx::Error>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let claim: Arc<str> = Arc::from(claim_sql(backend, table, k));
    let full_delete: Arc<str> = Arc::from(delete_sql(backend, table, k));
    let loops = (0..connections.max(1)).map(|_| {
        let (claim, full_delete) = (claim.clone(), full_delete.clone());
        async move {
            let mut done = Drained::default();
            loop {
                let mut tx = match backend {
                    Backend::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await?,
                    _ => pool.begin().await?,
                };
                let rows = match sqlx::query(AssertSqlSafe(claim.clone())).fetch_all(&mut *tx).await {
                    Ok(rows) => rows,
                    Err(e) if is_retryable(&e) => {
                        done.retries += 1;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if rows.is_empty() {
                    tx.rollback().await?;
                    return Ok(done);
                }
                // Read unchecked: MySQL's id is BIGINT UNSIGNED, which sqlx won't hand to i64.
                let ids = rows
                    .iter()
                    .map(|row| row.try_get_unchecked::<i64, _>(0))
                    .collect::<Result<Vec<_>, _>>()?;
                let delete = if ids.len() == k {
                    full_delete.clone()
                } else {
                    Arc::from(delete_sql(backend, table, ids.len()))
                };
                let mut query = sqlx::query(AssertSqlSafe(delete));
                for id in &ids {
                    query = query.bind(*id);
                }
                let result = match query.execute(&mut *tx).await {
                    Ok(_) => tx.commit().await,
                    Err(e) => Err(e),
                };
                match result {
                    Ok(()) => {
                        done.rows += ids.len() as u64;
                        progress.inc(ids.len() as u64);
                    }
                    Err(e) if is_retryable(&e) => done.retries += 1,
                    Err(e) => return Err(e),
                }
            }
        }
    });
    let per_loop = try_join_all(loops).await?;
    Ok(per_loop.iter().fold(Drained::default(), |sum, d| Drained {
        rows: sum.rows + d.rows,
        retries: sum.retries + d.retries,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_lock_except_on_sqlite() {
        assert_eq!(
            claim_sql(Backend::Postgres, "t", 16),
            "SELECT id FROM t ORDER BY id LIMIT 16 FOR UPDATE SKIP LOCKED"
        );
        assert!(claim_sql(Backend::MySql, "t", 1).ends_with("LIMIT 1 FOR UPDATE SKIP LOCKED"));
        assert_eq!(claim_sql(Backend::Sqlite, "t", 100), "SELECT id FROM t ORDER BY id LIMIT 100");
    }

    #[test]
    fn deletes_bind_each_id() {
        assert_eq!(delete_sql(Backend::Postgres, "t", 3), "DELETE FROM t WHERE id IN ($1, $2, $3)");
        assert_eq!(delete_sql(Backend::MySql, "t", 2), "DELETE FROM t WHERE id IN (?, ?)");
        assert_eq!(delete_sql(Backend::Sqlite, "t", 1), "DELETE FROM t WHERE id IN (?)");
    }
}
