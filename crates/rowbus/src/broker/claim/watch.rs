//! A runner's look at the messages its handlers hold: at every poll interval (and when a
//! cancel wakes it) one statement finds which are gone (cancelled) and which lost their
//! lease, and tells their handlers; with heartbeats, one statement before it extends all
//! their leases every third of the lease. Nothing runs while no handler holds a message.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument as _, debug, info_span, warn};

use crate::broker::Queue;
use crate::broker::claim::wake::CONTROL_GROUP;
use crate::broker::exec::{micros, retrying};
use crate::broker::settle::control::StopReason;
use crate::broker::settle::delivery::Lease;
use crate::driver::Arg;
use crate::error::Error;
use crate::sql::Db;

/// Most messages one statement of a look takes (two binds each in a heartbeat, plus one).
const CHUNK: usize = 500;

/// The messages a runner's handlers hold now, for its look.
pub(in crate::broker) type Held<DB> = Arc<dyn Fn() -> Vec<Lease<DB>> + Send + Sync>;

/// A runner's look, running until dropped.
pub(in crate::broker) struct Watch(JoinHandle<()>);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts a runner's look at what `held` returns: every `poll` and at each cancel of the
/// queue; with `heartbeat` (the lease), the leases extended by it every third of it.
pub(in crate::broker) fn start<DB: Db>(
    queue: &Queue<DB>,
    poll: Duration,
    heartbeat: Option<Duration>,
    held: Held<DB>,
) -> Watch {
    let wake = queue.inner().wakers.register(queue.table().channel_arc(), CONTROL_GROUP);
    let beat_every = heartbeat.map(|lease| (lease / 3).max(Duration::from_millis(1)));
    let every = beat_every.map_or(poll, |beat| beat.min(poll));
    let queue = queue.clone();
    let span = info_span!("rowbus.watch", table = %queue.table());
    let task = tokio::spawn(
        async move {
            let mut next = Instant::now() + every;
            let mut next_beat = Instant::now() + beat_every.unwrap_or_default();
            loop {
                tokio::select! {
                    () = wake.notify.notified() => debug!("woken by a cancel"),
                    () = tokio::time::sleep_until(next) => next = Instant::now() + every,
                }
                let open: Vec<Lease<DB>> = held().into_iter().filter(|l| !l.is_settled()).collect();
                if open.is_empty() {
                    continue;
                }
                let beat = match (heartbeat, beat_every) {
                    (Some(lease), Some(beat)) if Instant::now() >= next_beat => {
                        next_beat = Instant::now() + beat;
                        Some(lease)
                    }
                    _ => None,
                };
                if let Err(error) = look(&queue, &open, beat).await {
                    warn!(%error, "looking at the messages in flight failed; the next look tries again");
                }
            }
        }
        .instrument(span),
    );
    Watch(task)
}

/// One look at `open`: their leases extended by `beat` first, if given; then each one
/// gone told it was cancelled, each one whose lease is another's or ran out told it
/// lost it.
async fn look<DB: Db>(queue: &Queue<DB>, open: &[Lease<DB>], beat: Option<Duration>) -> Result<(), Error> {
    let pool = &queue.inner().pool;
    for chunk in open.chunks(CHUNK) {
        let ids: Vec<Arg<'_>> = chunk.iter().map(|l| Arg::Int(l.id())).collect();
        if let Some(lease) = beat {
            let sql: Arc<str> = Arc::from(queue.sql.extend_pairs(chunk.len()));
            let pairs = chunk.iter().flat_map(|l| [Arg::Int(l.id()), Arg::Int(l.token())]);
            let args: Vec<Arg<'_>> =
                std::iter::once(Arg::Int(micros(lease))).chain(ids.iter().copied()).chain(pairs).collect();
            let (sql, args) = (&sql, &args);
            retrying(queue, || async move { DB::execute(&mut *pool.acquire().await?, sql, args).await })
                .await?;
        }
        let sql: Arc<str> = Arc::from(queue.sql.lease_check(chunk.len()));
        let (sql, args) = (&sql, &ids);
        let rows =
            retrying(
                queue,
                || async move { DB::fetch_rows(&mut *pool.acquire().await?, sql, args, 0).await },
            )
            .await?;
        let found: HashMap<i64, (Option<i64>, bool)> = rows
            .iter()
            .map(|row| (row.int(0), (row.ints.get(1).copied().flatten(), row.int(2) == 1)))
            .collect();
        for lease in chunk {
            // Settled meanwhile: its handler's own doing, not a cancel.
            if lease.is_settled() {
                continue;
            }
            match found.get(&lease.id()) {
                // Gone after its lease was lost: another consumer's doing, not a cancel.
                None if lease.control().is_lease_lost() => {}
                None => {
                    if lease.control().stop(StopReason::Cancelled) {
                        debug!(id = lease.id(), "cancelled: asking its handler to stop");
                    }
                }
                Some(&(token, live)) if token != Some(lease.token()) || !live => {
                    if !lease.control().is_lease_lost() {
                        debug!(id = lease.id(), "lease lost: telling its handler");
                        lease.control().lose_lease();
                    }
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}
