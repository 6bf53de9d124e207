//! Counters a user can read.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a broker has done since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Messages published through the broker.
    pub published: u64,
    /// INSERT statements that carried them (`published / publishes` is the mean messages
    /// per statement: a batch shares one, and so do publishes made at the same moment).
    pub publishes: u64,
    /// Messages claimed by its subscriptions.
    pub claimed: u64,
    /// Claims that ran (`claimed / claims` is the mean claim size).
    pub claims: u64,
    /// Messages published to a runner of this broker that was waiting for work: stored
    /// already leased to it and handed over without a claim. Counted in `published`,
    /// `publishes` and `claimed` too, not in `claims`.
    pub handed_off: u64,
    /// Messages acknowledged (deleted).
    pub acked: u64,
    /// Failed attempts scheduled to run again.
    pub retried: u64,
    /// Messages moved to a dead-letter table.
    pub dead_lettered: u64,
    /// Dead-letter moves that failed (the dead-letter table missing, say): each message
    /// stayed in its queue, to run again after its retry delay
    /// ([`Error::DeadLetterFailed`](crate::Error::DeadLetterFailed)). Not among
    /// `dead_lettered`.
    pub dead_letter_failures: u64,
    /// Messages a handler dropped.
    pub dropped: u64,
    /// Claimed messages given back unstarted (at shutdown).
    pub released: u64,
    /// Messages whose handler was still running at the shutdown deadline: aborted and
    /// given back at once (the attempt not counted).
    pub abandoned: u64,
    /// Messages a handler snoozed: put back to run after a delay, the attempt not counted
    /// ([`Outcome::Snooze`](crate::Outcome::Snooze)).
    pub snoozed: u64,
    /// Subscriptions woken (by publishes, notifications or a reconnect).
    pub wakeups: u64,
    /// Claims that failed.
    pub claim_errors: u64,
    /// Acks or retries refused because the lease had run out.
    pub leases_lost: u64,
    /// Statements (a claim, an acknowledgement...) tried again at once after a deadlock,
    /// a serialization failure or, on a Galera cluster, a certification conflict with
    /// another node. None of them is a failed claim.
    pub conflicts: u64,
    /// Passes of the cleanup of kept history ([`Queue::deploy_keeping`](crate::broker::Queue::deploy_keeping))
    /// this broker ran, each deleting what had expired (failed ones too).
    pub history_cleanups: u64,
    /// History rows those passes deleted.
    pub history_pruned: u64,
    /// Messages this broker cancelled ([`Queue::cancel`](crate::broker::Queue::cancel)).
    pub cancelled: u64,
    /// Handlers of this broker's runners that ran past their timeout.
    pub timed_out: u64,
    /// Partitions of queue tables this broker emptied with `TRUNCATE` (PostgreSQL: see
    /// the queue table's layout in docs/claims-and-leases.md).
    pub partitions_retired: u64,
    /// Messages those retirings moved to the partition publishes filled then (in flight,
    /// delayed or waiting for a retry; each keeps its id, lease and attempts).
    pub partition_moves: u64,
    /// Checkpoints of SQLite's WAL this broker ran (a passive one a second while it
    /// claims; SQLite runs its own too).
    pub checkpoints: u64,
    /// Those a reader's transaction held elsewhere stopped short of the WAL's end: while
    /// it is held the WAL cannot start over and grows (see docs/performance.md).
    pub checkpoints_held: u64,
}

/// A claim that failed, as [`Broker::claim_failures`](crate::broker::Broker::claim_failures)
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimFailure {
    /// The queue table.
    pub table: String,
    /// The error and its causes, on one line.
    pub error: String,
    /// Whether claiming again cannot help (see [`Error::is_permanent`](crate::Error::is_permanent)).
    pub permanent: bool,
}

/// The broker's counters, each changed only through the method named for what happened.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    published: AtomicU64,
    publishes: AtomicU64,
    claimed: AtomicU64,
    claims: AtomicU64,
    handed_off: AtomicU64,
    acked: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    dead_letter_failures: AtomicU64,
    dropped: AtomicU64,
    released: AtomicU64,
    abandoned: AtomicU64,
    snoozed: AtomicU64,
    claim_errors: AtomicU64,
    leases_lost: AtomicU64,
    cancelled: AtomicU64,
    timed_out: AtomicU64,
    conflicts: AtomicU64,
    history_cleanups: AtomicU64,
    history_pruned: AtomicU64,
    partitions_retired: AtomicU64,
    partition_moves: AtomicU64,
    checkpoints: AtomicU64,
    checkpoints_held: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// `statements` INSERTs that stored `n` messages.
    pub fn published(&self, n: u64, statements: u64) {
        add(&self.published, n);
        add(&self.publishes, statements);
    }

    /// A claim that took `rows` messages.
    pub fn claimed(&self, rows: usize) {
        add(&self.claimed, rows as u64);
        add(&self.claims, 1);
    }

    /// A message stored leased to an idle runner and handed to it: published by one
    /// statement and claimed by none.
    pub fn handed_off(&self) {
        add(&self.published, 1);
        add(&self.publishes, 1);
        add(&self.claimed, 1);
        add(&self.handed_off, 1);
    }

    pub fn claim_failed(&self) {
        add(&self.claim_errors, 1);
    }

    /// `done` of `sent` acknowledgements deleted their message; the rest had lost their
    /// lease.
    pub fn acknowledged(&self, sent: usize, done: u64) {
        add(&self.acked, done);
        add(&self.leases_lost, (sent as u64).saturating_sub(done));
    }

    pub fn retried(&self, n: u64) {
        add(&self.retried, n);
    }

    pub fn dead_lettered(&self, n: u64) {
        add(&self.dead_lettered, n);
    }

    /// `n` messages whose move to the dead-letter table failed.
    pub fn dead_letter_failed(&self, n: u64) {
        add(&self.dead_letter_failures, n);
    }

    pub fn dropped(&self, n: u64) {
        add(&self.dropped, n);
    }

    pub fn released(&self, n: u64) {
        add(&self.released, n);
    }

    pub fn abandoned(&self, n: u64) {
        add(&self.abandoned, n);
    }

    pub fn snoozed(&self, n: u64) {
        add(&self.snoozed, n);
    }

    /// A statement tried again after a deadlock or a certification conflict.
    pub fn conflict(&self) {
        add(&self.conflicts, 1);
    }

    /// A pass of the history cleanup ended, having deleted `rows`.
    pub fn history_cleaned(&self, rows: u64) {
        add(&self.history_pruned, rows);
        add(&self.history_cleanups, 1);
    }

    pub fn cancelled(&self, n: u64) {
        add(&self.cancelled, n);
    }

    /// A partition emptied, `moved` messages moved out of it first.
    pub fn retired(&self, moved: i64) {
        add(&self.partitions_retired, 1);
        add(&self.partition_moves, u64::try_from(moved).unwrap_or(0));
    }

    /// A checkpoint of the WAL ran; `held`: a reader stopped it short of the end.
    pub fn checkpointed(&self, held: bool) {
        add(&self.checkpoints, 1);
        add(&self.checkpoints_held, u64::from(held));
    }

    pub fn timed_out(&self, n: u64) {
        add(&self.timed_out, n);
    }

    pub fn leases_lost(&self, n: u64) {
        add(&self.leases_lost, n);
    }

    /// A transactional batch of `n` messages whose handler failed: `dead` of them
    /// dead-lettered, the rest to run again.
    pub fn failed_batch(&self, n: u64, dead: u64) {
        add(&self.dead_lettered, dead);
        add(&self.retried, n - dead);
    }

    /// What they say now, with the wake-ups counted elsewhere.
    pub fn snapshot(&self, wakeups: u64) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            published: get(&self.published),
            publishes: get(&self.publishes),
            claimed: get(&self.claimed),
            claims: get(&self.claims),
            handed_off: get(&self.handed_off),
            acked: get(&self.acked),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            dead_letter_failures: get(&self.dead_letter_failures),
            dropped: get(&self.dropped),
            released: get(&self.released),
            abandoned: get(&self.abandoned),
            snoozed: get(&self.snoozed),
            wakeups,
            claim_errors: get(&self.claim_errors),
            leases_lost: get(&self.leases_lost),
            cancelled: get(&self.cancelled),
            timed_out: get(&self.timed_out),
            conflicts: get(&self.conflicts),
            history_cleanups: get(&self.history_cleanups),
            history_pruned: get(&self.history_pruned),
            partitions_retired: get(&self.partitions_retired),
            partition_moves: get(&self.partition_moves),
            checkpoints: get(&self.checkpoints),
            checkpoints_held: get(&self.checkpoints_held),
        }
    }
}
