//! What the model remembers: each message's row in the queue table (or what became of it),
//! what each consumer holds, the pause and limits tables, what is left of the bounded
//! events, and the observations the properties read.

use std::fmt;

/// One message of the model: what its publisher sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Spec {
    /// Its ordering key (`msg_key`), if it has one: a small number stands for the text.
    pub key: Option<u8>,
}

/// The row of one message in the queue table, or what became of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Row {
    /// Not published yet.
    Unpublished,
    /// A row of the queue table.
    Queued(Queued),
    /// Deleted by an acknowledgement (or a handler's discard).
    Done,
    /// Moved to the dead-letter table.
    Dead,
    /// Removed by a cancel.
    Cancelled,
}

/// The columns of a queue table's row that the claim protocol reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Queued {
    /// `visible_at <= now`: false for a delayed message, a retried one or a snoozed one
    /// until the clock passes its time.
    pub visible: bool,
    /// `lease` and `lease_until`: the token of the claim that holds it, if any.
    pub lease: Option<Lease>,
    /// `attempts`: claims that counted (a claim adds one; a release or a snooze takes it
    /// back).
    pub attempts: u8,
}

/// A row's lease. The token itself is not kept: what matters is which delivery holds it,
/// and a [`Held`] says whether its token is the row's ([`Held::current`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lease {
    /// `lease_until > now`.
    pub live: bool,
    /// The start log (`<table>_starts`) has a row for this message under this lease: a
    /// limited claim wrote it, or a limit's seed did.
    pub start: bool,
    /// An observation, not a column: the lease had run out and its holder extended it
    /// after the limit's prune or seed could have passed it over. `extend` refuses a lease
    /// that ran out, so only [`Rules::extend_ignores_lease_end`](crate::Rules) sets it.
    pub revived: bool,
}

/// What a message's row looks like to an operator: the states the protocol names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Look {
    /// Not published yet.
    Unpublished,
    /// Claimable once nothing else holds it back (pause, limit, key).
    Ready,
    /// Waiting for its `visible_at` (a delay, a retry's backoff, a snooze).
    Delayed,
    /// Leased; `live` while its lease runs.
    Leased {
        /// Whether the lease still runs.
        live: bool,
    },
    /// Stored leased to a runner by a hand-off that has not started it yet.
    HandedOff,
    /// Acknowledged.
    Done,
    /// Dead-lettered.
    Dead,
    /// Cancelled.
    Cancelled,
}

/// A delivery a consumer holds: a message under the token of the claim (or hand-off) that
/// gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Held {
    /// The message (its index: messages are published in index order, so the index is the
    /// order of their ids).
    pub msg: u8,
    /// Whether the row still carries this delivery's token: every statement a delivery
    /// runs names `id = ? AND lease = ?`, so only a current one changes the row.
    pub current: bool,
    /// Whether this delivery's own lease still runs (`lease_until` as its claim or its last
    /// extension set it).
    pub live: bool,
    /// Whether the handler started: a hand-off is stored leased before its runner starts
    /// it, and gives it back if it never does.
    pub started: bool,
}

/// How many of each bounded event are left on a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Consumers that may crash (drop what they hold without settling it).
    pub crashes: u8,
    /// Cancels.
    pub cancels: u8,
    /// Pauses (each resume is always possible while paused).
    pub pauses: u8,
    /// Changes of the group's limit (set or clear).
    pub limit_changes: u8,
    /// Lease extensions.
    pub extends: u8,
    /// Snoozes (a snooze gives the attempt back, so it alone could go on for ever).
    pub snoozes: u8,
}

/// What happened on the path that the properties look at: events, not columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// A settle (ack, fail, snooze, release, extend) changed a row whose lease was not the
    /// settling delivery's.
    pub stale_settle: bool,
    /// A claim of a limited group left more messages of it under live leases than its
    /// limit, not counting leases renewed after they ran out.
    pub limit_overrun: bool,
    /// The same, counting every live lease.
    pub limit_overrun_revived: bool,
    /// A claim or a hand-off took a message of a paused group.
    pub paused_take: bool,
    /// A cancelled message was claimed or handed off again.
    pub cancelled_taken: bool,
    /// A bit per message: claimed (or handed off) at least once.
    pub claimed: u8,
}

/// The whole state of the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Each message's row, by index (publish order).
    pub rows: Vec<Row>,
    /// What each consumer holds, kept sorted (the order means nothing).
    pub consumers: Vec<Vec<Held>>,
    /// The group is paused (a row of `<table>_pause`).
    pub paused: bool,
    /// The group's `max_running` (a row of `<table>_limits`), if set.
    pub limit: Option<u8>,
    /// Bounded events left.
    pub budget: Budget,
    /// Observations.
    pub ghost: Ghost,
}

impl State {
    /// How message `m` looks.
    pub fn look(&self, m: usize) -> Look {
        match self.rows[m] {
            Row::Unpublished => Look::Unpublished,
            Row::Done => Look::Done,
            Row::Dead => Look::Dead,
            Row::Cancelled => Look::Cancelled,
            Row::Queued(q) => match q.lease {
                None if q.visible => Look::Ready,
                None => Look::Delayed,
                Some(lease) => {
                    let unstarted =
                        self.held().any(|(_, h)| usize::from(h.msg) == m && h.current && !h.started);
                    if unstarted { Look::HandedOff } else { Look::Leased { live: lease.live } }
                }
            },
        }
    }

    /// Every delivery held, with its consumer.
    pub fn held(&self) -> impl Iterator<Item = (usize, &Held)> {
        self.consumers.iter().enumerate().flat_map(|(c, held)| held.iter().map(move |h| (c, h)))
    }

    /// The row of message `m`, if it is in the queue table.
    pub fn queued(&self, m: usize) -> Option<&Queued> {
        match &self.rows[m] {
            Row::Queued(q) => Some(q),
            _ => None,
        }
    }

    /// Messages of the group under a live lease: what a limit counts as running.
    pub fn live_leases(&self) -> usize {
        (0..self.rows.len()).filter(|&m| self.queued(m).and_then(|q| q.lease).is_some_and(|l| l.live)).count()
    }

    /// [`live_leases`](Self::live_leases) less those renewed after they ran out.
    pub fn live_leases_unrevived(&self) -> usize {
        (0..self.rows.len())
            .filter(|&m| self.queued(m).and_then(|q| q.lease).is_some_and(|l| l.live && !l.revived))
            .count()
    }

    /// The state with its consumers in order: consumers are alike, so a state and the one
    /// with two consumers' holdings swapped behave alike, and the checker visits one of
    /// them (symmetry reduction).
    pub fn representative(&self) -> State {
        let mut s = self.clone();
        s.consumers.sort_unstable();
        s
    }

    /// Whether message `m` was ever claimed or handed off.
    pub fn was_claimed(&self, m: usize) -> bool {
        self.ghost.claimed & (1 << m) != 0
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for m in 0..self.rows.len() {
            let attempts = self.queued(m).map(|q| format!(" a{}", q.attempts)).unwrap_or_default();
            write!(f, "m{m}:{:?}{attempts} ", self.look(m))?;
        }
        for (c, held) in self.consumers.iter().enumerate() {
            write!(f, "| c{c}:")?;
            for h in held {
                let current = if h.current { "" } else { " stale" };
                let live = if h.live { "live" } else { "expired" };
                let started = if h.started { "" } else { " unstarted" };
                write!(f, " m{} ({live}{current}{started})", h.msg)?;
            }
        }
        if self.paused {
            write!(f, " | paused")?;
        }
        if let Some(n) = self.limit {
            write!(f, " | max_running {n}")?;
        }
        Ok(())
    }
}
