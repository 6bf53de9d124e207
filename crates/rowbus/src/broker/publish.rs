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

/// What a statement carries besides its messages' payloads and groups: its SQL and the
/// binds' headers.
const STATEMENT_OVERHEAD: u64 = 64 * 1024;
/// What one row of an INSERT adds besides its payload and group.
const ROW_OVERHEAD: u64 = 32;

/// The largest message (payload and group) one statement can carry on this database.
pub(crate) async fn message_limit<DB: Db>(queue: &Queue<DB>) -> Result<u64, Error> {
    let inner = queue.inner();
    let limit = inner
        .statement_limit
        .get_or_try_init(|| async {
            let Some(sql) = DB::STATEMENT_LIMIT_SQL else { return Ok(DB::STATEMENT_LIMIT.0) };
            let mut conn = inner.pool.acquire().await?;
            let rows = DB::fetch_rows(&mut conn, &Arc::from(sql), &[], 0).await?;
            Ok::<_, Error>(
                rows.first().map_or(DB::STATEMENT_LIMIT.0, |r| u64::try_from(r.int(0)).unwrap_or(0)),
            )
        })
        .await?;
    Ok(limit.saturating_sub(STATEMENT_OVERHEAD + ROW_OVERHEAD))
}

/// Refuses a batch with a group name rowbus refuses or a delay over
/// [`MAX_DURATION`](crate::MAX_DURATION), before any of it is sent.
fn check(messages: &[Message]) -> Result<(), Error> {
    for m in messages {
        check_group(&m.group)?;
        check_duration("delay", m.delay, DurationRange::Span)?;
    }
    Ok(())
}

/// Checks `messages` before anything is sent (groups, delays, sizes); the message limit.
pub(crate) async fn checked<DB: Db>(queue: &Queue<DB>, messages: &[Message]) -> Result<u64, Error> {
    check(messages)?;
    let limit = message_limit(queue).await?;
    if let Some(m) = messages.iter().find(|m| size(m) > limit) {
        let bytes = m.payload.len() + m.group.len();
        return Err(Error::MessageTooLarge { bytes, limit, setting: DB::STATEMENT_LIMIT.1 });
    }
    Ok(limit)
}

fn size(m: &Message) -> u64 {
    (m.payload.len() + m.group.len()) as u64
}

/// `messages` in runs that one INSERT each carries: at most [`INSERT_CHUNK`] rows whose
/// bytes stay within `limit`.
fn statements(messages: &[Message], limit: u64) -> impl Iterator<Item = &[Message]> {
    let mut rest = messages;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (mut rows, mut bytes) = (0, 0);
        while rows < rest.len().min(INSERT_CHUNK) {
            let next = size(&rest[rows]) + ROW_OVERHEAD;
            if rows > 0 && bytes + next > limit {
                break;
            }
            bytes += next;
            rows += 1;
        }
        let (run, after) = rest.split_at(rows);
        rest = after;
        Some(run)
    })
}

/// Inserts `messages` (checked, see [`checked`]) on `conn`, as few statements as
/// `limit` allows; how many.
pub(crate) async fn insert<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    messages: &[Message],
    limit: u64,
) -> Result<u64, Error> {
    let mut inserted = 0;
    for chunk in statements(messages, limit) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_stay_within_the_limit() {
        let m = |n: usize| Message::new(vec![0u8; n]);
        let sizes = |messages: &[Message], limit| {
            statements(messages, limit).map(<[Message]>::len).collect::<Vec<_>>()
        };
        assert_eq!(sizes(&[m(10), m(10), m(10)], 1000), vec![3]);
        // 100 + 32 per row: two fit in 300, the third goes alone.
        assert_eq!(sizes(&[m(100), m(100), m(100)], 300), vec![2, 1]);
        // One over the limit still goes (checked before), alone.
        assert_eq!(sizes(&[m(10), m(500), m(10)], 300), vec![1, 1, 1]);
        assert_eq!(sizes(&vec![m(0); 2500], u64::MAX), vec![1000, 1000, 500]);
        assert!(statements(&[], 10).next().is_none());
    }
}
