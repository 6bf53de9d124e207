//! Rules broken on purpose: the checker must find each, with a path that shows how (under
//! the rules as they are, tests/exhaustive.rs finds none on the same bounds). The paths
//! are printed (`cargo test -p rowbus-model --test broken -- --nocapture`).

use rowbus_model::properties::{
    EVENTUALLY_CLAIMED, LIMIT_HELD_COUNTING_RENEWED, NO_MESSAGE_LOST, STALE_SETTLE_CHANGES_NOTHING,
};
use rowbus_model::{Bounds, Protocol, Rules, find};

/// Finds a counterexample to `property` under `rules`, prints it and returns it.
fn counterexample(bounds: Bounds, rules: Rules, property: &'static str) -> String {
    let found = find(Protocol::with_rules(bounds, rules), property);
    let path = found
        .discovery(property)
        .unwrap_or_else(|| {
            panic!("{rules:?}: no counterexample to \"{property}\" in {} states", found.unique)
        })
        .to_owned();
    println!("{rules:?} breaks \"{property}\" ({} states, {:.1?}):\n{path}", found.unique, found.took);
    path
}

/// An acknowledgement that deletes by id alone lets a holder whose lease ran out delete
/// the message another consumer claimed since and is running.
#[test]
fn an_ack_that_ignores_the_lease_token_settles_another_holders_message() {
    let rules = Rules { ack_ignores_token: true, ..Rules::default() };
    let path = counterexample(Bounds::safety(), rules, STALE_SETTLE_CHANGES_NOTHING);
    let steps: Vec<&str> =
        path.lines().filter(|l| l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit())).collect();
    assert!(steps.last().is_some_and(|s| s.contains("Ack")), "the last step is the stale ack:\n{path}");
    assert!(path.contains("Tick"), "the lease ran out on the way:\n{path}");
    assert!(path.contains("stale"), "a stale delivery acknowledges:\n{path}");
}

/// Without the clock passing leases, a crashed consumer's message is never claimable
/// again: at-least-once rests on leases running out. The safety check sees the row held
/// with nobody to settle it; the liveness check sees a later message of its key never
/// claimed.
#[test]
fn leases_that_never_run_out_lose_a_crashed_consumers_message() {
    let rules = Rules { leases_never_run_out: true, ..Rules::default() };
    let path = counterexample(Bounds::safety(), rules, NO_MESSAGE_LOST);
    assert!(path.contains("Crash"), "a consumer crashed holding it:\n{path}");
    let path = counterexample(Bounds::liveness(), rules, EVENTUALLY_CLAIMED);
    assert!(path.contains("Crash"), "a consumer crashed holding the key's first message:\n{path}");
}

/// An extension that renews a lease that ran out (its `WHERE` without `lease_until > now`)
/// lets a holder that stalled past its lease run beside the message a limited claim took
/// meanwhile: the limit counts only unexpired leases, its prune and its seed pass over a
/// run-out one, and the renewal comes after. The gap rowbus had before its extension
/// refused run-out leases.
#[test]
fn an_extension_that_ignores_the_lease_end_runs_past_a_limit() {
    let rules = Rules { extend_ignores_lease_end: true, ..Rules::default() };
    let path = counterexample(Bounds::keys(), rules, LIMIT_HELD_COUNTING_RENEWED);
    let steps: Vec<&str> =
        path.lines().filter(|l| l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit())).collect();
    assert!(steps.last().is_some_and(|s| s.contains("Claim")), "the last step is the limited claim:\n{path}");
    let (tick, extend) = (path.find("Tick"), path.find("Extend"));
    assert!(
        tick.is_some_and(|t| extend.is_some_and(|e| t < e)),
        "the lease ran out, then was renewed:\n{path}"
    );
    assert!(path.contains("SetLimit"), "a limit is set on the way:\n{path}");
}
