//! Counters a user can read.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a broker has done since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages published through the broker.
    pub published: u64,
    /// Messages claimed by its subscriptions.
    pub claimed: u64,
    /// Claims that ran (`claimed / claims` is the mean claim size).
    pub claims: u64,
    /// Messages acknowledged (deleted).
    pub acked: u64,
    /// Failed attempts scheduled to run again.
    pub retried: u64,
    /// Messages moved to a dead-letter table.
    pub dead_lettered: u64,
    /// Messages a handler dropped.
    pub dropped: u64,
    /// Claimed messages given back unstarted (at shutdown).
    pub released: u64,
    /// Subscriptions woken (by publishes, notifications or a reconnect).
    pub wakeups: u64,
    /// Claims that failed.
    pub claim_errors: u64,
    /// Acks or retries refused because the lease had run out.
    pub leases_lost: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub published: AtomicU64,
    pub claimed: AtomicU64,
    pub claims: AtomicU64,
    pub acked: AtomicU64,
    pub retried: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub dropped: AtomicU64,
    pub released: AtomicU64,
    pub wakeups: AtomicU64,
    pub claim_errors: AtomicU64,
    pub leases_lost: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            published: get(&self.published),
            claimed: get(&self.claimed),
            claims: get(&self.claims),
            acked: get(&self.acked),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            dropped: get(&self.dropped),
            released: get(&self.released),
            wakeups: get(&self.wakeups),
            claim_errors: get(&self.claim_errors),
            leases_lost: get(&self.leases_lost),
        }
    }
}
