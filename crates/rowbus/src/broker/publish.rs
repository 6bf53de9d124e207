//! Publishing: the INSERT of a batch of messages, and the wake-ups of subscriptions in
//! other processes that go with it.

use std::sync::Arc;

use notify_table::DurationRange;

use super::exec::{micros, queue_error};
use super::{Message, Queue, check_group};
use crate::db::{Arg, Db};
use crate::error::{Error, check_duration};

/// Most messages one INSERT carries (three binds each).
const INSERT_CHUNK: usize = 1000;

/// Refuses a batch with a group name rowbus refuses or a delay over
/// [`MAX_DURATION`](crate::MAX_DURATION), before any of it is sent.
pub(crate) fn check(messages: &[Message]) -> Result<(), Error> {
    for m in messages {
        check_group(&m.group)?;
        check_duration("delay", m.delay, DurationRange::Span)?;
    }
    Ok(())
}

/// Inserts `messages` on `conn`, [`INSERT_CHUNK`] a statement; how many.
pub(crate) async fn insert<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    messages: &[Message],
) -> Result<u64, Error> {
    let mut inserted = 0;
    for chunk in messages.chunks(INSERT_CHUNK) {
        let sql = Arc::from(queue.sql.insert(chunk.len()));
        let delays: Vec<i64> = chunk.iter().map(|m| micros(m.delay)).collect();
        let mut args = Vec::with_capacity(chunk.len() * 3);
        for (m, delay) in chunk.iter().zip(&delays) {
            args.extend([Arg::Text(&m.group), Arg::Bytes(&m.payload), Arg::Int(*delay)]);
        }
        inserted += DB::execute(conn, &sql, &args).await.map_err(|e| queue_error(queue, e))?;
    }
    queue.inner().counters.published(inserted);
    Ok(inserted)
}

/// With `listen_notify`, wakes the subscriptions of `groups` in other processes: a
/// notification per group on `conn`, outside a transaction. A failure is logged: the poll
/// interval still reaches the rows.
pub(crate) async fn wake_others<DB: Db>(queue: &Queue<DB>, conn: &mut DB::Connection, groups: &[String]) {
    if let Some(notifier) = &queue.inner().notifier {
        DB::wake(conn, notifier, queue.table().channel(), groups).await;
    }
}

/// [`wake_others`] inside a transaction: delivered when it commits (or sent at its commit
/// by [`Dialect::wake_at_commit`](crate::sql::Dialect::wake_at_commit)).
pub(crate) async fn wake_others_in_tx<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    groups: &[String],
) {
    if !DB::WAKES_AT_COMMIT {
        wake_others(queue, conn, groups).await;
    }
}

/// The distinct groups of `messages`.
pub(crate) fn groups_of(messages: &[Message]) -> Vec<String> {
    let mut groups: Vec<String> = messages.iter().map(|m| m.group.clone()).collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}
