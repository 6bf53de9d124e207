//! The upkeep the broker runs, by queue: which groups its subscriptions claim from and
//! their floors. Apart from the tasks (`upkeep`'s `mod.rs`), so that the broker holds it
//! without knowing them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::names::QueueTable;
use crate::sql::Floor;

/// The upkeep tasks of one broker, by queue.
#[derive(Debug, Default)]
pub(crate) struct Upkeeps {
    running: Mutex<HashMap<QueueTable, Entry>>,
}

#[derive(Debug)]
pub(super) struct Entry {
    /// Subscriptions holding it.
    pub users: usize,
    /// The groups claimed from, with their subscriptions and floors.
    pub groups: Arc<Mutex<HashMap<String, Group>>>,
    /// Ends the task at the end of its pass.
    pub stop: Arc<Notify>,
}

/// One group claimed from: its subscriptions, and its floor.
#[derive(Debug)]
pub(super) struct Group {
    pub users: usize,
    pub floor: Arc<FloorCell>,
}

impl Upkeeps {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QueueTable, Entry>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where a claim of `group` of `table` starts, and marks it claimed from:
    /// [`Floor::NONE`] while no pass computed one.
    pub(crate) fn floor(&self, table: &QueueTable, group: &str) -> Floor {
        let running = self.lock();
        let Some(entry) = running.get(table) else { return Floor::NONE };
        let groups = entry.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.get(group).map_or(Floor::NONE, |g| g.floor.claimed())
    }

    /// This broker publishes messages of `group` of `table` at `priority`: where its floor
    /// had found none waiting at another priority than its own, a claim reads them again
    /// at once rather than after the next pass. (Another process's publishes are found by
    /// the next pass.)
    pub(crate) fn published(&self, table: &QueueTable, group: &str, priority: i16) {
        let running = self.lock();
        let Some(entry) = running.get(table) else { return };
        let groups = entry.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = groups.get(group) {
            let mut floor = g.floor.floor.lock().unwrap_or_else(|e| e.into_inner());
            if *floor != Floor::NONE && floor.priority != priority {
                floor.others = true;
            }
        }
    }
}

/// One group's floor, whether a claim read it since the last pass, and when it was last
/// computed whole.
#[derive(Debug)]
pub(crate) struct FloorCell {
    floor: Mutex<Floor>,
    claimed: AtomicBool,
    steps: Mutex<Steps>,
}

/// What decides between a step and a whole computation of a floor.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Steps {
    /// When the floor was last computed whole (`None`: never).
    pub whole_at: Option<Instant>,
    /// The earliest lease end (µs) of the rows held by a lease behind the floor, as
    /// known: once the database's clock passed it, a step cannot find them.
    pub lease_end_us: Option<i64>,
    /// The database's clock at the last computation, µs.
    pub now_us: i64,
}

impl Default for FloorCell {
    fn default() -> Self {
        FloorCell { floor: Mutex::new(Floor::NONE), claimed: AtomicBool::new(true), steps: Mutex::default() }
    }
}

impl FloorCell {
    /// The floor, for a claim: marks the group claimed from.
    pub(super) fn claimed(&self) -> Floor {
        self.claimed.store(true, Ordering::Relaxed);
        *self.floor.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a claim read the floor since the last call.
    pub(super) fn take_claimed(&self) -> bool {
        self.claimed.swap(false, Ordering::Relaxed)
    }

    pub(super) fn get(&self) -> Floor {
        *self.floor.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn set(&self, floor: Floor) {
        *self.floor.lock().unwrap_or_else(|e| e.into_inner()) = floor;
    }

    /// What the last computations left for the next to decide on.
    pub(super) fn steps(&self) -> Steps {
        *self.steps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes what the next computation decides on.
    pub(super) fn update_steps(&self, change: impl FnOnce(&mut Steps)) {
        change(&mut self.steps.lock().unwrap_or_else(|e| e.into_inner()));
    }
}
