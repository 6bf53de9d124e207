//! The schedulers running in this broker, by queue: how many subscriptions hold each, its
//! task, and the signal that has it read the definitions again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::names::QueueTable;

/// The scheduler tasks of one broker, by queue.
#[derive(Debug, Default)]
pub(crate) struct Schedulers {
    running: Mutex<HashMap<QueueTable, Entry>>,
}

#[derive(Debug)]
pub(in crate::broker) struct Entry {
    /// Subscriptions holding it.
    pub(in crate::broker) users: usize,
    /// Ends the task at the end of its pass (a permit: a pass running now ends after).
    pub(in crate::broker) stop: Arc<Notify>,
    /// Read the definitions again now.
    pub(in crate::broker) reread: Arc<Notify>,
}

impl Schedulers {
    /// The running schedulers, by queue.
    pub(in crate::broker) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QueueTable, Entry>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Has this broker's scheduler of queue `table`, if it runs, read the definitions at
    /// once.
    pub(in crate::broker) fn reread(&self, table: &QueueTable) {
        if let Some(entry) = self.lock().get(table) {
            // A permit: a pass running now reads again right after.
            entry.reread.notify_one();
        }
    }
}
