//! Running a queue's statements: a deadlock or serialization failure tried again, and
//! errors that name the queue.

use std::future::Future;
use std::time::Duration;

use crate::broker::Queue;
use crate::error::{Error, is_missing_column, is_missing_table, is_retryable};
use crate::sql::{Db, Finishing};
use crate::sql::{HISTORY_SUFFIX, KEEP_SUFFIX, PAUSE_SUFFIX};
use crate::sql::{LIMITS_FEATURE_COLUMNS, LIMITS_SUFFIX, STARTS_SUFFIX};

/// Tries of a statement that deadlocked (MySQL/MariaDB take row locks in index order) or
/// lost a Galera certification. InnoDB detects a deadlock at once, so a try costs a round
/// trip; with 4, eight subscriptions taking 16- and 100-row transactional batches from
/// one table still saw a claim in a few hundred fail (and wait the failed-claim second);
/// with 10, three Galera consumers on a loaded machine still saw one claim lose ten
/// certifications in a row.
pub(crate) const DEADLOCK_TRIES: usize = 20;

/// The longest pause before a try again: the first waits up to 1 ms, each later one up to
/// twice the one before, capped here. Two claims that collided and retried at the same
/// instant would collide again (on Galera both read the same first rows on their nodes);
/// a random part of a millisecond apart, one of them commits first and the other then
/// skips its rows. Twenty tries wait at most about a second in all (half on average): no
/// longer than the failed claim's pause they replace.
const MAX_JITTER: Duration = Duration::from_millis(64);

/// Runs `attempt` again while it fails by a deadlock, a serialization failure or a Galera
/// certification conflict (or a Galera node not ready yet), up to [`DEADLOCK_TRIES`]
/// times, after a short random pause; any other error, or the last, is named for the
/// queue. Each attempt must be a whole transaction (or one statement): what a failed one
/// did is undone by the database. The broker counts each try again
/// ([`Stats::conflicts`](crate::broker::Stats::conflicts)).
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
            Err(e) if is_retryable(&e) && tries < DEADLOCK_TRIES => {
                let inner = queue.inner();
                inner.counters.conflict();
                tokio::time::sleep(jitter(tries, inner.token().unsigned_abs())).await;
            }
            Err(e) => return Err(queue_error(queue, e)),
        }
    }
}

/// Runs `statements` to their end on a task of its own if its caller drops it first (a
/// `select!` that took another branch, a timeout): sqlx's MySQL driver does not recover a
/// connection whose statement was dropped while its answer was on the way, and the pool
/// never got such a connection back (see [`Finishing`]). For what a caller of the library
/// awaits: settlements, publishes, cancels.
pub(crate) async fn to_the_end<T: Send + 'static>(statements: impl Future<Output = T> + Send + 'static) -> T {
    Finishing::new(|_| statements).await
}

/// The pause before try `tries + 1`: a random part (from `random`) of 1 ms doubled per
/// try before, at most [`MAX_JITTER`].
fn jitter(tries: usize, random: u64) -> Duration {
    let ceiling = Duration::from_millis(1 << (tries - 1).min(16)).min(MAX_JITTER);
    let micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX).max(1);
    Duration::from_micros(random % micros)
}

/// A driver error, named for the queue when it says the table (or its pause table) is
/// missing.
pub(crate) fn queue_error<DB: Db>(queue: &Queue<DB>, e: sqlx::Error) -> Error {
    if is_missing_pause_table(queue, &e) {
        Error::MissingPauseTable { table: queue.table().to_string() }
    } else if is_missing_limits_table(queue, &e) {
        Error::MissingLimitsTable { table: queue.table().to_string() }
    } else if is_missing_history_table(queue, &e) {
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

/// Whether `e` says `queue`'s pause table is missing.
fn is_missing_pause_table<DB: Db>(queue: &Queue<DB>, e: &sqlx::Error) -> bool {
    let name = format!("{}{}", queue.table().name(), PAUSE_SUFFIX);
    is_missing_table(e) && matches!(e, sqlx::Error::Database(db) if db.message().contains(&name))
}

/// Whether `e` says the queue's limits table or start log is missing.
fn is_missing_limits_table<DB: Db>(queue: &Queue<DB>, e: &sqlx::Error) -> bool {
    let name = queue.table().name();
    let (limits, starts) = (format!("{name}{LIMITS_SUFFIX}"), format!("{name}{STARTS_SUFFIX}"));
    let names_them = |text: &str| text.contains(&limits) || text.contains(&starts);
    // A limits table made before bursts lacks the burst's columns, which no other table has.
    let names_new_column = |text: &str| LIMITS_FEATURE_COLUMNS.iter().any(|column| text.contains(column));
    // (SQLite's insert says "has no column named".)
    let lacks_column = |text: &str| is_missing_column(e) || text.contains("has no column named");
    matches!(e, sqlx::Error::Database(db) if (is_missing_table(e) && names_them(db.message()))
        || (lacks_column(db.message()) && names_new_column(db.message())))
}

/// Whether `e` says the queue's history or keep table is missing.
fn is_missing_history_table<DB: Db>(queue: &Queue<DB>, e: &sqlx::Error) -> bool {
    let name = queue.table().name();
    let (history, keep) = (format!("{name}{HISTORY_SUFFIX}"), format!("{name}{KEEP_SUFFIX}"));
    is_missing_table(e)
        && matches!(e, sqlx::Error::Database(db) if db.message().contains(&history) || db.message().contains(&keep))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_under_a_ceiling_that_doubles_up_to_the_cap() {
        assert_eq!(jitter(1, 999), Duration::from_micros(999));
        assert_eq!(jitter(1, 1_000), Duration::ZERO);
        assert_eq!(jitter(2, 1_999), Duration::from_micros(1_999));
        assert_eq!(jitter(3, 3_999), Duration::from_micros(3_999));
        assert_eq!(jitter(9, u64::MAX), Duration::from_micros(u64::MAX % 64_000));
        for tries in 1..DEADLOCK_TRIES {
            for random in [0, 1, 12_345, u64::MAX / 3, u64::MAX] {
                assert!(jitter(tries, random) < MAX_JITTER);
            }
        }
        let total: Duration = (1..DEADLOCK_TRIES).map(|t| jitter(t, u64::MAX - 1)).sum();
        assert!(total < Duration::from_millis(1_100), "{total:?}");
    }
}
