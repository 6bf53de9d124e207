//! When a message a rate limit let a claim take may start, and the database's clock as
//! this process sees it (see `limited::claim_in`).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// When a message a rated claim took may start: not before `at`, and not after
/// `late_after` (a handler that could not begin by then is given back unstarted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub at: Instant,
    pub late_after: Instant,
}

/// The database's clock as this process sees it: the offset of its own monotonic clock
/// from the database's, the smallest seen (a sample is the time a statement's result
/// arrived here minus the database's time in it, so it is never below the true offset,
/// and over it by that result's way back). The smallest is allowed to grow by a
/// millisecond a second, so that a clock that drifts, or is set back, is followed.
#[derive(Debug)]
pub(crate) struct DbClock {
    base: Instant,
    offset: Mutex<Option<(i64, Instant)>>,
}

impl Default for DbClock {
    fn default() -> Self {
        DbClock { base: Instant::now(), offset: Mutex::new(None) }
    }
}

impl DbClock {
    /// Takes the database's time `db_us` read by a statement whose result arrived at
    /// `arrived`; returns the offset to use (local µs since `base` minus the database's).
    pub(crate) fn sample(&self, db_us: i64, arrived: Instant) -> i64 {
        let local = i64::try_from(arrived.duration_since(self.base).as_micros()).unwrap_or(i64::MAX);
        let seen = local.saturating_sub(db_us);
        let mut offset = self.offset.lock().unwrap_or_else(|e| e.into_inner());
        let best = match *offset {
            Some((best, at)) => {
                let drift =
                    i64::try_from(arrived.saturating_duration_since(at).as_millis()).unwrap_or(i64::MAX);
                seen.min(best.saturating_add(drift))
            }
            None => seen,
        };
        *offset = Some((best, arrived));
        best
    }

    /// The local instant of the database's time `db_us`, given `offset`.
    pub(crate) fn local(&self, db_us: i64, offset: i64) -> Instant {
        let local = db_us.saturating_add(offset).max(0);
        self.base + Duration::from_micros(local.unsigned_abs())
    }
}

/// Waits for `slot`, the start a rate gave a message; `false` when this process could not
/// begin its handler by the slot's latest (a runtime or machine too busy): the caller
/// then gives the message back unstarted, and its start stays counted.
pub(crate) async fn begin_at(slot: Slot) -> bool {
    tokio::time::sleep_until(slot.at).await;
    let now = Instant::now();
    if now > slot.late_after {
        tracing::debug!(late = ?now - slot.at, "a rated start came too late; given back");
        return false;
    }
    true
}
