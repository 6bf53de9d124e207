//! This broker's view of a queue's keep setting: whether handled messages go to its
//! history table, and whether this broker's cleanup of it runs.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// This broker's view of one queue's keep setting.
#[derive(Debug, Default)]
pub(crate) struct Keeping {
    /// The keep duration in µs; 0 while the queue keeps nothing.
    pub(in crate::broker) keep_us: AtomicI64,
    /// Whether this broker's cleanup of the queue runs.
    pub(in crate::broker) cleaning: AtomicBool,
}

impl Keeping {
    /// Whether handled messages go to the history table.
    pub fn on(&self) -> bool {
        self.keep_us.load(Ordering::Relaxed) > 0
    }

    /// Sets the keep duration (µs; negative as 0).
    pub(in crate::broker) fn set(&self, keep_us: i64) {
        self.keep_us.store(keep_us.max(0), Ordering::Relaxed);
    }
}
