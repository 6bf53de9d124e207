//! What must hold in every state the checker reaches (and, where paths end, what must
//! happen on each of them), and a few things that must be possible at all, so that a
//! bound set too tight does not pass by checking nothing.

use stateright::Property;

use crate::model::Protocol;
use crate::state::{Row, State};

/// Every published message is done, dead, cancelled, or still in the queue where a claim
/// can reach it again: unleased, or leased under a lease the clock can still pass, or held
/// by a delivery that will settle it.
pub const NO_MESSAGE_LOST: &str = "no message lost";
/// A settle by a delivery whose token is no longer the row's (its lease ran out and
/// someone claimed the message, or it was cancelled) changes nothing.
pub const STALE_SETTLE_CHANGES_NOTHING: &str = "a stale holder's settle changes nothing";
/// At most one message of an ordering key is leased at a time.
pub const ONE_PER_KEY: &str = "at most one message per key in flight";
/// A claim of a limited group never leaves more than `max_running` messages of it under
/// live leases, not counting leases their holders renewed after they had run out.
pub const LIMIT_HELD: &str = "a limited group never runs more than its limit";
/// The same, counting every live lease: a lease that ran out, was passed over by the
/// limit's prune or seed, and was then renewed by its holder's `extend` would be counted
/// here. It holds because `extend` refuses a lease that ran out; with
/// [`Rules::extend_ignores_lease_end`](crate::Rules) the checker finds the path that breaks
/// it (see docs/reliability.md).
pub const LIMIT_HELD_COUNTING_RENEWED: &str =
    "a limited group never runs more than its limit, renewed leases counted";
/// A cancelled message is never claimed or handed off again.
pub const CANCELLED_STAYS_CANCELLED: &str = "a cancelled message is never started again";
/// No claim or hand-off takes a message of a paused group.
pub const PAUSED_NOT_CLAIMED: &str = "a paused group is not claimed from";
/// At most one delivery of a message holds a live lease: neither a claim nor a hand-off
/// gives a message to a second runner while the first may still run it.
pub const NEVER_TWICE_AT_ONCE: &str = "a message never runs twice at once";
/// Every message is eventually claimed (or handed off), unless cancelled first: when
/// consumers keep claiming and the clock keeps passing leases.
pub const EVENTUALLY_CLAIMED: &str = "every message is eventually claimed";

/// The properties, with [`EVENTUALLY_CLAIMED`] where `liveness`.
pub fn all(liveness: bool) -> Vec<Property<Protocol>> {
    let mut all = vec![
        Property::always(NO_MESSAGE_LOST, no_message_lost),
        Property::always(STALE_SETTLE_CHANGES_NOTHING, |_, s: &State| !s.ghost.stale_settle),
        Property::always(ONE_PER_KEY, one_per_key),
        Property::always(LIMIT_HELD, |_, s: &State| !s.ghost.limit_overrun),
        Property::always(LIMIT_HELD_COUNTING_RENEWED, |_, s: &State| !s.ghost.limit_overrun_revived),
        Property::always(CANCELLED_STAYS_CANCELLED, |_, s: &State| !s.ghost.cancelled_taken),
        Property::always(PAUSED_NOT_CLAIMED, |_, s: &State| !s.ghost.paused_take),
        Property::always(NEVER_TWICE_AT_ONCE, never_twice_at_once),
        // Reachable at all: bounds that leave these out check less than they claim to.
        Property::sometimes("a message is dead-lettered", |_, s: &State| s.rows.contains(&Row::Dead)),
        Property::sometimes("a stale delivery and a current one of one message", two_holders),
        Property::sometimes("a running message is cancelled", |_, s: &State| {
            s.held().any(|(_, h)| h.live && s.rows[usize::from(h.msg)] == Row::Cancelled)
        }),
        Property::sometimes("a limited group is full", |p: &Protocol, s: &State| {
            s.limit.is_some_and(|n| p.running(s) >= usize::from(n))
        }),
    ];
    if liveness {
        all.push(Property::eventually(EVENTUALLY_CLAIMED, eventually_claimed));
    }
    all
}

/// See [`NO_MESSAGE_LOST`].
fn no_message_lost(p: &Protocol, s: &State) -> bool {
    (0..s.rows.len()).all(|m| match s.rows[m] {
        Row::Unpublished | Row::Done | Row::Dead | Row::Cancelled => true,
        Row::Queued(q) => match q.lease {
            None => true,
            Some(lease) => {
                let holder = s.held().any(|(_, h)| usize::from(h.msg) == m && h.current);
                !lease.live || holder || !p.rules.leases_never_run_out
            }
        },
    })
}

/// See [`ONE_PER_KEY`].
fn one_per_key(p: &Protocol, s: &State) -> bool {
    let keys = p.bounds.messages.iter().filter_map(|spec| spec.key);
    keys.into_iter().all(|k| {
        let leased = (0..s.rows.len())
            .filter(|&m| p.bounds.messages[m].key == Some(k))
            .filter(|&m| s.queued(m).is_some_and(|q| q.lease.is_some()))
            .count();
        leased <= 1
    })
}

/// See [`NEVER_TWICE_AT_ONCE`].
fn never_twice_at_once(_: &Protocol, s: &State) -> bool {
    (0..s.rows.len()).all(|m| s.held().filter(|(_, h)| usize::from(h.msg) == m && h.live).count() <= 1)
}

fn two_holders(_: &Protocol, s: &State) -> bool {
    (0..s.rows.len()).any(|m| {
        let of_m = || s.held().filter(move |(_, h)| usize::from(h.msg) == m);
        of_m().any(|(_, h)| h.current) && of_m().any(|(_, h)| !h.current)
    })
}

/// See [`EVENTUALLY_CLAIMED`].
fn eventually_claimed(_: &Protocol, s: &State) -> bool {
    (0..s.rows.len()).all(|m| s.was_claimed(m) || s.rows[m] == Row::Cancelled)
}
