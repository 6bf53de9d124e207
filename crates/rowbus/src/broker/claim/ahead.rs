//! Claim-ahead for [`run`](crate::broker::SubscriptionBuilder::run): a claim takes, beyond a
//! message per free worker, the messages the runner's workers are expected to finish in
//! a window of time, so that neither the claim latency nor a fixed claim size bounds the
//! rate when handlers are quick. Those extra messages wait here; a worker that finishes
//! its message takes the next one from here before it counts as free.
//!
//! The sizes follow what is measured: the workers' rate (from the handlers' smoothed
//! time) and the claim's latency (smoothed). The window is 10 ms of the workers' work,
//! and at least two claim latencies; while claims come back full (a backlog) it doubles
//! with each, up to 100 ms, and it falls back to 10 ms at the first claim that found
//! fewer. While the backlog lasts, the runner claims again once what waits here would
//! last the workers two claim latencies, before it runs out. Bounds: at most `cap`
//! messages wait here (1,000 by default), and no more than the workers start within a
//! quarter of the lease, so that a message claimed ahead is started long before its lease
//! runs out; one that waited that long anyway is given back unstarted. With handlers
//! slower than the window, nothing is claimed ahead: a claim takes a message per free
//! worker, as without it.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The messages a runner claims ahead at most by default.
pub(in crate::broker) const DEFAULT_CAP: usize = 1000;
/// The window of work a claim takes ahead, without a backlog...
const MIN_WINDOW_US: f64 = 10_000.0;
/// ...and at most, doubled claim by claim while claims come back full.
const MAX_WINDOW_US: f64 = 100_000.0;

/// Messages (`T`: a runner's deliveries) claimed ahead of the workers, and the latencies
/// that size the claims.
pub(in crate::broker) struct Ahead<T> {
    state: Mutex<State<T>>,
    /// The runner's workers.
    workers: usize,
    /// Most messages waiting here.
    cap: usize,
    /// A message that waited longer than this is given back rather than started; no more
    /// are claimed ahead than the workers start within it.
    stale: Duration,
    /// Told when, during a backlog, what waits falls to the refill mark.
    low: Notify,
}

struct State<T> {
    waiting: VecDeque<(T, Instant)>,
    /// Handler time and claim latency, in microseconds, smoothed.
    handler: Option<f64>,
    claim: Option<f64>,
    /// The window of work to claim ahead, in microseconds.
    window: f64,
    /// The last claim came back full: more is ready, claim before the workers run out.
    backlog: bool,
    /// Shutdown began: nothing more is handed out.
    closed: bool,
}

/// The weight of a new sample in a smoothed latency.
const SMOOTHING: f64 = 0.125;

fn smooth(old: Option<f64>, sample: Duration) -> Option<f64> {
    let sample = sample.as_secs_f64() * 1e6;
    Some(old.map_or(sample, |old| old + SMOOTHING * (sample - old)))
}

/// What sizes a claim: the workers, the latencies measured, the window and the bounds.
#[derive(Debug, Clone, Copy)]
struct Sizing {
    workers: usize,
    /// Smoothed handler time and claim latency, microseconds.
    handler: f64,
    claim: f64,
    /// The window of work, microseconds.
    window: f64,
    /// Most messages waiting; the stale age, microseconds.
    cap: usize,
    stale: f64,
}

impl Sizing {
    /// Messages the workers finish in `micros`. A handler quicker than a microsecond counts
    /// as one; `as` saturates, and the bounds cap the rest.
    fn finished_in(&self, micros: f64) -> usize {
        (self.workers as f64 * micros / self.handler.max(1.0)).ceil() as usize
    }

    /// Messages to hold waiting, beyond the one each worker is on: the window's work (at
    /// least two claims' worth), within the cap and what the workers start before the
    /// stale age.
    fn target(&self) -> usize {
        let window = self.window.max(2.0 * self.claim);
        let work = self.finished_in(window).min(self.finished_in(self.stale));
        work.saturating_sub(self.workers).min(self.cap)
    }

    /// Below this many waiting, during a backlog, the next claim goes before a worker is
    /// free: what the workers finish in two claim latencies, at most half the target.
    /// `None` when nothing is claimed ahead (no target): claims wait for a free worker.
    fn refill_mark(&self) -> Option<usize> {
        let target = self.target();
        (target > 0).then(|| self.finished_in(2.0 * self.claim).min(target / 2))
    }

    /// Whether `waiting` messages are few enough for a claim before a worker is free.
    fn low(&self, waiting: usize) -> bool {
        self.refill_mark().is_some_and(|mark| waiting <= mark)
    }

    /// Messages a claim takes for `free` free workers with `waiting` waiting: one per free
    /// worker, and what brings the waiting up to the target.
    fn claim_size(&self, free: usize, waiting: usize) -> usize {
        free + self.target().saturating_sub(waiting)
    }
}

impl<T> Ahead<T> {
    /// For `workers` workers: up to `cap` messages waiting, each for less than `stale`.
    pub fn new(workers: usize, cap: usize, stale: Duration) -> Self {
        let state = State {
            waiting: VecDeque::new(),
            handler: None,
            claim: None,
            window: MIN_WINDOW_US,
            backlog: false,
            closed: false,
        };
        Ahead { state: Mutex::new(state), workers, cap, stale, low: Notify::new() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sizing; none before both latencies were measured once.
    fn sizing(&self, state: &State<T>) -> Option<Sizing> {
        Some(Sizing {
            workers: self.workers,
            handler: state.handler?,
            claim: state.claim?,
            window: state.window,
            cap: self.cap,
            stale: self.stale.as_secs_f64() * 1e6,
        })
    }

    /// How many messages to claim for `free` free workers.
    pub fn claim_size(&self, free: usize) -> usize {
        let state = self.state();
        match self.sizing(&state) {
            Some(sizing) => sizing.claim_size(free, state.waiting.len()),
            None => free,
        }
    }

    /// Whether a claim is due before any worker is free: a backlog, and what waits here is
    /// at the refill mark.
    pub fn wants_refill(&self) -> bool {
        let state = self.state();
        !state.closed && state.backlog && self.sizing(&state).is_some_and(|s| s.low(state.waiting.len()))
    }

    /// Returns once [`wants_refill`](Self::wants_refill) may have become true.
    pub async fn low(&self) {
        self.low.notified().await;
    }

    /// A handler took `took`.
    pub fn handled(&self, took: Duration) {
        let mut state = self.state();
        state.handler = smooth(state.handler, took);
    }

    /// A claim's round trip took `took`, asking for `asked` messages and getting `got`:
    /// a full claim widens the window (a backlog), a short one narrows it back.
    pub fn claimed(&self, took: Duration, asked: usize, got: usize) {
        let mut state = self.state();
        state.claim = smooth(state.claim, took);
        state.backlog = asked > 0 && got >= asked;
        state.window = if state.backlog { (state.window * 2.0).min(MAX_WINDOW_US) } else { MIN_WINDOW_US };
    }

    /// Keeps `deliveries` for the next workers to finish.
    pub fn keep(&self, deliveries: impl IntoIterator<Item = T>) {
        let now = Instant::now();
        self.state().waiting.extend(deliveries.into_iter().map(|d| (d, now)));
    }

    /// The next message for a worker, and the ones to give back because
    /// they waited too long; none once closed. Tells the claim loop when, during a
    /// backlog, what waits fell to the refill mark.
    #[must_use]
    pub fn next(&self) -> (Option<T>, Vec<T>) {
        let mut state = self.state();
        if state.closed {
            return (None, Vec::new());
        }
        let mut stale = Vec::new();
        let mut next = None;
        while let Some((delivery, since)) = state.waiting.pop_front() {
            if since.elapsed() < self.stale {
                next = Some(delivery);
                break;
            }
            stale.push(delivery);
        }
        if state.backlog && self.sizing(&state).is_some_and(|s| s.low(state.waiting.len())) {
            self.low.notify_one();
        }
        (next, stale)
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
    use futures::FutureExt as _;

    use super::*;

    const US: f64 = 1.0;
    const MS: f64 = 1000.0;
    const LEASE_QUARTER: f64 = 7_500.0 * MS;

    fn sizing(handler: f64, claim: f64, window: f64, cap: usize) -> Sizing {
        Sizing { workers: 8, handler, claim, window, cap, stale: LEASE_QUARTER }
    }

    #[test]
    fn nothing_ahead_before_both_latencies_are_known() {
        let ahead = Ahead::<u32>::new(8, DEFAULT_CAP, Duration::from_secs(30));
        assert_eq!(ahead.claim_size(8), 8);
        ahead.handled(Duration::from_micros(10));
        assert_eq!(ahead.claim_size(3), 3);
        assert!(!ahead.wants_refill());
    }

    #[test]
    fn quick_handlers_claim_the_windows_work_up_to_the_cap() {
        // 8 workers of 100 µs handlers finish 800 messages in the 10 ms window.
        assert_eq!(sizing(100.0 * US, MS, MIN_WINDOW_US, DEFAULT_CAP).claim_size(8, 0), 800);
        // Quicker ones would finish more: the cap bounds what waits.
        assert_eq!(sizing(10.0 * US, MS, MIN_WINDOW_US, DEFAULT_CAP).claim_size(8, 0), 1008);
        assert_eq!(sizing(0.0, MS, MIN_WINDOW_US, 16).claim_size(2, 0), 18);
        assert_eq!(sizing(0.0, MS, MIN_WINDOW_US, 16).claim_size(2, 15), 3, "the free workers' and one more");
        assert_eq!(sizing(0.0, MS, MIN_WINDOW_US, 0).claim_size(8, 0), 8, "cap 0: one per free worker");
        // What already waits counts.
        assert_eq!(sizing(10.0 * US, MS, MIN_WINDOW_US, DEFAULT_CAP).claim_size(0, 900), 100);
    }

    #[test]
    fn the_window_is_at_least_two_claims() {
        // 8 workers of 1 ms handlers finish 80 in 10 ms (72 beyond their own); with 20 ms
        // claims, 320 in two of them.
        assert_eq!(sizing(MS, MS, MIN_WINDOW_US, DEFAULT_CAP).target(), 72);
        assert_eq!(sizing(MS, 20.0 * MS, MIN_WINDOW_US, DEFAULT_CAP).target(), 312);
    }

    #[test]
    fn nothing_waits_longer_than_the_workers_take_to_start_it() {
        // 8 workers of 1 s handlers start 60 messages in 7.5 s (52 beyond their own),
        // whatever the window.
        let s = Sizing { stale: LEASE_QUARTER, ..sizing(1000.0 * MS, MS, MAX_WINDOW_US * 1e3, DEFAULT_CAP) };
        assert_eq!(s.target(), 52);
    }

    #[test]
    fn slow_handlers_claim_a_message_per_free_worker() {
        assert_eq!(sizing(1000.0 * MS, MS, MIN_WINDOW_US, DEFAULT_CAP).claim_size(1, 0), 1);
        assert_eq!(sizing(1000.0 * MS, MS, MIN_WINDOW_US, DEFAULT_CAP).claim_size(5, 0), 5);
    }

    #[test]
    fn full_claims_widen_the_window_and_a_short_one_narrows_it() {
        let ahead = Ahead::<u32>::new(8, 100_000, Duration::from_secs(3600));
        ahead.handled(Duration::from_millis(1));
        ahead.claimed(Duration::from_micros(100), 8, 3);
        assert_eq!(ahead.claim_size(8), 80, "10 ms of 8 workers' 1 ms handlers");
        ahead.claimed(Duration::from_micros(100), 88, 88);
        assert_eq!(ahead.claim_size(8), 160, "20 ms");
        for _ in 0..10 {
            ahead.claimed(Duration::from_micros(100), 8, 8);
        }
        assert_eq!(ahead.claim_size(8), 800, "at most 100 ms");
        ahead.claimed(Duration::from_micros(100), 8, 7);
        assert_eq!(ahead.claim_size(8), 80, "back to 10 ms");
    }

    #[test]
    fn during_a_backlog_the_claim_goes_before_the_waiting_run_out() {
        let ahead = Ahead::new(8, DEFAULT_CAP, Duration::from_secs(3600));
        ahead.handled(Duration::from_millis(1));
        ahead.claimed(Duration::from_millis(1), 8, 8);
        // 8 workers of 1 ms handlers: 152 waiting for the 20 ms window, refill at 16 (two claims).
        ahead.keep(0..40);
        assert!(!ahead.wants_refill());
        for i in 0..23 {
            assert_eq!(ahead.next().0, Some(i));
        }
        assert!(!ahead.wants_refill(), "17 wait");
        assert_eq!(ahead.next().0, Some(23));
        assert!(ahead.wants_refill(), "16 wait");
        assert!(ahead.low().now_or_never().is_some(), "the claim loop was told");
        // A short claim: the backlog is over, no claim before a worker is free.
        ahead.claimed(Duration::from_millis(1), 100, 5);
        assert!(!ahead.wants_refill());
    }

    #[test]
    fn without_a_target_claims_wait_for_a_free_worker() {
        // Claiming ahead turned off, or handlers slower than the window: no refills.
        let ahead = Ahead::<u32>::new(8, 0, Duration::from_secs(3600));
        ahead.handled(Duration::from_micros(1));
        ahead.claimed(Duration::from_millis(1), 8, 8);
        assert!(!ahead.wants_refill());
        assert_eq!(ahead.next(), (None, vec![]));
        assert!(ahead.low().now_or_never().is_none(), "the claim loop is not told");
        let slow = Ahead::<u32>::new(8, DEFAULT_CAP, Duration::from_secs(3600));
        slow.handled(Duration::from_secs(1));
        slow.claimed(Duration::from_millis(1), 8, 8);
        assert!(!slow.wants_refill());
    }

    #[test]
    fn waiting_messages_go_in_order_until_closed() {
        let ahead = Ahead::new(4, 4, Duration::from_secs(3600));
        ahead.keep([1, 2, 3]);
        assert_eq!(ahead.next(), (Some(1), vec![]));
        assert_eq!(ahead.close(), vec![2, 3]);
        ahead.keep([4]);
        assert_eq!(ahead.next(), (None, vec![]), "closed: nothing more is handed out");
        assert!(!ahead.wants_refill());
    }

    #[test]
    fn messages_that_waited_too_long_are_given_back() {
        let ahead = Ahead::new(4, 4, Duration::ZERO);
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
