//! The claim protocol of rowbus as a model, explored exhaustively.
//!
//! Each [`Action`] of [`Protocol`] is one statement (or transaction) of
//! `crates/rowbus/src/sql`, with the conditions its SQL has and the effect it has on a
//! row: the claim's `WHERE` (visible, unleased or lease run out, not paused, key free, not
//! limited or room under the limit), the settles' `WHERE id = ? AND lease = ?`, the
//! hand-off's insert, the cancel, the pause and limits tables. Beside them the clock
//! (which passes a message's deadline, [`Action::Tick`]), crashes and operators act, all
//! interleaved in every order the bounds allow.
//!
//! How it is entered:
//!
//! - `cargo test -p rowbus-model` explores the bounds of [`Bounds::safety`],
//!   [`Bounds::keys`] and [`Bounds::liveness`] with [`check`], asserts every property of
//!   [`properties`], runs the protocol with a rule broken on purpose ([`Rules`]) and
//!   asserts that the checker finds it (printing the trace), and drives the real library on
//!   PostgreSQL, MariaDB and SQLite with random steps, replaying what it saw through
//!   [`replay::Replay`].
//! - From code: `Protocol::new(Bounds::safety()).checker().spawn_bfs().join()`, as
//!   stateright's checkers go, or [`check`] for the counts.
//!
//! What the model leaves out is listed in docs/reliability.md.

pub mod model;
pub mod properties;
pub mod replay;
pub mod state;

use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

pub use model::{Action, Bounds, Protocol, Rules};
pub use state::{Budget, Held, Lease, Look, Queued, Row, Spec, State};

/// What an exhaustive check found.
#[derive(Debug)]
pub struct Checked {
    /// States visited (with repeats, as stateright counts them).
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// The longest path explored.
    pub depth: usize,
    /// How long it took.
    pub took: Duration,
    /// For each property with a discovery (a counterexample of an `always` or
    /// `eventually` property, an example of a `sometimes` one), its name and the path to it,
    /// one line per step.
    pub discoveries: Vec<(&'static str, String)>,
}

impl Checked {
    /// The path found for property `name`, if any.
    pub fn discovery(&self, name: &str) -> Option<&str> {
        self.discoveries.iter().find(|(n, _)| *n == name).map(|(_, path)| path.as_str())
    }
}

/// Explores every state of `protocol` depth first on two threads, one of each pair of
/// states that differ only by which consumer holds what ([`State::representative`]).
pub fn check(protocol: Protocol) -> Checked {
    let started = Instant::now();
    let checker = protocol.checker().threads(2).symmetry_fn(State::representative).spawn_dfs().join();
    checked(&checker, started)
}

/// Explores `protocol` breadth first on two threads until property `name` has a
/// discovery (or every state is explored): the path found is a shortest one.
pub fn find(protocol: Protocol, name: &'static str) -> Checked {
    let started = Instant::now();
    let stop = HasDiscoveries::AnyOf([name].into_iter().collect());
    let checker = protocol.checker().threads(2).finish_when(stop).spawn_bfs().join();
    checked(&checker, started)
}

fn checked(checker: &impl Checker<Protocol>, started: Instant) -> Checked {
    let took = started.elapsed();
    let mut discoveries: Vec<(&'static str, String)> =
        checker.discoveries().into_iter().map(|(name, path)| (name, trace(&path.into_vec()))).collect();
    discoveries.sort();
    Checked {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        took,
        discoveries,
    }
}

/// A path as lines: the state, then each action and the state it led to.
fn trace(steps: &[(State, Option<Action>)]) -> String {
    let mut out = String::new();
    for (i, (state, action)) in steps.iter().enumerate() {
        if i == 0 {
            out.push_str(&format!("   start: {state}\n"));
        }
        if let (Some(action), Some((next, _))) = (action, steps.get(i + 1)) {
            out.push_str(&format!("{:>3}. {action:?}\n     -> {next}\n", i + 1));
        }
    }
    out
}
