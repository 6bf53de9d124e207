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
    /// The floors of groups no subscription claims from any more, for the next one: a new
    /// subscription's first claims start there rather than at the group's start, which
    /// under a held snapshot on MariaDB is every delete-marked record of the messages
    /// handled before (a drain of 20,000 after ten minutes of churn ran at 0.45 times a
    /// fresh queue's while each subscription began without its floor).
    kept: Mutex<HashMap<(QueueTable, String), Arc<FloorCell>>>,
}

/// How many groups' floors [`Upkeeps`] keeps once no subscription claims from them: past
/// that, all are let go.
const KEPT_FLOORS: usize = 1024;

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

    /// The floor `group` of `table` had when its last subscription ended, if kept.
    pub(super) fn take_kept(&self, table: &QueueTable, group: &str) -> Option<Arc<FloorCell>> {
        let cell =
            self.kept.lock().unwrap_or_else(|e| e.into_inner()).remove(&(table.clone(), group.to_owned()))?;
        // Computed again at the next pass (a step, or whole if the last whole one is old).
        cell.claimed.store(true, Ordering::Relaxed);
        Some(cell)
    }

    /// Keeps the floor of `group` of `table`, whose last subscription ended.
    pub(super) fn keep(&self, table: &QueueTable, group: &str, cell: Arc<FloorCell>) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= KEPT_FLOORS {
            kept.clear();
        }
        kept.insert((table.clone(), group.to_owned()), cell);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_s_floor_outlives_its_last_subscription_for_the_next() {
        let upkeeps = Upkeeps::default();
        let table: QueueTable = "jobs".parse().unwrap();
        let cell = Arc::new(FloorCell::default());
        let floor = Floor { priority: 0, visible_us: 42, others_us: 40, others: false };
        cell.set(floor);
        cell.update_steps(|s| s.now_us = 99);
        assert!(cell.take_claimed());
        upkeeps.keep(&table, "g", cell);
        assert!(upkeeps.take_kept(&table, "other").is_none(), "another group's is not this one's");
        let kept = upkeeps.take_kept(&table, "g").expect("kept");
        assert_eq!((kept.get(), kept.steps().now_us), (floor, 99));
        assert!(kept.take_claimed(), "computed again at the next pass");
        assert!(upkeeps.take_kept(&table, "g").is_none(), "taken once");
    }
}
