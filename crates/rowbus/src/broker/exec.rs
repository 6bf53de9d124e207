//! Running a queue's statements: a deadlock or serialization failure tried again, and
//! errors that name the queue.

use std::future::Future;
use std::time::Duration;

use super::Queue;
use crate::db::Db;
use crate::error::{Error, is_missing_table, is_retryable};

/// Tries of a statement that deadlocked (MySQL/MariaDB take row locks in index order).
/// InnoDB detects a deadlock at once, so a try costs a round trip; with 4, eight
/// subscriptions taking 16- and 100-row transactional batches from one table still saw
/// a claim in a few hundred fail (and wait the failed-claim second).
pub(crate) const DEADLOCK_TRIES: usize = 10;

/// Runs `attempt` again while it fails by a deadlock or a serialization failure, up to
/// [`DEADLOCK_TRIES`] times; any other error, or the last, is named for the queue. Each
/// attempt must be a whole transaction (or one statement): what a failed one did is
/// undone by the database.
pub(crate) async fn retrying<DB, T, F, Fut>(queue: &Queue<DB>, mut attempt: F) -> Result<T, Error>
where
    DB: Db,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(e) if is_retryable(&e) && tries < DEADLOCK_TRIES => continue,
            Err(e) => return Err(queue_error(queue, e)),
        }
    }
}

/// A driver error, named for the queue when it says the table (or its pause table) is
/// missing.
pub(crate) fn queue_error<DB: Db>(queue: &Queue<DB>, e: sqlx::Error) -> Error {
    if super::pause::is_missing_pause_table(queue, &e) {
        Error::MissingPauseTable { table: queue.table().to_string() }
    } else if super::history::is_missing_history_table(queue, &e) {
        Error::MissingHistoryTable { table: queue.table().to_string() }
    } else if is_missing_table(&e) {
        Error::MissingQueueTable { table: queue.table().to_string() }
    } else {
        Error::Database(e)
    }
}

/// A duration as the microseconds a statement binds.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
