//! Jepsen's total-queue check over a broker run: what was published against what the
//! consumers recorded, and why each duplicate happened.

use std::collections::{HashMap, HashSet};

use super::consumer::Settled;

/// What became of one publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    /// Attempted, no answer yet (none is left once the publishers are done).
    Pending,
    /// Returned Ok (a plain publish, or a broker transaction that committed).
    Acked,
    /// Published inside a broker transaction that rolled back: must never be delivered.
    RolledBack,
    /// Returned an error: may or may not have happened.
    Indeterminate,
}

/// One handled message, as a consumer recorded it before acknowledging it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivered {
    pub msg: i64,
    pub proc: i64,
    pub incarnation: i64,
    pub attempt: i64,
    /// Microseconds since the epoch, when the handler recorded it.
    pub at: i64,
}

/// The outcome each consumer journaled, by (proc, incarnation, msg, attempt).
pub(crate) type Journal = HashMap<(i64, i64, i64, i64), Settled>;

/// The counts of one broker run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QueueCounts {
    /// Publishes tried.
    pub attempted: u64,
    /// Publishes that returned Ok and were not rolled back.
    pub acknowledged: u64,
    /// Publishes inside transactions that rolled back.
    pub rolled_back: u64,
    /// Publishes that returned an error.
    pub indeterminate: u64,
    /// Distinct messages delivered.
    pub delivered: u64,
    /// Deliveries in all (a message delivered twice counts twice).
    pub deliveries: u64,
    /// Acknowledged but never delivered.
    pub lost: u64,
    /// Delivered but never acknowledged nor indeterminate: rolled back, or never published.
    pub unexpected: u64,
    /// Indeterminate publishes that were delivered (they happened after all).
    pub recovered: u64,
    /// Messages delivered more than once.
    pub duplicated: u64,
    /// Deliveries beyond the first, by what preceded them: a killed session...
    pub redelivered_after_session_kill: u64,
    /// ... a SIGKILLed consumer process ...
    pub redelivered_after_sigkill: u64,
    /// ... another failed acknowledgement (a lease that ran out, a busy database) ...
    pub redelivered_after_error: u64,
    /// ... or nothing that explains it (an acknowledged message that came back).
    pub redelivered_unexplained: u64,
}

/// Checks the deliveries against the publishes. `publishes[n]` is message `n`;
/// `killed` holds the (proc, incarnation) pairs that were SIGKILLed.
pub(crate) fn check(
    publishes: &[Publish],
    deliveries: &[Delivered],
    journal: &Journal,
    killed: &HashSet<(i64, i64)>,
) -> QueueCounts {
    let mut c = QueueCounts { attempted: publishes.len() as u64, ..QueueCounts::default() };
    for p in publishes {
        match p {
            Publish::Acked => c.acknowledged += 1,
            Publish::RolledBack => c.rolled_back += 1,
            Publish::Indeterminate | Publish::Pending => c.indeterminate += 1,
        }
    }
    let mut by_msg: HashMap<i64, Vec<&Delivered>> = HashMap::new();
    for d in deliveries {
        by_msg.entry(d.msg).or_default().push(d);
    }
    c.deliveries = deliveries.len() as u64;
    c.delivered = by_msg.len() as u64;
    for (n, p) in publishes.iter().enumerate() {
        if *p == Publish::Acked && !by_msg.contains_key(&(n as i64)) {
            c.lost += 1;
        }
    }
    for (msg, mut ds) in by_msg {
        let published = usize::try_from(msg).ok().and_then(|n| publishes.get(n));
        match published {
            Some(Publish::Acked) => {}
            Some(Publish::Indeterminate | Publish::Pending) => c.recovered += 1,
            Some(Publish::RolledBack) | None => c.unexpected += 1,
        }
        if ds.len() < 2 {
            continue;
        }
        c.duplicated += 1;
        ds.sort_by_key(|d| (d.at, d.attempt));
        for pair in ds.windows(2) {
            let before = pair[0];
            let key = (before.proc, before.incarnation, before.msg, before.attempt);
            match journal.get(&key) {
                Some(Settled::ConnectionLost) => c.redelivered_after_session_kill += 1,
                Some(Settled::LeaseLost | Settled::Failed) => c.redelivered_after_error += 1,
                Some(Settled::Acked) => c.redelivered_unexplained += 1,
                None if killed.contains(&(before.proc, before.incarnation)) => {
                    c.redelivered_after_sigkill += 1
                }
                None => c.redelivered_unexplained += 1,
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(msg: i64, proc: i64, incarnation: i64, attempt: i64, at: i64) -> Delivered {
        Delivered { msg, proc, incarnation, attempt, at }
    }

    #[test]
    fn total_queue_counts() {
        use Publish::*;
        let publishes = [Acked, Acked, RolledBack, Indeterminate, Acked, Acked, Acked, Indeterminate];
        let deliveries = [
            d(0, 0, 1, 1, 10),
            d(2, 0, 1, 1, 11), // rolled back, delivered: unexpected
            d(3, 1, 1, 1, 12), // indeterminate, delivered: recovered
            d(4, 0, 1, 1, 13),
            d(4, 1, 1, 2, 20), // after a SIGKILL of (0, 1)
            d(5, 1, 1, 1, 14),
            d(5, 0, 2, 2, 30), // after a lost connection
            d(6, 1, 1, 1, 15),
            d(6, 0, 2, 2, 31), // the first was acknowledged: unexplained
            d(9, 0, 2, 1, 16), // never published: unexpected
        ];
        let journal: Journal =
            [((1, 1, 5, 1), Settled::ConnectionLost), ((1, 1, 6, 1), Settled::Acked)].into_iter().collect();
        let killed = [(0, 1)].into_iter().collect();
        let c = check(&publishes, &deliveries, &journal, &killed);
        assert_eq!((c.attempted, c.acknowledged, c.rolled_back, c.indeterminate), (8, 5, 1, 2));
        assert_eq!((c.delivered, c.deliveries), (7, 10));
        assert_eq!(c.lost, 1, "message 1");
        assert_eq!((c.unexpected, c.recovered), (2, 1));
        assert_eq!(c.duplicated, 3);
        assert_eq!(
            (
                c.redelivered_after_sigkill,
                c.redelivered_after_session_kill,
                c.redelivered_after_error,
                c.redelivered_unexplained
            ),
            (1, 1, 0, 1)
        );
    }
}
