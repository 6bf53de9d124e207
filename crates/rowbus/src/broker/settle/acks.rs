//! Acknowledgements waiting for a commit. On SQLite a runner's next claim carries them in
//! its own transaction (one commit for both, and SQLite has one writer at a time); while
//! the runner waits instead of claiming, and on PostgreSQL and MySQL/MariaDB always, a
//! flusher sends them by themselves, as many a statement as have come in meanwhile. A
//! claim may be long in coming while the runner is busy (its workers go from one message
//! claimed ahead to the next without coming free): what waited [`CARRY_WAIT`] for one is
//! sent by itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::{Duration, Instant};
use tracing::warn;

use crate::broker::Queue;
use crate::broker::settle::lease;
use crate::sql::Db;

/// Longest an acknowledgement waits for a claim to carry it.
pub(crate) const CARRY_WAIT: Duration = Duration::from_millis(100);

/// The `(id, token)` pairs of handled messages not yet deleted.
#[derive(Debug)]
pub(crate) struct PendingAcks {
    state: Mutex<State>,
    flush: Notify,
    /// Whether claims carry them; if not, the flusher sends each as soon as it comes.
    carried: bool,
    /// Whether a limit applies to the runner's group: each acknowledgement sent then
    /// frees a slot, and wakes the runner ([`freed`](Self::freed)) should it wait for one.
    limited: AtomicBool,
    /// Wakes the runner.
    freed: Mutex<Option<Arc<Notify>>>,
}

#[derive(Debug, Default)]
struct State {
    pairs: Vec<(i64, i64)>,
    /// When the oldest of `pairs` came.
    since: Option<Instant>,
    /// The runner waits rather than claims: nothing would carry new acknowledgements.
    idle: bool,
    /// The runner has stopped claiming for good.
    closed: bool,
}

impl PendingAcks {
    /// Pending acknowledgements that claims carry (`carried`) or that go out at once.
    pub fn new(carried: bool) -> Self {
        PendingAcks {
            state: Mutex::new(State { idle: !carried, ..State::default() }),
            flush: Notify::new(),
            carried,
            limited: AtomicBool::new(false),
            freed: Mutex::default(),
        }
    }

    /// Whether a limit applies to the runner's group, and what wakes the runner when an
    /// acknowledgement sent by itself frees a slot.
    pub fn limited(&self, limited: bool, wake: &Arc<Notify>) {
        if limited && !self.limited.swap(true, Ordering::Relaxed) {
            *self.freed.lock().unwrap_or_else(|e| e.into_inner()) = Some(wake.clone());
        } else if !limited {
            self.limited.store(false, Ordering::Relaxed);
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds acknowledgements; the flusher sends them when no claim will.
    pub fn push(&self, pairs: impl IntoIterator<Item = (i64, i64)>) {
        let mut state = self.state();
        let was_empty = state.pairs.is_empty();
        state.pairs.extend(pairs);
        if was_empty && !state.pairs.is_empty() {
            state.since = Some(Instant::now());
            // The flusher's clock for them starts.
            self.flush.notify_one();
        } else if state.idle || state.closed {
            self.flush.notify_one();
        }
    }

    /// Everything pending, for a claim to carry (nothing when claims do not carry them).
    pub fn take(&self) -> Vec<(i64, i64)> {
        if !self.carried {
            return Vec::new();
        }
        let mut state = self.state();
        state.since = None;
        std::mem::take(&mut state.pairs)
    }

    /// The runner starts (`true`) or stops waiting; what is pending when it starts is
    /// flushed at once.
    pub fn idle(&self, idle: bool) {
        let mut state = self.state();
        state.idle = idle || !self.carried;
        if idle && !state.pairs.is_empty() {
            self.flush.notify_one();
        }
    }

    /// No claim will come again: the flusher sends everything from now on, then stops
    /// once [`flushed`](Self::flushed) sees nothing left.
    pub fn close(&self) {
        self.state().closed = true;
        self.flush.notify_one();
    }

    /// The next acknowledgements to flush by themselves; `None` once closed and empty.
    async fn flushable(&self) -> Option<Vec<(i64, i64)>> {
        loop {
            let flush = self.flush.notified();
            tokio::pin!(flush);
            flush.as_mut().enable();
            let deadline = {
                let mut state = self.state();
                let overdue = state.since.is_some_and(|since| since.elapsed() >= CARRY_WAIT);
                if (state.idle || state.closed || overdue) && !state.pairs.is_empty() {
                    state.since = None;
                    return Some(std::mem::take(&mut state.pairs));
                }
                if state.closed {
                    return None;
                }
                state.since.map(|since| since + CARRY_WAIT)
            };
            match deadline {
                Some(deadline) => {
                    tokio::select! {
                        () = &mut flush => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => flush.await,
            }
        }
    }

    /// Sends acknowledgements no claim carried, until closed and empty.
    pub async fn flushed<DB: Db>(&self, queue: Queue<DB>) {
        while let Some(pairs) = self.flushable().await {
            // A call per statement: a deadlock retried repeats only its own chunk, never
            // one that committed (which would count as lost leases).
            for chunk in pairs.chunks(crate::sql::ACK_BATCH) {
                if let Err(error) = lease::ack_pairs(&queue, chunk).await {
                    warn!(%error, table = %queue.table(), count = chunk.len(), "acknowledging failed; the messages come back when their leases run out");
                } else if self.limited.load(Ordering::Relaxed) {
                    let freed = self.freed.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    if let Some(wake) = freed {
                        wake.notify_one();
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_takes_what_is_pending() {
        let acks = PendingAcks::new(true);
        acks.push([(1, 10), (2, 10)]);
        acks.push([(3, 11)]);
        assert_eq!(acks.take(), vec![(1, 10), (2, 10), (3, 11)]);
        assert!(acks.take().is_empty());
    }

    #[tokio::test]
    async fn the_flusher_takes_only_while_idle_or_closed() {
        let acks = PendingAcks::new(true);
        acks.push([(1, 10)]);
        let early = tokio::time::timeout(std::time::Duration::from_millis(20), acks.flushable()).await;
        assert!(early.is_err(), "a claiming runner carries its acknowledgements");
        acks.idle(true);
        assert_eq!(acks.flushable().await, Some(vec![(1, 10)]));
        acks.idle(false);
        acks.push([(2, 10)]);
        acks.close();
        assert_eq!(acks.flushable().await, Some(vec![(2, 10)]));
        assert_eq!(acks.flushable().await, None);
    }

    #[tokio::test]
    async fn what_no_claim_carried_goes_after_the_carry_wait() {
        let acks = PendingAcks::new(true);
        acks.push([(1, 10)]);
        let started = Instant::now();
        let flushed = tokio::time::timeout(Duration::from_secs(10), acks.flushable()).await;
        assert_eq!(flushed, Ok(Some(vec![(1, 10)])));
        assert!(started.elapsed() >= CARRY_WAIT);
        // Taken by a claim before the wait ran out: the flusher has nothing to send.
        acks.push([(2, 10)]);
        assert_eq!(acks.take(), vec![(2, 10)]);
        let early = tokio::time::timeout(CARRY_WAIT * 2, acks.flushable()).await;
        assert!(early.is_err(), "nothing pending");
    }

    #[tokio::test]
    async fn uncarried_acknowledgements_go_at_once() {
        let acks = PendingAcks::new(false);
        acks.push([(1, 10)]);
        assert!(acks.take().is_empty());
        assert_eq!(acks.flushable().await, Some(vec![(1, 10)]));
    }
}
