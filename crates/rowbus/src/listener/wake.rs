//! How a listener learns of new notifications, and what that has cost: what
//! [`Listener::wake_stats`](super::Listener::wake_stats) reports.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::warn;

/// How a listener learns of new notifications.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WakePath {
    /// Connecting: not known yet.
    Connecting,
    /// PostgreSQL's LISTEN (durable channels: the notify table, polled when LISTEN wakes it).
    Listen,
    /// Pushed: another session's commit is reported at once, and only then is the notify
    /// table read. `via` names what reports it: `"the binary log"` (MySQL/MariaDB), `"a
    /// watch on the database's files"` (SQLite).
    Pushed {
        /// What reports commits.
        via: &'static str,
    },
    /// Polling the notify table every poll interval (on SQLite: reading `PRAGMA
    /// data_version` every poll interval, and the table when it changed), because there
    /// is no push path: `reason` says why (the listener's log says it once too).
    Polling {
        /// Why there is no push path.
        reason: String,
    },
}

/// What a listener's wake-ups have cost so far: [`Listener::wake_stats`](super::Listener::wake_stats).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WakeStats {
    /// How it learns of new notifications now.
    pub path: WakePath,
    /// Statements that read the notify table for new notifications (polls), over every
    /// connection of the listener's life.
    pub polls: u64,
    /// Commits its push path reported (several reported together count once).
    pub pushes: u64,
    /// Reads of SQLite's `PRAGMA data_version` (no table, no page read).
    pub version_checks: u64,
    /// Times its push path was lost once open (it polled until the path was back).
    pub push_losses: u64,
    /// Notifications the polls delivered.
    pub delivered: u64,
}

/// The counters behind [`WakeStats`], shared by the listener and its sessions.
#[derive(Debug)]
pub(crate) struct WakeCounters {
    path: Mutex<WakePath>,
    /// The last reason for polling the log said: a new session refused for the same
    /// reason says nothing.
    said: Mutex<Option<String>>,
    polls: AtomicU64,
    pushes: AtomicU64,
    version_checks: AtomicU64,
    push_losses: AtomicU64,
    delivered: AtomicU64,
}

impl Default for WakeCounters {
    fn default() -> Self {
        WakeCounters {
            path: Mutex::new(WakePath::Connecting),
            said: Mutex::new(None),
            polls: AtomicU64::new(0),
            pushes: AtomicU64::new(0),
            version_checks: AtomicU64::new(0),
            push_losses: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
        }
    }
}

/// Adds one to `counter`.
fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl WakeCounters {
    pub fn snapshot(&self) -> WakeStats {
        WakeStats {
            path: self.path.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            polls: self.polls.load(Ordering::Relaxed),
            pushes: self.pushes.load(Ordering::Relaxed),
            version_checks: self.version_checks.load(Ordering::Relaxed),
            push_losses: self.push_losses.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
        }
    }

    pub fn set(&self, path: WakePath) {
        *self.path.lock().unwrap_or_else(|e| e.into_inner()) = path;
    }

    /// Polls from now on, for `reason`: said in the log once per reason.
    pub fn polling(&self, reason: String, poll_interval: std::time::Duration) {
        let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        if said.as_deref() != Some(reason.as_str()) {
            warn!(%reason, ?poll_interval, "listener has no push path: polling the notify table every poll interval");
            *said = Some(reason.clone());
        }
        self.set(WakePath::Polling { reason });
    }

    /// Pushed from now on: a later refusal is said again.
    pub fn pushed(&self, via: &'static str) {
        *self.said.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.set(WakePath::Pushed { via });
    }

    pub fn poll(&self, delivered: usize) {
        bump(&self.polls);
        self.delivered.fetch_add(delivered as u64, Ordering::Relaxed);
    }

    pub fn push(&self) {
        bump(&self.pushes);
    }

    pub fn version_check(&self) {
        bump(&self.version_checks);
    }

    pub fn version_check_if(&self, checked: bool) {
        if checked {
            self.version_check();
        }
    }

    pub fn push_lost(&self) {
        bump(&self.push_losses);
    }
}
