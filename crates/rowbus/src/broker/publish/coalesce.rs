//! Publishes that arrive together go out together: while one of a queue's autocommitted
//! publishes is on its way, the next ones wait, and when it comes back one statement takes
//! all of them (as many as one INSERT carries) as one multi-row INSERT.
//!
//! A small publish's cost is its statement and its commit, not its rows: eight publishers
//! each sending a one-row INSERT pay eight statements and eight commits for eight
//! messages, where one eight-row INSERT pays one. A lone publisher never waits (its
//! statement goes at once), so merging only happens when publishes overlap. Nothing about
//! a message changes: the merged rows are the same rows in one statement, in the order
//! the publishes arrived.
//!
//! Measured with `rowbus bench broker --only publish1,publish100` (8 publishers, 20,000
//! messages), against no merging, interleaved, four rounds: single publishes 1.6x-2.2x
//! (PostgreSQL), 1.4x-2.5x (MariaDB), 3.5x-4.7x (SQLite) with one statement in flight;
//! with two, 1.3x-1.9x, 1.2x-1.9x and 1.9x-3.6x; with eight (one per publisher) no faster
//! than without. Merged batches of 100 gained 2.5x-3.3x on SQLite (one writer: eight
//! statements take turns at its lock anyway) but lost up to half on PostgreSQL, whose
//! writers run side by side: there a publish of more than [`SHARED_AT_MOST`] messages goes
//! on its own.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::broker::{Message, Published};
use crate::error::Error;

/// How many statements of one queue's merged publishes are on the way at once.
pub(crate) const IN_FLIGHT: usize = 1;

/// The most messages a publish may have and still wait to share a statement, on a
/// database whose writers run side by side (on one with a single writer, any publish that
/// fits a statement does): larger batches gain little from sharing their commit and lose
/// the parallel writes.
pub(crate) const SHARED_AT_MOST: usize = 16;

/// A publish waiting for a statement to carry it.
struct Waiting {
    messages: Vec<Message>,
    /// Its messages' bytes, as [`Message::size`] counts them.
    bytes: u64,
    done: oneshot::Sender<Result<Published, Error>>,
}

/// One queue's publishes on their way: how many statements are in flight, and who waits.
#[derive(Default)]
pub(crate) struct Coalescer {
    state: Mutex<State>,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("Coalescer")
            .field("in_flight", &state.in_flight)
            .field("waiting", &state.waiting.len())
            .finish()
    }
}

#[derive(Default)]
struct State {
    in_flight: usize,
    waiting: VecDeque<Waiting>,
}

/// What a publish does next.
pub(crate) enum Entry {
    /// Send its own statement now; the slot it holds passes to the waiting publishes when
    /// it is dropped ([`Coalescer::next`]).
    Send(Vec<Message>),
    /// Wait for a statement that carries it.
    Wait(oneshot::Receiver<Result<Published, Error>>),
}

/// Publishes taken from the waiting line for one statement.
pub(crate) struct Merged {
    /// Every publish's messages, in order of arrival.
    pub messages: Vec<Message>,
    /// Each publish's share of `messages` (how many), and where its result goes.
    callers: Vec<(usize, oneshot::Sender<Result<Published, Error>>)>,
}

impl Merged {
    /// Tells each publish the statement's outcome: its own count when it stored, the
    /// error otherwise ([`Error::for_each`]).
    pub fn settle(self, outcome: Result<(), Error>) {
        match outcome {
            Ok(()) => {
                for (n, done) in self.callers {
                    let _ = done.send(Ok(Published { stored: n as u64, duplicates: Vec::new() }));
                }
            }
            Err(error) => {
                let errors = error.for_each(self.callers.len());
                for ((_, done), error) in self.callers.into_iter().zip(errors) {
                    let _ = done.send(Err(error));
                }
            }
        }
    }
}

impl Coalescer {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A publish of `messages` (`bytes` in all): sent at once while fewer than
    /// [`IN_FLIGHT`] statements are on the way, else queued for the next one.
    pub fn enter(&self, messages: Vec<Message>, bytes: u64) -> Entry {
        let mut state = self.lock();
        if state.in_flight < IN_FLIGHT {
            state.in_flight += 1;
            return Entry::Send(messages);
        }
        let (done, receiver) = oneshot::channel();
        state.waiting.push_back(Waiting { messages, bytes, done });
        Entry::Wait(receiver)
    }

    /// A statement came back: the publishes that waited meanwhile, as many as fit one
    /// statement of at most `rows` rows and `limit` bytes (always at least one), for the
    /// slot it held; `None` when nobody waits, and the slot is free again.
    pub fn next(&self, rows: usize, limit: u64) -> Option<Merged> {
        let mut state = self.lock();
        let mut merged = Merged { messages: Vec::new(), callers: Vec::new() };
        let mut bytes = 0;
        while let Some(first) = state.waiting.front() {
            let fits = merged.messages.len() + first.messages.len() <= rows && bytes + first.bytes <= limit;
            if !merged.callers.is_empty() && !fits {
                break;
            }
            let Some(waiting) = state.waiting.pop_front() else { break };
            bytes += waiting.bytes;
            merged.callers.push((waiting.messages.len(), waiting.done));
            merged.messages.extend(waiting.messages);
        }
        if merged.callers.is_empty() {
            state.in_flight -= 1;
            return None;
        }
        Some(merged)
    }

    /// Fails every waiting publish with `error` (no runtime is left to send them) and
    /// frees the slot.
    pub fn abandon(&self, error: impl Fn() -> Error) {
        let mut state = self.lock();
        state.in_flight -= 1;
        for waiting in state.waiting.drain(..) {
            let _ = waiting.done.send(Err(error()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(n: usize) -> Vec<Message> {
        (0..n).map(|i| Message::text(format!("m{i}"))).collect()
    }

    fn waits(entry: Entry) -> oneshot::Receiver<Result<Published, Error>> {
        match entry {
            Entry::Wait(receiver) => receiver,
            Entry::Send(_) => panic!("expected to wait"),
        }
    }

    #[test]
    fn publishes_go_at_once_until_the_slots_are_taken() {
        let c = Coalescer::default();
        for _ in 0..IN_FLIGHT {
            assert!(matches!(c.enter(messages(1), 2), Entry::Send(m) if m.len() == 1));
        }
        let _waiting = waits(c.enter(messages(1), 2));
        // Nobody else waits once that one is taken: the slot is free again.
        assert!(c.next(1000, u64::MAX).is_some());
        assert!(c.next(1000, u64::MAX).is_none());
        assert!(matches!(c.enter(messages(1), 2), Entry::Send(_)));
    }

    #[test]
    fn a_statement_takes_the_waiting_in_order_as_far_as_they_fit() {
        let c = Coalescer::default();
        for _ in 0..IN_FLIGHT {
            let _ = c.enter(messages(1), 2);
        }
        let mut receivers = Vec::new();
        for (n, bytes) in [(3, 10), (4, 10), (5, 10), (1, 10)] {
            receivers.push(waits(c.enter(messages(n), bytes)));
        }
        // 3 + 4 rows fit in 8; the third does not.
        let merged = c.next(8, u64::MAX).expect("publishes wait");
        assert_eq!(merged.messages.len(), 7);
        assert_eq!(
            merged.messages[3].payload, b"m0",
            "the second publish's first message follows the first's three"
        );
        merged.settle(Ok(()));
        assert_eq!(receivers[0].try_recv().unwrap().unwrap().stored, 3);
        assert_eq!(receivers[1].try_recv().unwrap().unwrap().stored, 4);
        // The byte limit: 5 rows of 10 bytes, then 1 of 10 would make 20 > 15.
        let merged = c.next(1000, 15).expect("two still wait");
        assert_eq!(merged.messages.len(), 5);
        drop(merged);
        // One larger than the limit still goes, alone.
        let merged = c.next(1000, 1).expect("one still waits");
        assert_eq!(merged.messages.len(), 1);
    }

    #[test]
    fn a_failed_statement_fails_each_publish_it_carried() {
        let c = Coalescer::default();
        for _ in 0..IN_FLIGHT {
            let _ = c.enter(messages(1), 2);
        }
        let mut first = waits(c.enter(messages(1), 2));
        let mut second = waits(c.enter(messages(2), 2));
        let merged = c.next(1000, u64::MAX).expect("two wait");
        merged.settle(Err(Error::MissingQueueTable { table: "jobs".into() }));
        for waiting in [&mut first, &mut second] {
            let got = waiting.try_recv().unwrap();
            assert!(matches!(&got, Err(Error::MissingQueueTable { table }) if table == "jobs"), "{got:?}");
        }
        // An error that is more than its description is shared.
        let mut third = waits(c.enter(messages(1), 2));
        let mut fourth = waits(c.enter(messages(1), 2));
        let merged = c.next(1000, u64::MAX).expect("two wait");
        merged.settle(Err(Error::Database(sqlx::Error::PoolTimedOut)));
        for waiting in [&mut third, &mut fourth] {
            let got = waiting.try_recv().unwrap();
            assert!(
                matches!(&got, Err(Error::Shared(e)) if matches!(**e, Error::Database(sqlx::Error::PoolTimedOut))),
                "{got:?}"
            );
        }
    }

    #[test]
    fn abandoning_fails_the_waiting_and_frees_the_slot() {
        let c = Coalescer::default();
        for _ in 0..IN_FLIGHT {
            let _ = c.enter(messages(1), 2);
        }
        let mut waiting = waits(c.enter(messages(1), 2));
        c.abandon(|| Error::ShuttingDown);
        assert!(matches!(waiting.try_recv().unwrap(), Err(Error::ShuttingDown)));
        assert!(matches!(c.enter(messages(1), 2), Entry::Send(_)));
    }
}
