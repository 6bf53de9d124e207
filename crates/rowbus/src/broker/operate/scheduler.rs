//! Running a queue's schedules: one task per broker and queue, started by the first
//! subscription of that queue that has schedules on and stopped with the last.
//!
//! Each pass reads the database's clock, asks [`ticks`](crate::broker::operate::ticks) which ticks are
//! due, and publishes each in a transaction that first records the tick under the key
//! `(schedule, tick)`: a broker whose record hits the key (another published it) or finds
//! the definition changed publishes nothing. Then it sleeps until the next tick of any
//! schedule, or until the definitions are read again
//! ([`BrokerOptions::schedule_reread`](crate::broker::BrokerOptions::schedule_reread)), or
//! until this broker changes a schedule; never in a loop that does not wait.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::broker::operate::schedule::{Stored, db_now, decode, schedule_error};
use crate::broker::operate::schedulers::Entry;
use crate::broker::operate::ticks::HORIZON_US;
use crate::broker::{Message, Queue};
use crate::driver::Arg;
use crate::error::{Error, is_retryable};
use crate::sql::Db;

/// How long tick rows are kept (the latest of each schedule always): ten times the
/// horizon within which a running broker may still publish an older tick, so that the
/// row that turns it away is still there.
const RETENTION_US: i64 = 10 * HORIZON_US;
/// Tries of a tick's transaction that deadlocked.
const DEADLOCK_TRIES: usize = 10;

/// Keeps its queue's scheduler running in this broker until dropped.
#[derive(Debug)]
pub(crate) struct SchedulerGuard<DB: Db> {
    queue: Queue<DB>,
}

/// Starts `queue`'s scheduler in its broker, or counts one more user of the running one.
pub(crate) fn attach<DB: Db>(queue: &Queue<DB>) -> SchedulerGuard<DB> {
    let mut running = queue.inner().schedulers.lock();
    match running.get_mut(queue.table()) {
        Some(entry) => entry.users += 1,
        None => {
            let (reread, stop) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
            tokio::spawn(run(queue.clone(), reread.clone(), stop.clone()));
            running.insert(queue.table().clone(), Entry { users: 1, stop, reread });
        }
    }
    SchedulerGuard { queue: queue.clone() }
}

impl<DB: Db> Drop for SchedulerGuard<DB> {
    fn drop(&mut self) {
        let mut running = self.queue.inner().schedulers.lock();
        if let Some(entry) = running.get_mut(self.queue.table()) {
            entry.users -= 1;
            if entry.users == 0 {
                // Stopped between passes, never in one: sqlx's MySQL driver does not
                // recover a connection whose statement was cut off while its answer was
                // being read; the pool then waited for that connection for good. A
                // subscription that starts meanwhile starts another task, which runs
                // beside the ending one's last pass as another broker's would.
                entry.stop.notify_one();
                running.remove(self.queue.table());
            }
        }
    }
}

/// A schedule as this scheduler runs it.
struct Running {
    stored: Stored,
    /// The tick up to which this broker has handled the schedule (µs); `None` until its
    /// first pass.
    cursor: Option<i64>,
    /// The latest tick this broker published since its last cleanup.
    published: Option<i64>,
}

/// What one scheduler keeps between passes.
struct State {
    schedules: HashMap<String, Running>,
    /// When the definitions were last read.
    read_at: Option<Instant>,
}

async fn run<DB: Db>(queue: Queue<DB>, reread: Arc<Notify>, stop: Arc<Notify>) {
    let inner = queue.inner().clone();
    let mut shutdown = inner.shutdown.subscribe();
    let every = inner.options.schedule_reread;
    let mut state = State { schedules: HashMap::new(), read_at: None };
    let mut reported: Option<String> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let wait = match pass(&queue, &mut state, every).await {
            Ok(wait) => {
                if reported.take().is_some() {
                    info!(table = %queue.table(), "schedules run again");
                }
                wait
            }
            Err(error) => {
                // Said once per distinct failure: a queue deployed before schedules, or a
                // role without the grants, fails the same way at every re-read.
                let line = error.one_line();
                if reported.as_deref() != Some(line.as_str()) {
                    warn!(table = %queue.table(), error = %line, "schedules cannot run; trying again at each re-read");
                    reported = Some(line);
                }
                state.read_at = None;
                every
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = reread.notified() => state.read_at = None,
            _ = stop.notified() => return,
            _ = shutdown.changed() => return,
        }
    }
}

/// Reads the definitions if due, publishes the due ticks, cleans up; how long to sleep.
async fn pass<DB: Db>(queue: &Queue<DB>, state: &mut State, every: Duration) -> Result<Duration, Error> {
    let mut conn = queue.inner().pool.acquire().await?;
    if state.read_at.is_none_or(|at| at.elapsed() >= every) {
        let now = db_now(queue, &mut conn).await?;
        read(queue, &mut conn, state, now).await?;
        state.read_at = Some(Instant::now());
    }
    let now = db_now(queue, &mut conn).await?;
    let read_now = Instant::now();
    drop(conn);
    let mut next: Option<i64> = None;
    for (name, running) in &mut state.schedules {
        for tick in running.stored.plan.due(running.cursor, now) {
            if publish_tick(queue, name, &running.stored, tick).await? {
                debug!(table = %queue.table(), schedule = name, tick, "published a tick");
                running.published = Some(tick);
            }
            running.cursor = Some(tick);
        }
        running.cursor = Some(running.cursor.map_or(now, |c| c.max(now)));
        if let Some(tick) = running.stored.plan.next_after(now) {
            next = Some(next.map_or(tick, |n| n.min(tick)));
        }
    }
    let until_read = every.saturating_sub(state.read_at.map_or(Duration::ZERO, |at| at.elapsed()));
    let until_tick = next
        .map(|tick| Duration::from_micros((tick - now).unsigned_abs()).saturating_sub(read_now.elapsed()))
        .unwrap_or(until_read);
    // At least a millisecond: a clock read a hair early must not spin.
    Ok(until_read.min(until_tick).max(Duration::from_millis(1)))
}

/// Reads the definitions: a new or changed schedule starts without a cursor (so its
/// latest due tick, if unpublished, goes out once), a removed one is dropped. Cleans up
/// the old ticks of those this broker published.
async fn read<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    state: &mut State,
    now: i64,
) -> Result<(), Error> {
    let sql = &queue.sql.schedule;
    let rows = DB::fetch_rows(conn, &sql.list, &[], 4).await.map_err(|e| schedule_error(queue, e))?;
    let mut fresh = HashMap::with_capacity(rows.len());
    for row in &rows {
        let stored = match decode(row) {
            Ok(stored) => stored,
            Err(error) => {
                warn!(table = %queue.table(), schedule = row.text(0), %error, "skipping a schedule that cannot be read");
                continue;
            }
        };
        let name = stored.name.clone();
        let running = match state.schedules.remove(&name) {
            Some(running) if running.stored.version == stored.version => Running { stored, ..running },
            _ => Running { stored, cursor: None, published: None },
        };
        fresh.insert(name, running);
    }
    state.schedules = fresh;
    for (name, running) in &mut state.schedules {
        if let Some(latest) = running.published.take() {
            cleanup(queue, conn, name, latest.min(now - RETENTION_US)).await?;
        }
    }
    Ok(())
}

/// Deletes at most [`CLEANUP_BATCH`](crate::sql::ScheduleSql) tick rows of `name` older
/// than `before`.
async fn cleanup<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    name: &str,
    before: i64,
) -> Result<(), Error> {
    let sql = &queue.sql.schedule;
    let args = [Arg::Text(name), Arg::Int(before)];
    let bound =
        DB::fetch_rows(conn, &sql.cleanup_bound, &args, 0).await.map_err(|e| schedule_error(queue, e))?;
    let before = bound.first().map_or(before, |row| row.int(0).min(before));
    let deleted = DB::execute(conn, &sql.cleanup, &[Arg::Text(name), Arg::Int(before)])
        .await
        .map_err(|e| schedule_error(queue, e))?;
    debug!(table = %queue.table(), schedule = name, deleted, "cleaned up old ticks");
    Ok(())
}

/// Publishes tick `tick` of schedule `name` unless it is published already or the
/// schedule changed: whether this call published it.
async fn publish_tick<DB: Db>(
    queue: &Queue<DB>,
    name: &str,
    stored: &Stored,
    tick: i64,
) -> Result<bool, Error> {
    let mut tries = 0;
    loop {
        tries += 1;
        match try_tick(queue, name, stored, tick).await {
            Err(Error::Database(e)) if is_retryable(&e) && tries < DEADLOCK_TRIES => continue,
            done => return done,
        }
    }
}

/// Publishes the next tick of each of `queue`'s schedules now, ahead of its time: the
/// test harness's way to run a schedule without waiting for it. Each is recorded as any
/// tick is, so that no scheduler publishes it again when its time comes. The names of the
/// schedules whose tick this call published.
#[cfg(feature = "testing")]
pub(crate) async fn publish_next_ticks<DB: Db>(queue: &Queue<DB>) -> Result<Vec<String>, Error> {
    let mut conn = queue.inner().pool.acquire().await?;
    let now = db_now(queue, &mut conn).await?;
    let rows = DB::fetch_rows(&mut conn, &queue.sql.schedule.list, &[], 4)
        .await
        .map_err(|e| schedule_error(queue, e))?;
    drop(conn);
    let mut published = Vec::new();
    for row in &rows {
        let stored = decode(row)?;
        let after = stored.last_tick.map_or(now, |last| last.max(now));
        if let Some(tick) = stored.plan.next_after(after)
            && publish_tick(queue, &stored.name, &stored, tick).await?
        {
            published.push(stored.name.clone());
        }
    }
    Ok(published)
}

/// The header naming the schedule a tick's message comes from.
pub const SCHEDULE_HEADER: &str = "rowbus-schedule";
/// The header holding a tick's time, in microseconds since the Unix epoch.
pub const TICK_HEADER: &str = "rowbus-tick-us";

/// One transaction: record the tick (nothing when its key is taken or the definition
/// changed), then publish its message through the library's publish, then commit.
async fn try_tick<DB: Db>(queue: &Queue<DB>, name: &str, stored: &Stored, tick: i64) -> Result<bool, Error> {
    let mut tx = queue.broker().begin().await?;
    let args = [Arg::Text(name), Arg::Int(tick), Arg::Text(name), Arg::Int(stored.version)];
    let recorded =
        DB::execute(&mut tx, &queue.sql.schedule.tick, &args).await.map_err(|e| schedule_error(queue, e))?;
    if recorded == 0 {
        tx.rollback().await?;
        return Ok(false);
    }
    let schedule = &stored.schedule;
    // The handler learns which schedule and which tick (µs since the epoch, the database's
    // clock) it runs for: a tick published late, after a stop, still says its time.
    let message = Message::text(schedule.payload.clone())
        .group(schedule.group.clone())
        .header(SCHEDULE_HEADER, name)
        .header(TICK_HEADER, tick.to_string());
    tx.publish(queue, message).await?;
    tx.commit().await?;
    Ok(true)
}
