//! The protocol as a [`stateright::Model`]: each action is one statement (or one
//! transaction) of `crates/rowbus/src/sql`, taken as atomic, with the conditions and
//! effects its SQL has.

use stateright::{Model, Property};

use crate::properties;
use crate::state::{Budget, Ghost, Held, Lease, Queued, Row, Spec, State};

/// The sizes of the model: how many messages, consumers and of each bounded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    /// The messages, published in this order (their ids rise in it).
    pub messages: Vec<Spec>,
    /// Consumers (processes or runners), each claiming for itself.
    pub consumers: u8,
    /// Deliveries one consumer holds at once (its workers).
    pub holds: u8,
    /// `RetryPolicy::max_attempts`: a failed attempt with this many counted goes to the
    /// dead letters.
    pub max_attempts: u8,
    /// The `max_running` a limit change sets.
    pub limit: u8,
    /// The bounded events of each path.
    pub budget: Budget,
    /// Whether publishes may hand messages off to an idle consumer.
    pub hand_offs: bool,
    /// Whether publishes may be delayed.
    pub delayed_publishes: bool,
    /// Whether a lease may run out while its holder's handler still runs (a slow or stuck
    /// handler). Off, the clock passes a lease only once its holder is gone: the fairness
    /// a liveness property needs (handlers finish within their lease).
    pub slow_handlers: bool,
    /// Whether [`properties`](Model::properties) include the liveness property, which is
    /// only meaningful where every path ends (see [`Bounds::liveness`]).
    pub check_liveness: bool,
}

impl Bounds {
    /// The safety check's bounds: three messages (two sharing ordering key 0, one without
    /// a key, which hand-offs may take), two consumers of one worker each, two attempts,
    /// a limit of one, one crash, one cancel, one pause, two limit changes (a set and a
    /// clear), one extension and one snooze, slow handlers.
    pub fn safety() -> Bounds {
        Bounds {
            messages: vec![Spec { key: Some(0) }, Spec { key: None }, Spec { key: Some(0) }],
            consumers: 2,
            holds: 1,
            max_attempts: 2,
            limit: 1,
            budget: Budget { crashes: 1, cancels: 1, pauses: 1, limit_changes: 2, extends: 1, snoozes: 1 },
            hand_offs: true,
            delayed_publishes: true,
            slow_handlers: true,
            check_liveness: false,
        }
    }

    /// The ordering keys' and limits' check: three messages of two keys (0, 1, 0), no
    /// hand-offs (they take keyless messages only), otherwise as [`Bounds::safety`].
    pub fn keys() -> Bounds {
        Bounds {
            messages: vec![Spec { key: Some(0) }, Spec { key: Some(1) }, Spec { key: Some(0) }],
            hand_offs: false,
            ..Bounds::safety()
        }
    }

    /// The liveness check's bounds: as [`Bounds::safety`], but handlers finish within
    /// their lease (the clock passes a lease only after its holder crashed), so that every
    /// path ends and `eventually` is meaningful.
    pub fn liveness() -> Bounds {
        Bounds { slow_handlers: false, check_liveness: true, ..Bounds::safety() }
    }
}

/// The rules of the statements: all false is rowbus as it is; each true breaks one rule
/// on purpose, for the checker to catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rules {
    /// The acknowledgement's `DELETE` matches the id alone, not `id AND lease`.
    pub ack_ignores_token: bool,
    /// The clock never passes a lease: a crashed holder's message is never claimable again.
    pub leases_never_run_out: bool,
    /// The extension's `UPDATE` matches `id AND lease` alone, not `lease_until > now`: it
    /// renews a lease that ran out if nobody claimed the row since (rowbus before it
    /// refused those).
    pub extend_ignores_lease_end: bool,
}

/// The claim protocol of one queue group: the model the checker explores.
#[derive(Debug, Clone)]
pub struct Protocol {
    /// Its sizes.
    pub bounds: Bounds,
    /// Its rules.
    pub rules: Rules,
}

impl Protocol {
    /// The protocol as rowbus has it, within `bounds`.
    pub fn new(bounds: Bounds) -> Protocol {
        Protocol { bounds, rules: Rules::default() }
    }

    /// The protocol with `rules` (some broken on purpose).
    pub fn with_rules(bounds: Bounds, rules: Rules) -> Protocol {
        Protocol { bounds, rules }
    }

    /// The state before anything happened.
    pub fn initial(&self) -> State {
        State {
            rows: vec![Row::Unpublished; self.bounds.messages.len()],
            consumers: vec![Vec::new(); usize::from(self.bounds.consumers)],
            paused: false,
            limit: None,
            budget: self.bounds.budget,
            ghost: Ghost::default(),
        }
    }

    /// The next message to publish: publishes go in index order, so that index order is
    /// id order.
    fn next_unpublished(&self, s: &State) -> Option<usize> {
        s.rows.iter().position(|r| *r == Row::Unpublished)
    }

    /// The claim's key condition (`Claiming::key_free` in rowbus's `sql/claims.rs`; on
    /// MySQL/MariaDB through the keys' table joined to the queue): no message of the same
    /// key with a lower id is in the queue table, whatever its state (ready, delayed,
    /// leased).
    pub fn key_free(&self, s: &State, m: usize) -> bool {
        match self.bounds.messages[m].key {
            None => true,
            Some(k) => (0..m).all(|e| self.bounds.messages[e].key != Some(k) || s.queued(e).is_none()),
        }
    }

    /// What the start log counts as running (the limits' `running` statement): starts
    /// whose message still holds that lease, unexpired.
    pub fn running(&self, s: &State) -> usize {
        (0..s.rows.len())
            .filter(|&m| s.queued(m).and_then(|q| q.lease).is_some_and(|l| l.live && l.start))
            .count()
    }

    /// Whether a claim may take message `m`: the lease claim's `WHERE` (`claim_sql` in
    /// postgres/layout.rs, mysql.rs and sqlite.rs): `visible_at <= now AND (lease_until IS
    /// NULL OR lease_until <= now)`, the pause check (`Pausing::not_paused`), the key check;
    /// and either no limit row (`Limiting::not_limited`, the plain claim) or, on the limited
    /// claim (`broker/claim/limited.rs`), room under `max_running` as the start log counts.
    pub fn claimable(&self, s: &State, m: usize) -> bool {
        let Some(q) = s.queued(m) else { return false };
        let free = q.lease.is_none_or(|l| !l.live);
        let room = s.limit.is_none_or(|n| self.running(s) < usize::from(n));
        q.visible && free && !s.paused && self.key_free(s, m) && room
    }

    /// The deliveries of message `m` lose their token (the row's lease changed or the row
    /// is gone).
    fn stale(s: &mut State, m: usize) {
        for held in &mut s.consumers {
            for h in held.iter_mut().filter(|h| usize::from(h.msg) == m) {
                h.current = false;
            }
        }
    }

    /// A delivery given to consumer `c`.
    fn give(s: &mut State, c: usize, held: Held) {
        s.consumers[c].push(held);
        s.consumers[c].sort_unstable();
    }

    fn room(&self, s: &State, c: usize) -> bool {
        s.consumers[c].len() < usize::from(self.bounds.holds)
    }

    /// Whether an extension by delivery `h` renews its lease (`TableSql::extend`'s `WHERE
    /// id = ? AND lease = ? AND lease_until > now`): its token is the row's and the lease
    /// still runs (or, with [`Rules::extend_ignores_lease_end`], whether or not it runs).
    pub fn extends(&self, s: &State, h: Held) -> bool {
        let lease = s.queued(usize::from(h.msg)).and_then(|q| q.lease);
        h.current && lease.is_some_and(|l| l.live || self.rules.extend_ignores_lease_end)
    }

    /// Whether the clock may pass message `m`'s deadline now.
    pub(crate) fn can_tick(&self, s: &State, m: usize) -> bool {
        let held_live = s.held().any(|(_, h)| usize::from(h.msg) == m && h.live);
        let pending = match s.queued(m) {
            Some(q) => !q.visible || q.lease.is_some_and(|l| l.live),
            None => false,
        };
        if !(pending || held_live) {
            return false;
        }
        if s.queued(m).is_some_and(|q| q.lease.is_some_and(|l| l.live)) {
            if self.rules.leases_never_run_out {
                return false;
            }
            // Fairness: a holder still running finishes within its lease.
            let running = s.held().any(|(_, h)| usize::from(h.msg) == m && h.current);
            if running && !self.bounds.slow_handlers {
                return false;
            }
        }
        true
    }
}

/// One step of the protocol: a statement (or transaction) of rowbus, or the clock, a crash
/// or an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `TableSql::insert`: a row, visible now, unleased, no attempt counted.
    Publish(u8),
    /// `TableSql::insert` with a delay: `visible_at` later.
    PublishDelayed(u8),
    /// `TableSql::hand_off`: `INSERT ... SELECT ..., 1, token, lease WHERE NOT EXISTS
    /// (pause) AND NOT EXISTS (limits)`: stored leased to an idle consumer's free worker,
    /// one attempt counted; where a pause or a limit holds the group it stores nothing and
    /// the publish inserts the message as usual (`HandOff::Not`). Keyless messages only.
    HandOff {
        /// The message.
        msg: u8,
        /// The consumer whose idle runner takes it.
        consumer: u8,
    },
    /// The lease claim (`claim_sql`, or the limited claim of `broker/claim/limited.rs`):
    /// `UPDATE ... SET lease_until = now + lease, lease = token, attempts = attempts + 1`
    /// of a row [`Protocol::claimable`] allows; the limited claim also records a start
    /// (`LimitSql::record`) and prunes starts whose lease ran out (`LimitSql::prune`).
    Claim {
        /// The consumer claiming.
        consumer: u8,
        /// The row it takes.
        msg: u8,
    },
    /// A runner starts a handed-off message (in memory: no statement).
    Start {
        /// The consumer.
        consumer: u8,
        /// Which of its deliveries.
        slot: u8,
    },
    /// `TableSql::release` (`UPDATE ... SET lease = NULL, lease_until = NULL, attempts =
    /// attempts - 1 WHERE id = ? AND lease = ?`): a hand-off's runner stopped before
    /// starting it (`HandedOff`'s drop) gives it back.
    GiveBack {
        /// The consumer.
        consumer: u8,
        /// Which of its deliveries.
        slot: u8,
    },
    /// `TableSql::ack`: `DELETE ... WHERE id = ? AND lease = ?`.
    Ack {
        /// The consumer.
        consumer: u8,
        /// Which of its deliveries.
        slot: u8,
    },
    /// A failed attempt (`Delivery::fail`): with attempts left, `TableSql::retry` (`UPDATE
    /// ... SET visible_at = later, lease = NULL, lease_until = NULL WHERE id = ? AND lease =
    /// ?`); with none, `dead_insert` then `ack` in one transaction, committed only if both
    /// changed the row (`settle/lease.rs`, `dead_letter`).
    Fail {
        /// The consumer.
        consumer: u8,
        /// Which of its deliveries.
        slot: u8,
    },
    /// `TableSql::snooze`: `UPDATE ... SET visible_at = later, lease = NULL, lease_until =
    /// NULL, attempts = attempts - 1 WHERE id = ? AND lease = ?`.
    Snooze {
        /// The consumer.
        consumer: u8,
        /// Which of its deliveries.
        slot: u8,
    },
    /// `TableSql::extend` (and the heartbeat's `extend_pairs`): `UPDATE ... SET
    /// lease_until = now + lease WHERE id = ? AND lease = ? AND lease_until > now`: only a
    /// lease that still runs is renewed; one that ran out is refused (`Error::LeaseLost`)
    /// even where nobody claimed the row since ([`Protocol::extends`]).
    Extend {
        /// The consumer.
        consumer: u8,
        /// Which of its deliveries.
        slot: u8,
    },
    /// A consumer's process dies: its deliveries are dropped unsettled (their rows keep
    /// their leases until those run out).
    Crash(u8),
    /// `Queue::cancel` (`cancel_lock_ids`, then `delete_ids`, in one transaction): the row
    /// is removed whatever its state; a holder is told to stop, and its settles find no
    /// row.
    Cancel(u8),
    /// `PauseSql::pause_group`.
    Pause,
    /// `PauseSql::resume_group`.
    Resume,
    /// `Queue::set_limit` with `max_running`: the limits row (`set_running`) and the seed
    /// (`LimitSql::seed`: a start for each message of the group under a live lease that
    /// has none), in one transaction.
    SetLimit,
    /// `Queue::clear_limit`: `clear` and `clear_starts`.
    ClearLimit,
    /// The clock passes message `m`'s deadline: its `visible_at`, or its lease's
    /// `lease_until` (and so that of every delivery of it).
    Tick(u8),
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let n = s.rows.len();
        if let Some(m) = self.next_unpublished(s) {
            let m8 = m as u8;
            actions.push(Action::Publish(m8));
            if self.bounds.delayed_publishes {
                actions.push(Action::PublishDelayed(m8));
            }
            if self.bounds.hand_offs && self.bounds.messages[m].key.is_none() {
                for c in 0..s.consumers.len() {
                    if self.room(s, c) {
                        actions.push(Action::HandOff { msg: m8, consumer: c as u8 });
                    }
                }
            }
        }
        for c in 0..s.consumers.len() {
            let c8 = c as u8;
            if self.room(s, c) {
                for m in (0..n).filter(|&m| self.claimable(s, m)) {
                    actions.push(Action::Claim { consumer: c8, msg: m as u8 });
                }
            }
            for (slot, h) in s.consumers[c].iter().enumerate() {
                let slot = slot as u8;
                if h.started {
                    actions.push(Action::Ack { consumer: c8, slot });
                    actions.push(Action::Fail { consumer: c8, slot });
                    if s.budget.snoozes > 0 {
                        actions.push(Action::Snooze { consumer: c8, slot });
                    }
                    if s.budget.extends > 0 {
                        actions.push(Action::Extend { consumer: c8, slot });
                    }
                } else {
                    actions.push(Action::Start { consumer: c8, slot });
                    actions.push(Action::GiveBack { consumer: c8, slot });
                }
            }
            if s.budget.crashes > 0 && !s.consumers[c].is_empty() {
                actions.push(Action::Crash(c8));
            }
        }
        if s.budget.cancels > 0 {
            for m in (0..n).filter(|&m| s.queued(m).is_some()) {
                actions.push(Action::Cancel(m as u8));
            }
        }
        if s.paused {
            actions.push(Action::Resume);
        } else if s.budget.pauses > 0 {
            actions.push(Action::Pause);
        }
        if s.budget.limit_changes > 0 {
            actions.push(if s.limit.is_some() { Action::ClearLimit } else { Action::SetLimit });
        }
        for m in (0..n).filter(|&m| self.can_tick(s, m)) {
            actions.push(Action::Tick(m as u8));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Publish(m) | Action::PublishDelayed(m) => {
                let visible = matches!(action, Action::Publish(_));
                s.rows[usize::from(m)] = Row::Queued(Queued { visible, lease: None, attempts: 0 });
            }
            Action::HandOff { msg, consumer } => {
                let m = usize::from(msg);
                if s.paused || s.limit.is_some() {
                    // Refused by the insert's conditions: published as usual instead.
                    s.rows[m] = Row::Queued(Queued { visible: true, lease: None, attempts: 0 });
                } else {
                    let lease = Some(Lease { live: true, start: false, revived: false });
                    s.rows[m] = Row::Queued(Queued { visible: true, lease, attempts: 1 });
                    let held = Held { msg, current: true, live: true, started: false };
                    Self::give(&mut s, usize::from(consumer), held);
                    s.ghost.claimed |= 1 << m;
                }
            }
            Action::Claim { consumer, msg } => {
                let m = usize::from(msg);
                let limited = s.limit.is_some();
                s.ghost.paused_take |= s.paused;
                s.ghost.cancelled_taken |= s.rows[m] == Row::Cancelled;
                let Row::Queued(q) = &mut s.rows[m] else { return None };
                q.lease = Some(Lease { live: true, start: limited, revived: false });
                q.attempts += 1;
                Self::stale(&mut s, m);
                Self::give(
                    &mut s,
                    usize::from(consumer),
                    Held { msg, current: true, live: true, started: true },
                );
                s.ghost.claimed |= 1 << m;
                if let Some(n) = s.limit {
                    // The prune: starts whose lease ran out go (no rate: a window of 0).
                    for row in &mut s.rows {
                        if let Row::Queued(Queued { lease: Some(l), .. }) = row
                            && !l.live
                        {
                            l.start = false;
                        }
                    }
                    let n = usize::from(n);
                    s.ghost.limit_overrun_revived |= s.live_leases() > n;
                    s.ghost.limit_overrun |= s.live_leases_unrevived() > n;
                }
            }
            Action::Start { consumer, slot } => {
                s.consumers[usize::from(consumer)][usize::from(slot)].started = true;
                s.consumers[usize::from(consumer)].sort_unstable();
            }
            Action::GiveBack { consumer, slot } => {
                let h = s.consumers[usize::from(consumer)].remove(usize::from(slot));
                self.settle(&mut s, h, |q| {
                    q.lease = None;
                    q.attempts -= 1;
                    None
                });
            }
            Action::Ack { consumer, slot } => {
                let h = s.consumers[usize::from(consumer)].remove(usize::from(slot));
                let m = usize::from(h.msg);
                if !h.current && self.rules.ack_ignores_token && s.queued(m).is_some() {
                    s.ghost.stale_settle = true;
                    s.rows[m] = Row::Done;
                    Self::stale(&mut s, m);
                } else {
                    self.settle(&mut s, h, |_| Some(Row::Done));
                }
            }
            Action::Fail { consumer, slot } => {
                let h = s.consumers[usize::from(consumer)].remove(usize::from(slot));
                let max = self.bounds.max_attempts;
                self.settle(&mut s, h, |q| {
                    if q.attempts >= max {
                        return Some(Row::Dead);
                    }
                    q.visible = false;
                    q.lease = None;
                    None
                });
            }
            Action::Snooze { consumer, slot } => {
                s.budget.snoozes -= 1;
                let h = s.consumers[usize::from(consumer)].remove(usize::from(slot));
                self.settle(&mut s, h, |q| {
                    q.visible = false;
                    q.lease = None;
                    q.attempts -= 1;
                    None
                });
            }
            Action::Extend { consumer, slot } => {
                s.budget.extends -= 1;
                let (c, slot) = (usize::from(consumer), usize::from(slot));
                let h = s.consumers[c][slot];
                if self.extends(&s, h)
                    && let Row::Queued(Queued { lease: Some(l), .. }) = &mut s.rows[usize::from(h.msg)]
                {
                    l.revived |= !l.live;
                    l.live = true;
                    s.consumers[c][slot].live = true;
                    s.consumers[c].sort_unstable();
                }
            }
            Action::Crash(c) => {
                s.budget.crashes -= 1;
                s.consumers[usize::from(c)].clear();
            }
            Action::Cancel(m) => {
                s.budget.cancels -= 1;
                let m = usize::from(m);
                s.rows[m] = Row::Cancelled;
                Self::stale(&mut s, m);
            }
            Action::Pause => {
                s.budget.pauses -= 1;
                s.paused = true;
            }
            Action::Resume => s.paused = false,
            Action::SetLimit => {
                s.budget.limit_changes -= 1;
                s.limit = Some(self.bounds.limit);
                for row in &mut s.rows {
                    if let Row::Queued(Queued { lease: Some(l), .. }) = row
                        && l.live
                    {
                        l.start = true;
                    }
                }
            }
            Action::ClearLimit => {
                s.budget.limit_changes -= 1;
                s.limit = None;
                for row in &mut s.rows {
                    if let Row::Queued(Queued { lease: Some(l), .. }) = row {
                        l.start = false;
                    }
                }
            }
            Action::Tick(m) => {
                let m = usize::from(m);
                if let Row::Queued(q) = &mut s.rows[m] {
                    q.visible = true;
                    if let Some(l) = &mut q.lease {
                        l.live = false;
                    }
                }
                for held in &mut s.consumers {
                    for h in held.iter_mut().filter(|h| usize::from(h.msg) == m) {
                        h.live = false;
                    }
                    held.sort_unstable();
                }
            }
        }
        Some(s)
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.rows.iter().all(|r| !matches!(r, Row::Queued(q) if q.attempts > self.bounds.max_attempts + 1))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all(self.bounds.check_liveness)
    }
}

impl Protocol {
    /// A settle by delivery `h` (already taken from its consumer): where the row still
    /// carries its token (`WHERE id = ? AND lease = ?`), `change` updates the row, or
    /// replaces it when it returns a row; otherwise nothing changes (`Error::LeaseLost`).
    fn settle(&self, s: &mut State, h: Held, change: impl FnOnce(&mut Queued) -> Option<Row>) {
        let m = usize::from(h.msg);
        if !h.current {
            return;
        }
        let Row::Queued(q) = &mut s.rows[m] else { return };
        if let Some(row) = change(q) {
            s.rows[m] = row;
        }
        Self::stale(s, m);
    }
}
