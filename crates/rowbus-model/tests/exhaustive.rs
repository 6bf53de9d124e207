//! The exhaustive checks: every state within the bounds, every property.
//!
//! The bounds and counts are printed (`cargo test -p rowbus-model --test exhaustive --
//! --nocapture`); docs/reliability.md quotes them.

use rowbus_model::properties::{
    CANCELLED_STAYS_CANCELLED, EVENTUALLY_CLAIMED, LIMIT_HELD, LIMIT_HELD_COUNTING_RENEWED,
    NEVER_TWICE_AT_ONCE, NO_MESSAGE_LOST, ONE_PER_KEY, PAUSED_NOT_CLAIMED, STALE_SETTLE_CHANGES_NOTHING,
};
use rowbus_model::{Bounds, Checked, Protocol, check};

/// The safety properties every bound set must keep.
const SAFETY: [&str; 8] = [
    NO_MESSAGE_LOST,
    STALE_SETTLE_CHANGES_NOTHING,
    ONE_PER_KEY,
    LIMIT_HELD,
    LIMIT_HELD_COUNTING_RENEWED,
    CANCELLED_STAYS_CANCELLED,
    PAUSED_NOT_CLAIMED,
    NEVER_TWICE_AT_ONCE,
];

fn explore(name: &str, bounds: Bounds) -> Checked {
    println!("{name}: {bounds:?}");
    let checked = check(Protocol::new(bounds));
    println!(
        "{name}: {} states visited, {} distinct, depth {}, {:.1?}",
        checked.states, checked.unique, checked.depth, checked.took
    );
    for property in SAFETY {
        if let Some(path) = checked.discovery(property) {
            panic!("{name}: \"{property}\" does not hold:\n{path}");
        }
    }
    checked
}

/// Things the bounds must reach, or they check less than they say.
fn assert_reached(name: &str, checked: &Checked, examples: &[&str]) {
    for example in examples {
        assert!(checked.discovery(example).is_some(), "{name}: never reached \"{example}\"");
    }
}

#[test]
fn claims_settles_hand_offs_cancels_pauses_and_limits_keep_every_safety_property() {
    let checked = explore("safety", Bounds::safety());
    assert!(checked.unique > 500_000, "the bounds explore less than they used to: {}", checked.unique);
    assert_reached(
        "safety",
        &checked,
        &[
            "a message is dead-lettered",
            "a stale delivery and a current one of one message",
            "a running message is cancelled",
            "a limited group is full",
        ],
    );
}

#[test]
fn two_ordering_keys_keep_every_safety_property() {
    let checked = explore("keys", Bounds::keys());
    assert!(checked.unique > 450_000, "the bounds explore less than they used to: {}", checked.unique);
    assert_reached(
        "keys",
        &checked,
        &["a stale delivery and a current one of one message", "a limited group is full"],
    );
}

#[test]
fn every_message_is_eventually_claimed_when_handlers_finish_within_their_lease() {
    let checked = explore("liveness", Bounds::liveness());
    if let Some(path) = checked.discovery(EVENTUALLY_CLAIMED) {
        panic!("a message is never claimed:\n{path}");
    }
    assert_reached("liveness", &checked, &["a message is dead-lettered", "a limited group is full"]);
}
