//! A queue's event counters, kept in the database (`<table>_count`) so that every process
//! sees what the queue's consumers did: messages snoozed, cancelled, timed out, whose
//! lease was lost; and what relays to message brokers did: relayed, confirmed, resent,
//! refused. Written after the settle they follow, never failing it; read by
//! [`Queue::counts`].

use tracing::warn;

use crate::broker::Queue;
use crate::broker::exec::retrying;
use crate::driver::Arg;
use crate::error::{Error, is_missing_table};
use crate::sql::Db;

/// A kind of event a queue counts in its counts table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Counted {
    /// A message was cancelled (queued, delayed, retrying or running).
    Cancelled,
    /// A handler snoozed its message ([`Outcome::Snooze`](crate::Outcome::Snooze)).
    Snoozed,
    /// A handler ran past its timeout.
    TimedOut,
    /// A settle (acknowledgement, retry, drop...) was refused: the message's lease had run
    /// out, or it was cancelled, while its handler held it.
    LeaseLost,
    /// A relay handed a message to a message broker (each time it sent it).
    Relayed,
    /// The broker confirmed a relayed message, and the relay removed it from the queue.
    Confirmed,
    /// A relayed message goes to the broker again: the broker was unavailable or did not
    /// confirm it, or the relay that sent it before lost its lease (it died, say).
    Resent,
    /// The broker refused a relayed message for good; it went to the dead letters.
    Refused,
}

impl Counted {
    /// Every kind, in the order the figures show them.
    pub const ALL: [Counted; 8] = [
        Counted::Cancelled,
        Counted::Snoozed,
        Counted::TimedOut,
        Counted::LeaseLost,
        Counted::Relayed,
        Counted::Confirmed,
        Counted::Resent,
        Counted::Refused,
    ];

    /// What a queue's consumers do: cancelled, snoozed, timed out, lease lost.
    pub const CONSUMERS: [Counted; 4] =
        [Counted::Cancelled, Counted::Snoozed, Counted::TimedOut, Counted::LeaseLost];

    /// What relays to message brokers do: relayed, confirmed, resent, refused.
    pub const RELAY: [Counted; 4] = [Counted::Relayed, Counted::Confirmed, Counted::Resent, Counted::Refused];

    /// Its name in the counts table: `cancelled`, `snoozed`, `timed_out`, `lease_lost`,
    /// `relayed`, `confirmed`, `resent`, `refused`.
    pub fn as_str(self) -> &'static str {
        match self {
            Counted::Cancelled => "cancelled",
            Counted::Snoozed => "snoozed",
            Counted::TimedOut => "timed_out",
            Counted::LeaseLost => "lease_lost",
            Counted::Relayed => "relayed",
            Counted::Confirmed => "confirmed",
            Counted::Resent => "resent",
            Counted::Refused => "refused",
        }
    }
}

/// What a queue's consumers, in every process, did since the queue was deployed (or since
/// its counts table was added by a deploy), as [`Queue::counts`] reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueCounts {
    /// Messages cancelled while queued or running.
    pub cancelled: u64,
    /// Messages snoozed: put back for later, their attempt not counted.
    pub snoozed: u64,
    /// Handlers that ran past their timeout.
    pub timed_out: u64,
    /// Messages whose lease ran out while their handler held them.
    pub lease_lost: u64,
    /// Messages relays handed to a message broker (each send).
    pub relayed: u64,
    /// Relayed messages the broker confirmed, removed from the queue.
    pub confirmed: u64,
    /// Relayed messages to be sent again (the broker unavailable, a relay's lease lost).
    pub resent: u64,
    /// Relayed messages the broker refused for good, dead-lettered.
    pub refused: u64,
}

impl QueueCounts {
    /// The count of one kind of event.
    pub fn get(&self, kind: Counted) -> u64 {
        match kind {
            Counted::Cancelled => self.cancelled,
            Counted::Snoozed => self.snoozed,
            Counted::TimedOut => self.timed_out,
            Counted::LeaseLost => self.lease_lost,
            Counted::Relayed => self.relayed,
            Counted::Confirmed => self.confirmed,
            Counted::Resent => self.resent,
            Counted::Refused => self.refused,
        }
    }

    fn slot(&mut self, name: &str) -> Option<&mut u64> {
        Counted::ALL.into_iter().find(|k| k.as_str() == name).map(|kind| match kind {
            Counted::Cancelled => &mut self.cancelled,
            Counted::Snoozed => &mut self.snoozed,
            Counted::TimedOut => &mut self.timed_out,
            Counted::LeaseLost => &mut self.lease_lost,
            Counted::Relayed => &mut self.relayed,
            Counted::Confirmed => &mut self.confirmed,
            Counted::Resent => &mut self.resent,
            Counted::Refused => &mut self.refused,
        })
    }
}

/// Adds `n` to `queue`'s counter of `kind`, in one statement. Never fails: a failure (the
/// counts table missing on a queue deployed by an older rowbus, a role that may not write
/// it) is logged, and what it follows stands.
pub(crate) async fn count<DB: Db>(queue: &Queue<DB>, kind: Counted, n: u64) {
    if n == 0 {
        return;
    }
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    let (pool, sql) = (&queue.inner().pool, &queue.sql.counts.add);
    let args = [Arg::Text(kind.as_str()), Arg::Int(n)];
    let added =
        retrying(queue, || async move { DB::execute(&mut *pool.acquire().await?, sql, &args).await }).await;
    if let Err(error) = added {
        warn!(
            error = %error.one_line(), table = %queue.table(), counter = kind.as_str(), n,
            "counting failed (deploy the queue again to add its counts table); the message was settled"
        );
    }
}

impl<DB: Db> Queue<DB> {
    /// What the queue's consumers, in every process, did: messages snoozed, cancelled,
    /// timed out, whose lease was lost; and its relays to message brokers: messages
    /// relayed, confirmed, resent, refused; as its counts table (`<table>_count`) holds them.
    /// `None` when the queue has no counts table: deployed by an older rowbus, until
    /// [`deploy`](Self::deploy) runs again. A role that may not read the table gets the
    /// database's refusal ([`Error::is_permission_denied`]).
    pub async fn counts(&self) -> Result<Option<QueueCounts>, Error> {
        let mut conn = self.inner().pool.acquire().await?;
        let rows = match DB::fetch_rows(&mut conn, &self.sql.counts.list, &[], 1).await {
            Ok(rows) => rows,
            Err(e) if is_missing_table(&e) && self.is_deployed().await? => return Ok(None),
            Err(e) => return Err(crate::broker::exec::queue_error(self, e)),
        };
        let mut counts = QueueCounts::default();
        for row in rows {
            if let Some(slot) = counts.slot(row.text(0)) {
                *slot = u64::try_from(row.int(0)).unwrap_or(0);
            }
        }
        Ok(Some(counts))
    }
}
