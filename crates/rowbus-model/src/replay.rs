//! Replaying what the real library did through the model: each observed step must be a
//! step the model allows from a state it could be in, with the outcome observed, and every
//! state it leads to must keep the safety properties.
//!
//! The database's clock runs on its own, so the replay does not know which deadlines
//! passed between two steps. It keeps every model state the history so far could have
//! led to, and before each step lets the clock pass any deadline that may have passed by
//! the step's end ([`Timing`]: the time the step that set it began, plus its duration,
//! less a slack), and surely passes those that had passed when the step began (the end of
//! the step that set it, plus the duration and the slack).

use std::collections::HashSet;
use std::fmt;
use std::time::{Duration, Instant};

use stateright::{Expectation, Model};

use crate::model::{Action, Bounds, Protocol};
use crate::properties::LIMIT_HELD_COUNTING_RENEWED;
use crate::state::{Budget, Row, Spec, State};

/// The durations the library was given, which set the deadlines the replay reckons with.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The subscriptions' lease (and what an extension adds).
    pub lease: Duration,
    /// A delayed publish's delay.
    pub delay: Duration,
    /// A snooze's delay.
    pub snooze: Duration,
    /// A retry's backoff (the same for every attempt: a factor of 1).
    pub backoff: Duration,
    /// How far the database's clock and this process's may disagree about a deadline.
    pub slack: Duration,
}

/// One step the library was seen to take, with its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A publish of the next message (with a delay or not).
    Publish {
        /// The message (publish order).
        msg: u8,
        /// Whether it was published with [`Timing::delay`].
        delayed: bool,
    },
    /// A claim of one message by a consumer: what it got and which attempt the delivery
    /// said it was, or nothing. A claim that took a lease or longer and got nothing may
    /// have leased a message all the same: the library hands out nothing from a claim whose
    /// commit outlasted its lease, and leaves its rows to the next claim.
    Claim {
        /// The consumer.
        consumer: u8,
        /// The message and its attempt, if the claim got one.
        got: Option<(u8, u8)>,
    },
    /// An acknowledgement; `ok` unless it was refused as a lost lease.
    Ack {
        /// The consumer.
        consumer: u8,
        /// The message.
        msg: u8,
        /// Whether it succeeded.
        ok: bool,
    },
    /// A failed attempt (retry or dead letter).
    Fail {
        /// The consumer.
        consumer: u8,
        /// The message.
        msg: u8,
        /// Whether it succeeded.
        ok: bool,
    },
    /// A snooze of [`Timing::snooze`].
    Snooze {
        /// The consumer.
        consumer: u8,
        /// The message.
        msg: u8,
        /// Whether it succeeded.
        ok: bool,
    },
    /// An extension of the lease by [`Timing::lease`].
    Extend {
        /// The consumer.
        consumer: u8,
        /// The message.
        msg: u8,
        /// Whether it succeeded.
        ok: bool,
    },
    /// A consumer dropped what it held without settling it.
    Crash(u8),
    /// A cancel of one message: whether it was removed, and whether the cancel said it was
    /// running.
    Cancel {
        /// The message.
        msg: u8,
        /// Whether the cancel removed it.
        removed: bool,
        /// Whether the cancel reported it running.
        running: bool,
    },
    /// The group paused.
    Pause,
    /// The group resumed.
    Resume,
    /// `max_running` set on the group.
    SetLimit,
    /// The group's limit cleared.
    ClearLimit,
}

/// A step the model does not allow, or a state that breaks a property.
#[derive(Debug)]
pub struct Mismatch {
    /// What went wrong.
    pub what: String,
    /// The steps so far, the failing one last.
    pub history: Vec<Step>,
    /// A few of the model states the step was taken from.
    pub before: Vec<String>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.what)?;
        writeln!(f, "history:")?;
        for (i, step) in self.history.iter().enumerate() {
            writeln!(f, "{:>4}. {step:?}", i + 1)?;
        }
        writeln!(f, "model states before the last step (some of them):")?;
        for state in &self.before {
            writeln!(f, "  {state}")?;
        }
        Ok(())
    }
}

/// The earliest and latest time a message's pending deadline passes.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    earliest: Instant,
    latest: Instant,
}

/// A history replayed through the model.
#[derive(Debug)]
pub struct Replay {
    protocol: Protocol,
    timing: Timing,
    states: HashSet<State>,
    deadlines: Vec<Option<Deadline>>,
    history: Vec<Step>,
}

impl Replay {
    /// A replay of `messages` (published in that order) by `consumers` consumers, with
    /// `max_attempts` and a limit of `limit` as the library was given.
    pub fn new(messages: Vec<Spec>, consumers: u8, max_attempts: u8, limit: u8, timing: Timing) -> Replay {
        let n = messages.len();
        let budget = Budget {
            crashes: 255,
            cancels: 255,
            pauses: 255,
            limit_changes: 255,
            extends: 255,
            snoozes: 255,
        };
        let bounds = Bounds {
            messages,
            consumers,
            holds: u8::MAX,
            max_attempts,
            limit,
            budget,
            hand_offs: false,
            delayed_publishes: true,
            slow_handlers: true,
            check_liveness: false,
        };
        let protocol = Protocol::new(bounds);
        let states = HashSet::from([protocol.initial()]);
        Replay { protocol, timing, states, deadlines: vec![None; n], history: Vec::new() }
    }

    /// How many model states the history so far could have led to.
    pub fn possible(&self) -> usize {
        self.states.len()
    }

    /// The history so far.
    pub fn history(&self) -> &[Step] {
        &self.history
    }

    /// Takes `step`, observed to begin at `began` and end at `ended`.
    pub fn step(&mut self, step: Step, began: Instant, ended: Instant) -> Result<(), Box<Mismatch>> {
        self.history.push(step);
        let before = self.pass_time(began, ended);
        let mut after = HashSet::new();
        for state in &before {
            for next in self.apply(state, step, ended.duration_since(began) >= self.timing.lease) {
                after.insert(next);
            }
        }
        if after.is_empty() {
            return Err(self.mismatch(format!("the model does not allow {step:?}"), &before));
        }
        for state in &after {
            for property in self.protocol.properties() {
                if property.expectation == Expectation::Always
                    && property.name != LIMIT_HELD_COUNTING_RENEWED
                    && !(property.condition)(&self.protocol, state)
                {
                    return Err(self
                        .mismatch(format!("\"{}\" breaks after {step:?}: {state}", property.name), &before));
                }
            }
        }
        self.set_deadline(step, began, ended);
        self.states = after;
        Ok(())
    }

    fn mismatch(&self, what: String, before: &HashSet<State>) -> Box<Mismatch> {
        let before = before.iter().take(4).map(ToString::to_string).collect();
        Box::new(Mismatch { what, history: self.history.clone(), before })
    }

    /// Every state the clock may have led to by `ended`, having surely passed what was
    /// due by `began`.
    fn pass_time(&self, began: Instant, ended: Instant) -> HashSet<State> {
        let slack = self.timing.slack;
        let n = self.deadlines.len();
        let due = |m: usize| self.deadlines[m].is_some_and(|d| d.latest + slack <= began);
        let may = |m: usize| self.deadlines[m].is_none_or(|d| d.earliest <= ended + slack);
        let mut seen = HashSet::new();
        let mut todo: Vec<State> = Vec::new();
        for state in &self.states {
            let mut state = state.clone();
            for m in (0..n).filter(|&m| due(m)) {
                if self.tickable(&state, m) {
                    state = self.protocol.next_state(&state, Action::Tick(m as u8)).expect("a tick");
                }
            }
            if seen.insert(state.clone()) {
                todo.push(state);
            }
        }
        while let Some(state) = todo.pop() {
            for m in (0..n).filter(|&m| may(m) && self.tickable(&state, m)) {
                let next = self.protocol.next_state(&state, Action::Tick(m as u8)).expect("a tick");
                if seen.insert(next.clone()) {
                    todo.push(next);
                }
            }
        }
        seen
    }

    fn tickable(&self, s: &State, m: usize) -> bool {
        self.protocol.can_tick(s, m)
    }

    /// The states `step` leads to from `s` with the outcome observed; `slow` when the
    /// step took at least a lease.
    fn apply(&self, s: &State, step: Step, slow: bool) -> Vec<State> {
        let p = &self.protocol;
        let next = |action| p.next_state(s, action).into_iter().collect::<Vec<_>>();
        match step {
            Step::Publish { msg, delayed } => {
                if s.rows.iter().position(|r| *r == Row::Unpublished) != Some(usize::from(msg)) {
                    return Vec::new();
                }
                next(if delayed { Action::PublishDelayed(msg) } else { Action::Publish(msg) })
            }
            Step::Claim { consumer, got: None } => {
                let mut out = vec![s.clone()];
                if slow {
                    // A claim whose commit outlasted its lease hands out nothing and
                    // leaves what it leased to the next claim (`claims.rs`, `claim_now`).
                    for m in (0..s.rows.len()).filter(|&m| p.claimable(s, m)) {
                        let claimed = p.next_state(s, Action::Claim { consumer, msg: m as u8 });
                        let lapsed = claimed.and_then(|n| p.next_state(&n, Action::Tick(m as u8)));
                        if let Some(mut n) = lapsed {
                            n.consumers[usize::from(consumer)]
                                .retain(|h| usize::from(h.msg) != m || !h.current);
                            out.push(n);
                        }
                    }
                }
                out
            }
            Step::Claim { consumer, got: Some((msg, attempt)) } => {
                if !p.claimable(s, usize::from(msg)) {
                    return Vec::new();
                }
                next(Action::Claim { consumer, msg })
                    .into_iter()
                    .filter(|n| n.queued(usize::from(msg)).is_some_and(|q| q.attempts == attempt))
                    .collect()
            }
            Step::Ack { consumer, msg, ok }
            | Step::Fail { consumer, msg, ok }
            | Step::Snooze { consumer, msg, ok }
            | Step::Extend { consumer, msg, ok } => {
                let mut out = Vec::new();
                for (slot, held) in s.consumers[usize::from(consumer)].iter().enumerate() {
                    // A settle succeeds under its token; an extension also needs its lease
                    // to run still.
                    let succeeds = match step {
                        Step::Extend { .. } => p.extends(s, *held),
                        _ => held.current,
                    };
                    if held.msg != msg || succeeds != ok {
                        continue;
                    }
                    let slot = slot as u8;
                    let action = match step {
                        Step::Ack { .. } => Action::Ack { consumer, slot },
                        Step::Fail { .. } => Action::Fail { consumer, slot },
                        Step::Snooze { .. } => Action::Snooze { consumer, slot },
                        _ => Action::Extend { consumer, slot },
                    };
                    out.extend(next(action));
                }
                out
            }
            Step::Crash(c) => next(Action::Crash(c)),
            Step::Cancel { msg, removed, running } => match s.queued(usize::from(msg)) {
                Some(q) if removed && q.lease.is_some_and(|l| l.live) == running => next(Action::Cancel(msg)),
                None if !removed && s.rows[usize::from(msg)] != Row::Unpublished => vec![s.clone()],
                _ => Vec::new(),
            },
            Step::Pause if !s.paused => next(Action::Pause),
            Step::Resume if s.paused => next(Action::Resume),
            Step::SetLimit if s.limit.is_none() => next(Action::SetLimit),
            Step::ClearLimit if s.limit.is_some() => next(Action::ClearLimit),
            Step::Pause | Step::Resume | Step::SetLimit | Step::ClearLimit => Vec::new(),
        }
    }

    /// The deadline `step` set, if it set one: a claim's or an extension's lease, a
    /// delayed publish's, a snooze's or a retry's time.
    fn set_deadline(&mut self, step: Step, began: Instant, ended: Instant) {
        let t = self.timing;
        let (msg, after) = match step {
            Step::Publish { msg, delayed: true } => (msg, t.delay),
            Step::Claim { got: Some((msg, _)), .. } | Step::Extend { msg, ok: true, .. } => (msg, t.lease),
            Step::Snooze { msg, ok: true, .. } => (msg, t.snooze),
            Step::Fail { msg, ok: true, .. } => (msg, t.backoff),
            _ => return,
        };
        self.deadlines[usize::from(msg)] = Some(Deadline { earliest: began + after, latest: ended + after });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: Timing = Timing {
        lease: Duration::from_millis(500),
        delay: Duration::from_millis(100),
        snooze: Duration::from_millis(100),
        backoff: Duration::from_millis(100),
        slack: Duration::from_millis(50),
    };

    /// Replays `steps`, each at the given milliseconds (a step takes 1 ms); the first
    /// mismatch, if any.
    fn replay(keys: &[Option<u8>], steps: &[(u64, Step)]) -> Result<(), Box<Mismatch>> {
        let specs = keys.iter().map(|&key| Spec { key }).collect();
        let mut replay = Replay::new(specs, 2, 2, 1, TIMING);
        let zero = Instant::now();
        for &(at, step) in steps {
            let began = zero + Duration::from_millis(at);
            replay.step(step, began, began + Duration::from_millis(1))?;
        }
        Ok(())
    }

    fn claim(consumer: u8, msg: u8, attempt: u8) -> Step {
        Step::Claim { consumer, got: Some((msg, attempt)) }
    }

    const PUBLISH: Step = Step::Publish { msg: 0, delayed: false };

    #[test]
    fn a_stale_holder_is_refused_and_a_stale_ack_that_succeeded_is_caught() {
        let stale_ack = |ok| {
            replay(
                &[None],
                &[
                    (0, PUBLISH),
                    (1, claim(0, 0, 1)),
                    (600, claim(1, 0, 2)),
                    (601, Step::Ack { consumer: 0, msg: 0, ok }),
                ],
            )
        };
        stale_ack(false).expect("a stale ack is refused");
        let caught = stale_ack(true).expect_err("a stale ack cannot succeed");
        assert!(caught.what.contains("does not allow"), "{caught}");
    }

    #[test]
    fn a_claim_of_a_message_under_a_live_lease_is_caught() {
        replay(&[None], &[(0, PUBLISH), (1, claim(0, 0, 1)), (10, claim(1, 0, 2))])
            .expect_err("the lease still runs");
        replay(&[None], &[(0, PUBLISH), (1, claim(0, 0, 1)), (700, claim(1, 0, 2))])
            .expect("the lease ran out");
    }

    #[test]
    fn a_claim_behind_an_earlier_message_of_its_key_is_caught() {
        let steps = [(0, PUBLISH), (1, Step::Publish { msg: 1, delayed: false })];
        replay(&[Some(0), Some(0)], &[steps[0], steps[1], (2, claim(0, 1, 1))])
            .expect_err("m0 holds the key");
        replay(&[Some(0), Some(1)], &[steps[0], steps[1], (2, claim(0, 1, 1))]).expect("another key");
    }

    #[test]
    fn a_claim_from_a_paused_or_full_group_is_caught() {
        let paused = [(0, PUBLISH), (1, Step::Pause), (2, claim(0, 0, 1))];
        replay(&[None], &paused).expect_err("paused");
        let full = [
            (0, PUBLISH),
            (1, Step::Publish { msg: 1, delayed: false }),
            (2, Step::SetLimit),
            (3, claim(0, 0, 1)),
            (4, claim(1, 1, 1)),
        ];
        replay(&[None, None], &full).expect_err("one running, a limit of one");
    }

    #[test]
    fn a_claim_that_outlasted_its_lease_may_have_leased_what_it_did_not_hand_out() {
        let mut slow = Replay::new(vec![Spec { key: None }], 2, 2, 1, TIMING);
        let zero = Instant::now();
        let at = |ms| zero + Duration::from_millis(ms);
        slow.step(PUBLISH, at(0), at(1)).expect("publish");
        slow.step(Step::Claim { consumer: 0, got: None }, at(2), at(600)).expect("a slow empty claim");
        slow.step(claim(1, 0, 2), at(601), at(602)).expect("the slow claim counted an attempt");
        let quick = [(0, PUBLISH), (2, Step::Claim { consumer: 0, got: None }), (601, claim(1, 0, 2))];
        replay(&[None], &quick).expect_err("a quick empty claim leased nothing");
    }

    #[test]
    fn a_delayed_message_claimed_before_its_time_is_caught() {
        let delayed = Step::Publish { msg: 0, delayed: true };
        replay(&[None], &[(0, delayed), (5, claim(0, 0, 1))]).expect_err("not visible yet");
        replay(&[None], &[(0, delayed), (200, claim(0, 0, 1))]).expect("visible");
    }
}
