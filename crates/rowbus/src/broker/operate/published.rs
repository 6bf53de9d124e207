//! How many messages a queue has ever had published to it, read from the sequence its ids
//! come from: with two samples of it and of the depth, a dashboard tells throughput
//! without the database counting handled messages.

use std::sync::Arc;

use crate::broker::Queue;
use crate::broker::exec::queue_error;
use crate::driver::Arg;
use crate::error::Error;
use crate::sql::Db;

impl<DB: Db> Queue<DB> {
    /// The highest id the queue table has handed out (0 before its first message): how
    /// many messages were ever published to it, counting ids the database skipped and, on
    /// PostgreSQL and MySQL/MariaDB, the ids of publishes rolled back (SQLite hands those
    /// out again). It only grows: acknowledging, dead-lettering or requeueing a dead
    /// letter (which keeps its id) leaves it as it is. The difference between two readings
    /// is what was published in between.
    ///
    /// Read from the id sequence (PostgreSQL's identity sequence, MySQL/MariaDB's
    /// `AUTO_INCREMENT`, SQLite's `sqlite_sequence`). On PostgreSQL the role needs SELECT
    /// or USAGE on that sequence; on MySQL 8 it sets the session's
    /// `information_schema_stats_expiry` to 0, without which the server answers from a
    /// cache up to a day old. [`Error::MissingQueueTable`] when the table does not exist.
    pub async fn published_total(&self) -> Result<u64, Error> {
        let (sql, binds) = DB::published_total_sql(self.table());
        let mut conn = self.inner().pool.acquire().await?;
        if let Some(fresh) = DB::PUBLISHED_TOTAL_FRESH {
            // Refused by a server without the cache (MariaDB), which needs nothing.
            let _ = DB::execute(&mut conn, &Arc::from(fresh), &[]).await;
        }
        let args: Vec<Arg<'_>> = binds.iter().map(|b| Arg::Text(b)).collect();
        let rows =
            DB::fetch_rows(&mut conn, &Arc::from(sql), &args, 0).await.map_err(|e| queue_error(self, e))?;
        match rows.first() {
            Some(row) => Ok(u64::try_from(row.int(0)).unwrap_or(0)),
            None => Err(Error::MissingQueueTable { table: self.table().to_string() }),
        }
    }
}
