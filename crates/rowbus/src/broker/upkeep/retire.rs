//! Retiring partitions: each look reads which partition publishes fill now and each one's
//! size, and empties those no publish fills any more (neither the current one nor the one
//! before it) that have grown past [`RETIRE_BYTES`]: under the partition's exclusive lock,
//! what still waits in it is moved to the current one (ids, leases and attempts as they
//! are), and `TRUNCATE` gives its space back, whatever holds the horizon.
//!
//! The lock is waited for briefly (statements on the queue queue behind a waiting
//! `LOCK`), and a partition it could not get is looked at again at the next look, then,
//! after several in a row, less often each time (a `pg_dump` holds every table it dumps
//! until it ends). Several brokers
//! may look at once: the lock lets one retire a partition, and the others then find it
//! empty.

use tracing::{debug, info, warn};

use crate::broker::Queue;
use crate::broker::exec::queue_error;
use crate::driver::Arg;
use crate::error::{Error, is_lock_wait};
use crate::sql::{Db, Retire, RotationSql, begin};

/// A partition smaller than this is left as it is: VACUUM keeps it small when nothing
/// holds the horizon, and retiring it would cost catalog rows for little. At 1,000
/// messages a second a partition's heap grows to about 1 MB in its five seconds; at 100
/// a second it reaches this size in its third round while a horizon is held.
const RETIRE_BYTES: i64 = 256 << 10;

/// A partition with more waiting messages than this is left until they are handled: a
/// backlog is not moved from partition to partition.
const MOST_MOVED: i64 = 10_000;

/// Looks without a claim of the queue after which the partitions are left alone: what
/// nobody claims from does not churn.
const IDLE_LOOKS: u32 = 8;

/// Locks that may fail in a row before looks are skipped: a partition's lock is often
/// taken for a moment by autovacuum, which under a held horizon runs on the partitions
/// again and again (and removes nothing); the next look gets it.
const FAILURES_BEFORE_SKIPPING: u32 = 5;

/// Looks skipped after a partition's lock could not be had, at most.
const MOST_SKIPPED: u32 = 64;

/// What one queue's retiring remembers between looks.
#[derive(Debug, Default)]
pub(super) struct Retiring {
    /// Looks since the last pass that saw claims.
    idle: u32,
    /// Per slot: locks that failed in a row, and looks still to skip.
    waits: Vec<(u32, u32)>,
    /// Whether a missing privilege was said (it is said once).
    denied: bool,
}

/// What a retiring transaction found.
#[derive(Debug)]
enum Retired {
    /// Moved what waited (this many) and truncated.
    Done(i64),
    /// Empty already: another broker retired it.
    Empty,
    /// Too many messages wait in it.
    Backlog,
    /// Its lock could not be had within the wait.
    Locked,
}

impl Retiring {
    /// Claims were seen: the partitions churn.
    pub(super) fn active(&mut self) {
        self.idle = 0;
    }

    /// One look at the partitions, retiring what is due.
    pub(super) async fn pass<DB: Db>(&mut self, queue: &Queue<DB>) -> Result<(), Error> {
        let Some(rotation) = &queue.sql.rotation else { return Ok(()) };
        if self.idle >= IDLE_LOOKS {
            return Ok(());
        }
        self.idle += 1;
        let slots = rotation.slots;
        self.waits.resize(slots, (0, 0));
        let rows = {
            let mut conn = queue.inner().pool.acquire().await?;
            DB::fetch_rows(&mut conn, &rotation.look, &[], 0).await.map_err(|e| queue_error(queue, e))?
        };
        let Some(row) = rows.first() else { return Ok(()) };
        let Some(now) = row.ints.first().copied().flatten().and_then(|n| usize::try_from(n).ok()) else {
            return Ok(());
        };
        for slot in 0..slots {
            // Filled now, or just before (a transaction may still write into it).
            if slot == now % slots || slot == (now + slots - 1) % slots {
                continue;
            }
            // NULL: not partitioned (deployed by an older rowbus, not converted yet).
            let Some(Some(size)) = row.ints.get(slot + 1).copied() else { continue };
            if size < RETIRE_BYTES {
                continue;
            }
            let (failed, skip) = &mut self.waits[slot];
            if *skip > 0 {
                *skip -= 1;
                continue;
            }
            let retired = retire(queue, rotation, &rotation.retire[slot]).await;
            debug!(table = %queue.table(), partition = slot, size, ?retired, "retiring");
            match retired {
                Ok(Retired::Locked) => {
                    *failed += 1;
                    if *failed > FAILURES_BEFORE_SKIPPING {
                        *skip = (1u32 << (*failed - FAILURES_BEFORE_SKIPPING).min(6)).min(MOST_SKIPPED);
                    }
                    if *failed == FAILURES_BEFORE_SKIPPING + 1 {
                        info!(
                            table = %queue.table(),
                            partition = slot,
                            "a partition of the queue could not be emptied for a while: another session holds a lock on \
                             it (pg_dump?); trying less often"
                        );
                    }
                }
                Ok(done) => {
                    *failed = 0;
                    if let Retired::Done(moved) = done {
                        queue.inner().counters.retired(moved);
                    }
                }
                Err(error) if error.is_permission_denied() => {
                    if !self.denied {
                        self.denied = true;
                        warn!(
                            table = %queue.table(),
                            error = %error.one_line(),
                            "the queue's partitions cannot be emptied by this role: grant it TRUNCATE, SELECT, \
                             DELETE on them (see docs/operating.md); the queue grows while a transaction elsewhere \
                             holds the horizon"
                        );
                    }
                    *skip = MOST_SKIPPED;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

/// Retires one partition in a transaction of its own.
async fn retire<DB: Db>(queue: &Queue<DB>, rotation: &RotationSql, sql: &Retire) -> Result<Retired, Error> {
    let mut tx = begin(&queue.inner().pool, rotation.begin).await?;
    let retired = async {
        match DB::execute(&mut tx, &sql.lock, &[]).await {
            Err(e) if is_lock_wait(&e) => return Ok(Retired::Locked),
            locked => locked.map_err(|e| queue_error(queue, e))?,
        };
        let rows = DB::fetch_rows(&mut tx, &sql.count, &[Arg::Int(MOST_MOVED + 1)], 0).await?;
        let (size, waiting) = match rows.first().map(|r| &r.ints[..]) {
            Some([Some(size), Some(waiting)]) => (*size, *waiting),
            _ => return Ok(Retired::Empty),
        };
        if size == 0 {
            return Ok(Retired::Empty);
        }
        if waiting > MOST_MOVED {
            return Ok(Retired::Backlog);
        }
        if waiting > 0 {
            DB::execute(&mut tx, &sql.moves, &[]).await?;
        }
        DB::execute(&mut tx, &sql.truncate, &[]).await?;
        Ok::<_, Error>(Retired::Done(waiting))
    }
    .await;
    match retired {
        Ok(Retired::Done(moved)) => {
            tx.commit().await?;
            Ok(Retired::Done(moved))
        }
        other => {
            tx.rollback().await?;
            other
        }
    }
}
