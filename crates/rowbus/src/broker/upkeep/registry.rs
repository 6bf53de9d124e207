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
}

/// One group's floor, whether a claim read it since the last pass, and when it was last
/// computed whole.
#[derive(Debug)]
pub(crate) struct FloorCell {
    floor: Mutex<Floor>,
    claimed: AtomicBool,
    whole: Mutex<Option<Instant>>,
}

impl Default for FloorCell {
    fn default() -> Self {
        FloorCell { floor: Mutex::new(Floor::NONE), claimed: AtomicBool::new(true), whole: Mutex::new(None) }
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

    /// When the floor was last computed whole (`None`: never).
    pub(super) fn full_since(&self) -> Option<Instant> {
        *self.whole.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The floor was computed whole now.
    pub(super) fn computed_whole(&self) {
        *self.whole.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }
}
