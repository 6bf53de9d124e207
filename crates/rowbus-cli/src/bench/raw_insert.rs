//! The publish baseline of `rowbus bench broker`: an INSERT loop written with sqlx alone,
//! no rowbus, on the raw claim loop's table (`(id auto-increment primary key, payload)`,
//! see [`raw_claim::create_sql`]). Each turn is one autocommitted multi-row INSERT of `k`
//! rows on a connection from the pool, as a publish of `k` messages is.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::try_join_all;
use rowbus::Backend;
use rowbus::sqlx::{AssertSqlSafe, Database, Encode, Executor, IntoArguments, Pool, Type};

use super::raw_claim;

/// Inserts `n` rows into `table` (made by [`raw_claim::create_sql`]), `k` a statement,
/// from `connections` concurrent loops; the rows inserted.
pub(crate) async fn publish<DB>(
    pool: &Pool<DB>,
    backend: Backend,
    table: &str,
    n: u64,
    k: u64,
    connections: usize,
    progress: &indicatif::ProgressBar,
) -> Result<u64, rowbus::sqlx::Error>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let k = k.max(1);
    let calls = n.div_ceil(k);
    let next = AtomicU64::new(0);
    // Built once: every statement but perhaps the last is a full one.
    let full: Arc<str> = Arc::from(raw_claim::insert_sql(backend, table, k as usize));
    let turns = (0..connections.max(1)).map(|_| async {
        let mut rows = 0;
        loop {
            let call = next.fetch_add(1, Ordering::Relaxed);
            if call >= calls {
                return Ok::<u64, rowbus::sqlx::Error>(rows);
            }
            let (from, to) = (call * k, ((call + 1) * k).min(n));
            let sql = match to - from == k {
                true => full.clone(),
                false => Arc::from(raw_claim::insert_sql(backend, table, (to - from) as usize)),
            };
            let mut query = rowbus::sqlx::query(AssertSqlSafe(sql));
            for i in from..to {
                query = query.bind(i as i64);
            }
            let mut conn = pool.acquire().await?;
            query.execute(&mut *conn).await?;
            rows += to - from;
            progress.inc(to - from);
        }
    });
    Ok(try_join_all(turns).await?.iter().sum())
}
