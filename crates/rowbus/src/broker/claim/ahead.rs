//! Claim-ahead for [`run`](crate::broker::SubscriptionBuilder::run): a claim takes, beyond a
//! message per free worker, what the runner's workers are expected to finish during one
//! claim's round trip, so that the claim latency stops bounding the rate when handlers
//! are quick. Those extra messages wait here; a worker that finishes its message takes
//! the next one from here before it counts as free.
//!
//! The bound: at most [`cap`](Ahead::new) messages wait (the worker count by default),
//! and only as many as the workers finish in a claim's latency at the rate measured, so a
//! message waits here about one claim's latency. With handlers slower than a claim,
//! nothing is claimed ahead: a claim takes a message per free worker, as without it.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Messages (`T`: a runner's deliveries) claimed ahead of the workers, and the two
/// latencies that size the claims.
pub(in crate::broker) struct Ahead<T> {
    state: Mutex<State<T>>,
    /// Most messages waiting here.
    cap: usize,
    /// A message that waited longer than this is given back rather than started: its
    /// lease is mostly spent.
    stale: Duration,
}

struct State<T> {
    waiting: VecDeque<(T, Instant)>,
    /// Handler time and claim latency, in microseconds, smoothed.
    handler: Option<f64>,
    claim: Option<f64>,
    /// Shutdown began: nothing more is handed out.
    closed: bool,
}

/// The weight of a new sample in a smoothed latency.
const SMOOTHING: f64 = 0.125;

fn smooth(old: Option<f64>, sample: Duration) -> Option<f64> {
    let sample = sample.as_secs_f64() * 1e6;
    Some(old.map_or(sample, |old| old + SMOOTHING * (sample - old)))
}

/// Messages a claim takes: at least one per free worker, and as many as `workers`
/// finish during one claim's latency (handlers of `handler` micros, claims of `claim`
/// micros), at most `cap` more than the free workers. Nothing ahead before both
/// latencies were measured once.
fn claim_size(free: usize, workers: usize, cap: usize, handler: Option<f64>, claim: Option<f64>) -> usize {
    let (Some(handler), Some(claim)) = (handler, claim) else { return free };
    // A handler quicker than a microsecond counts as one: the cap bounds the rest.
    // `as` saturates: a count too large for `usize` is capped like any other.
    let finished = (workers as f64 * claim / handler.max(1.0)).ceil() as usize;
    finished.clamp(free, free + cap)
}

impl<T> Ahead<T> {
    /// Up to `cap` messages waiting, each for less than `stale`.
    pub fn new(cap: usize, stale: Duration) -> Self {
        let state = State { waiting: VecDeque::new(), handler: None, claim: None, closed: false };
        Ahead { state: Mutex::new(state), cap, stale }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many messages to claim for `free` of `workers` workers.
    pub fn claim_size(&self, free: usize, workers: usize) -> usize {
        let state = self.state();
        claim_size(free, workers, self.cap, state.handler, state.claim)
    }

    /// A handler took `took`.
    pub fn handled(&self, took: Duration) {
        let mut state = self.state();
        state.handler = smooth(state.handler, took);
    }

    /// A claim's round trip took `took`.
    pub fn claimed(&self, took: Duration) {
        let mut state = self.state();
        state.claim = smooth(state.claim, took);
    }

    /// Keeps `deliveries` for the next workers to finish.
    pub fn keep(&self, deliveries: impl IntoIterator<Item = T>) {
        let now = Instant::now();
        self.state().waiting.extend(deliveries.into_iter().map(|d| (d, now)));
    }

    /// The next message for a worker, and the ones to give back because they waited too
    /// long; none once closed.
    #[must_use]
    pub fn next(&self) -> (Option<T>, Vec<T>) {
        let mut state = self.state();
        if state.closed {
            return (None, Vec::new());
        }
        let mut stale = Vec::new();
        while let Some((delivery, since)) = state.waiting.pop_front() {
            if since.elapsed() < self.stale {
                return (Some(delivery), stale);
            }
            stale.push(delivery);
        }
        (None, stale)
    }

    /// Stops handing out messages; those waiting, to give back.
    #[must_use]
    pub fn close(&self) -> Vec<T> {
        let mut state = self.state();
        state.closed = true;
        state.waiting.drain(..).map(|(d, _)| d).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: f64 = 1.0;
    const MS: f64 = 1000.0;

    #[test]
    fn nothing_ahead_before_both_latencies_are_known() {
        assert_eq!(claim_size(8, 8, 8, None, None), 8);
        assert_eq!(claim_size(3, 8, 8, Some(10.0 * US), None), 3);
        assert_eq!(claim_size(3, 8, 8, None, Some(MS)), 3);
    }

    #[test]
    fn quick_handlers_claim_up_to_the_cap_ahead() {
        // 8 workers finishing a message in 10 µs do 800 in a 1 ms claim: capped.
        assert_eq!(claim_size(8, 8, 8, Some(10.0 * US), Some(MS)), 16);
        assert_eq!(claim_size(2, 8, 8, Some(0.0), Some(MS)), 10);
        assert_eq!(claim_size(8, 8, 0, Some(0.0), Some(MS)), 8);
    }

    #[test]
    fn handlers_as_slow_as_a_claim_claim_what_they_finish_meanwhile() {
        // 8 workers of 2 ms handlers finish 4 messages in a 1 ms claim.
        assert_eq!(claim_size(1, 8, 8, Some(2.0 * MS), Some(MS)), 4);
        assert_eq!(claim_size(1, 8, 8, Some(MS), Some(MS)), 8);
        assert_eq!(claim_size(6, 8, 8, Some(2.0 * MS), Some(MS)), 6);
    }

    #[test]
    fn slow_handlers_claim_a_message_per_free_worker() {
        assert_eq!(claim_size(1, 8, 8, Some(1000.0 * MS), Some(MS)), 1);
        assert_eq!(claim_size(5, 8, 8, Some(1000.0 * MS), Some(MS)), 5);
    }

    #[test]
    fn waiting_messages_go_in_order_until_closed() {
        let ahead = Ahead::new(4, Duration::from_secs(3600));
        assert_eq!(ahead.claim_size(2, 4), 2, "no latency measured yet");
        ahead.handled(Duration::from_micros(10));
        ahead.claimed(Duration::from_millis(1));
        assert_eq!(ahead.claim_size(2, 4), 6);
        ahead.keep([1, 2, 3]);
        assert_eq!(ahead.next(), (Some(1), vec![]));
        assert_eq!(ahead.close(), vec![2, 3]);
        ahead.keep([4]);
        assert_eq!(ahead.next(), (None, vec![]), "closed: nothing more is handed out");
    }

    #[test]
    fn messages_that_waited_too_long_are_given_back() {
        let ahead = Ahead::new(4, Duration::ZERO);
        ahead.keep([1, 2]);
        assert_eq!(ahead.next(), (None, vec![1, 2]));
        assert_eq!(ahead.close(), Vec::<i32>::new());
    }

    #[test]
    fn latencies_are_smoothed() {
        let first = smooth(None, Duration::from_millis(8));
        assert_eq!(first, Some(8000.0));
        assert_eq!(smooth(first, Duration::ZERO), Some(7000.0));
    }
}
