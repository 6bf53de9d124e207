//! Hand-offs: a publish that finds a runner of this process idle stores its message
//! already leased to that runner and hands it over in memory, so the message starts
//! without a claim.
//!
//! A runner offers to take hand-offs beside its wake-up ([`Offer`], kept in the broker's
//! `Wakers`). It is idle for them ([`Taker::idle`]) while its last claim came back short:
//! no message it could take was ready then. A publish (`Wakers::reserve`) takes one of its
//! free workers first, so a message handed over always has a worker to start on; the
//! insert then checks, in the same statement, what a claim checks besides readiness
//! (the queue and group not paused, no limit on them), and leases the row only if they
//! hold. A message handed over that never starts (the runner stopped meanwhile) is given
//! back at once by the guard it carries ([`HandedOff`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::driver::ClaimedRow;

/// What gives a message handed over back to the queue when it is dropped unstarted.
pub(crate) type GiveBack = Box<dyn FnOnce() + Send>;

/// A message stored leased to a runner, with the worker reserved for it. Dropped
/// unstarted, it gives the message back.
pub(crate) struct HandedOff {
    message: Option<(ClaimedRow, i64, OwnedSemaphorePermit)>,
    give_back: Option<GiveBack>,
}

impl HandedOff {
    /// `row`, leased under `token`, for `worker`; `give_back` runs if it never starts.
    fn new(row: ClaimedRow, token: i64, worker: OwnedSemaphorePermit, give_back: GiveBack) -> Self {
        HandedOff { message: Some((row, token, worker)), give_back: Some(give_back) }
    }

    /// The message, its lease token and its worker, for a runner that starts it: the
    /// guard that would give it back is disarmed.
    pub fn start(mut self) -> (ClaimedRow, i64, OwnedSemaphorePermit) {
        self.give_back = None;
        self.message.take().expect("a hand-off starts once")
    }
}

impl Drop for HandedOff {
    fn drop(&mut self) {
        if let Some(give_back) = self.give_back.take() {
            give_back();
        }
    }
}

/// A runner's offer to take hand-offs, kept with its wake-up among the broker's
/// [`Wakers`](super::wake::Wakers) (see [`Registration::take_hand_offs`](super::wake::Registration::take_hand_offs)).
#[derive(Debug)]
pub(crate) struct Offer {
    state: Arc<State>,
    workers: Arc<Semaphore>,
    lease: Duration,
    tx: mpsc::UnboundedSender<HandedOff>,
}

/// What the runner says of itself, and publishes of it.
#[derive(Debug, Default)]
struct State {
    /// Its last claim came back short and it waits.
    idle: AtomicBool,
    /// A hand-off's insert found the queue or group paused or limited: none is tried
    /// again until a claim of the runner brings a message back.
    refused: AtomicBool,
}

impl Offer {
    /// The offer of a runner whose workers are `workers`, leasing for `lease`, and the
    /// runner's side of it.
    pub fn new(workers: Arc<Semaphore>, lease: Duration) -> (Offer, Taker) {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(State::default());
        (Offer { state: state.clone(), workers, lease, tx }, Taker { state, rx })
    }

    /// A free worker of the runner, if it is idle and has one.
    pub fn reserve(&self) -> Option<Reserved> {
        let ready = self.state.idle.load(Ordering::Acquire)
            && !self.state.refused.load(Ordering::Acquire)
            && !self.tx.is_closed();
        if !ready {
            return None;
        }
        let worker = self.workers.clone().try_acquire_owned().ok()?;
        Some(Reserved { worker, lease: self.lease, state: self.state.clone(), tx: self.tx.clone() })
    }
}

/// A free worker of an idle runner, taken for one message.
pub(crate) struct Reserved {
    pub worker: OwnedSemaphorePermit,
    /// The runner's lease.
    pub lease: Duration,
    state: Arc<State>,
    tx: mpsc::UnboundedSender<HandedOff>,
}

impl Reserved {
    /// Hands `row`, stored leased under `token`, to the runner with the reserved worker;
    /// `give_back` runs if it never starts (the runner is gone, or stops first).
    pub fn send(self, row: ClaimedRow, token: i64, give_back: GiveBack) {
        // A closed channel returns the message, whose drop gives it back.
        let _ = self.tx.send(HandedOff::new(row, token, self.worker, give_back));
    }

    /// The insert found the queue or group paused or limited: no hand-off to this runner
    /// until its claims bring messages again.
    pub fn refused(self) {
        self.state.refused.store(true, Ordering::Release);
    }
}

/// The runner's side of its [`Offer`]: what it receives. Dropped, it takes no more, and
/// what is on its way is given back.
pub(crate) struct Taker {
    state: Arc<State>,
    /// The messages handed over.
    pub rx: mpsc::UnboundedReceiver<HandedOff>,
}

impl Taker {
    /// Whether the runner waits after a short claim (and so takes hand-offs).
    pub fn idle(&self, idle: bool) {
        self.state.idle.store(idle, Ordering::Release);
    }

    /// A claim of the runner brought messages back: hand-offs refused before may go now.
    pub fn claimed(&self) {
        self.state.refused.store(false, Ordering::Release);
    }

    /// Takes no more hand-offs; those on their way are dropped (each given back).
    pub fn close(&mut self) {
        self.idle(false);
        self.rx.close();
        while self.rx.try_recv().is_ok() {}
    }
}

impl Drop for Taker {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::super::wake::Wakers;
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn row(id: i64) -> ClaimedRow {
        ClaimedRow {
            id,
            group: String::new(),
            payload: b"x".to_vec(),
            attempts: 1,
            created_at: 0,
            priority: 0,
            key: None,
            dedup_id: None,
            headers: None,
        }
    }

    fn counting(given_back: &Arc<AtomicUsize>) -> GiveBack {
        let given_back = given_back.clone();
        Box::new(move || {
            given_back.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[test]
    fn only_an_idle_runner_of_the_group_with_a_free_worker_is_reserved() {
        let wakers = Arc::new(Wakers::default());
        let table: Arc<str> = Arc::from("jobs");
        let workers = Arc::new(Semaphore::new(1));
        let registration = wakers.register(&table, "a");
        let taker = registration.take_hand_offs(workers.clone(), Duration::from_secs(30));
        assert!(wakers.reserve("jobs", "a").is_none(), "not idle yet");
        taker.idle(true);
        assert!(wakers.reserve("jobs", "b").is_none(), "another group");
        assert!(wakers.reserve("mail", "a").is_none(), "another table");
        let reserved = wakers.reserve("jobs", "a").expect("idle, one worker free");
        assert_eq!(reserved.lease, Duration::from_secs(30));
        assert!(wakers.reserve("jobs", "a").is_none(), "its one worker is reserved");
        reserved.refused();
        assert_eq!(workers.available_permits(), 1, "a refused reservation frees its worker");
        assert!(wakers.reserve("jobs", "a").is_none(), "refused until a claim brings messages");
        taker.claimed();
        assert!(wakers.reserve("jobs", "a").is_some());
        drop(registration);
        assert!(wakers.reserve("jobs", "a").is_none(), "gone with its runner");
    }

    #[tokio::test]
    async fn a_message_handed_over_starts_once_or_is_given_back() {
        let wakers = Arc::new(Wakers::default());
        let table: Arc<str> = Arc::from("jobs");
        let given_back = Arc::new(AtomicUsize::new(0));
        let workers = Arc::new(Semaphore::new(3));
        let registration = wakers.register(&table, "");
        let mut taker = registration.take_hand_offs(workers.clone(), Duration::from_secs(1));
        taker.idle(true);

        wakers.reserve("jobs", "").expect("free").send(row(1), 7, counting(&given_back));
        let (started, token, worker) = taker.rx.recv().await.expect("handed over").start();
        assert_eq!((started.id, token), (1, 7));
        assert_eq!(workers.available_permits(), 2, "its worker goes with it");
        drop(worker);
        assert_eq!(given_back.load(Ordering::SeqCst), 0, "started: nothing given back");

        // Handed over, then the runner stops before it starts it.
        wakers.reserve("jobs", "").expect("free").send(row(2), 8, counting(&given_back));
        taker.close();
        assert_eq!(given_back.load(Ordering::SeqCst), 1, "dropped unstarted at the runner's end");
        assert!(wakers.reserve("jobs", "").is_none(), "a closed runner takes none");

        // Reserved, then the runner is gone before the send.
        let taker = registration.take_hand_offs(workers.clone(), Duration::from_secs(1));
        taker.idle(true);
        let reserved = wakers.reserve("jobs", "").expect("free");
        drop(taker);
        reserved.send(row(3), 9, counting(&given_back));
        assert_eq!(given_back.load(Ordering::SeqCst), 2, "sent to a runner gone: given back");
        assert_eq!(workers.available_permits(), 3, "every worker back");
    }
}
