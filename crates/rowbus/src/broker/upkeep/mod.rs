//! Upkeep: what a broker does for the queues it claims from besides claiming, so that a
//! queue keeps its size and its claims their cost while something else in the database
//! holds the horizon open (see `sql::rotation`): it computes the floors its claims of each
//! group start at ([`floors`]), retires the partitions publishes no longer fill
//! ([`retire`]), and checkpoints a log that a reader held elsewhere stops from starting
//! over ([`checkpoint`]).
//!
//! Entered by [`attach`], from a subscription's start (runners, streams, relays): one task
//! per broker and queue, started by the first subscription and stopped with the last; on
//! a database that needs neither, no task. A claim reads its group's floor with
//! [`registry::Upkeeps::floor`], and marks the group claimed from, which is what has the next pass
//! compute it again: a queue nobody claims from costs no statement. The broker keeps the
//! running ones in its [`registry::Upkeeps`].

mod checkpoint;
mod floors;
pub(crate) mod registry;
mod retire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::warn;

use crate::broker::Queue;
use crate::error::Error;
use crate::sql::Db;

use registry::{Entry, FloorCell, Group};

/// How often a pass runs while the queue is claimed from: what a claim may step over
/// behind a floor is what was settled since the last pass (and [`floors::SLACK_US`]), and
/// what becomes claimable behind it (a lease run out, a message given back) waits until
/// the next pass.
const PASS: Duration = Duration::from_millis(250);

/// How many passes between two looks at the partitions, and two checkpoints.
const PASSES_PER_RETIRE: u32 = 4;

/// Keeps its queue's upkeep running in this broker until dropped.
#[derive(Debug)]
pub(crate) struct UpkeepGuard<DB: Db> {
    queue: Queue<DB>,
    group: String,
}

/// Starts `queue`'s upkeep in its broker for `group`, or counts one more user of the
/// running one; `None` where the database needs none.
pub(crate) fn attach<DB: Db>(queue: &Queue<DB>, group: &str) -> Option<UpkeepGuard<DB>> {
    if queue.sql.floor.is_none() && queue.sql.rotation.is_none() && queue.sql.checkpoint.is_none() {
        return None;
    }
    let mut running = queue.inner().upkeep.lock();
    let entry = running.entry(queue.table().clone()).or_insert_with(|| {
        let (groups, stop) = (Arc::new(Mutex::new(HashMap::new())), Arc::new(Notify::new()));
        tokio::spawn(run(queue.clone(), groups.clone(), stop.clone()));
        Entry { users: 0, groups, stop }
    });
    entry.users += 1;
    let mut groups = entry.groups.lock().unwrap_or_else(|e| e.into_inner());
    let upkeep = &queue.inner().upkeep;
    groups
        .entry(group.to_owned())
        .or_insert_with(|| Group {
            users: 0,
            floor: upkeep.take_kept(queue.table(), group).unwrap_or_default(),
        })
        .users += 1;
    Some(UpkeepGuard { queue: queue.clone(), group: group.to_owned() })
}

impl<DB: Db> Drop for UpkeepGuard<DB> {
    fn drop(&mut self) {
        let mut running = self.queue.inner().upkeep.lock();
        let Some(entry) = running.get_mut(self.queue.table()) else { return };
        {
            let mut groups = entry.groups.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(group) = groups.get_mut(&self.group) {
                group.users -= 1;
                if group.users == 0
                    && let Some(group) = groups.remove(&self.group)
                {
                    self.queue.inner().upkeep.keep(self.queue.table(), &self.group, group.floor);
                }
            }
        }
        entry.users -= 1;
        if entry.users == 0 {
            // Stopped between passes, never in one (a statement cut off on MariaDB costs
            // its pool the connection): a subscription that starts meanwhile starts
            // another task, which runs beside the ending one's last pass.
            entry.stop.notify_one();
            running.remove(self.queue.table());
        }
    }
}

/// One queue's passes until stopped or the broker shuts down.
async fn run<DB: Db>(queue: Queue<DB>, groups: Arc<Mutex<HashMap<String, Group>>>, stop: Arc<Notify>) {
    let mut shutdown = queue.inner().shutdown.subscribe();
    let mut retiring = retire::Retiring::default();
    let mut checkpoints = checkpoint::Checkpoints::default();
    let reported = AtomicBool::new(false);
    let mut pass = 0u32;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let claimed: Vec<(String, Arc<FloorCell>)> = {
            let groups = groups.lock().unwrap_or_else(|e| e.into_inner());
            groups
                .iter()
                .filter(|(_, g)| g.floor.take_claimed())
                .map(|(n, g)| (n.clone(), g.floor.clone()))
                .collect()
        };
        let busy = !claimed.is_empty();
        let mut result = Ok(());
        for (group, cell) in claimed {
            if let Err(error) = floors::compute(&queue, &group, &cell).await {
                result = Err(error);
            }
        }
        if busy {
            retiring.active();
        }
        if pass.is_multiple_of(PASSES_PER_RETIRE)
            && let Err(error) = retiring.pass(&queue).await
        {
            result = Err(error);
        }
        if pass.is_multiple_of(PASSES_PER_RETIRE)
            && let Err(error) = checkpoints.pass(&queue).await
        {
            result = Err(error);
        }
        report(&queue, &reported, result);
        pass = pass.wrapping_add(1);
        tokio::select! {
            _ = tokio::time::sleep(PASS) => {}
            _ = stop.notified() => return,
            _ = shutdown.changed() => return,
        }
    }
}

/// Says once that the upkeep fails (until it works again): claims go on from no floor, or
/// from the last, and the queue's partitions are not retired meanwhile.
fn report<DB: Db>(queue: &Queue<DB>, reported: &AtomicBool, result: Result<(), Error>) {
    match result {
        Ok(()) => {
            if reported.swap(false, Ordering::Relaxed) {
                warn!(table = %queue.table(), "the queue's upkeep works again");
            }
        }
        Err(error) => {
            if !reported.swap(true, Ordering::Relaxed) {
                warn!(
                    table = %queue.table(),
                    error = %error.one_line(),
                    "the queue's upkeep failed (claims go on; partitions are not emptied nor logs checkpointed meanwhile); trying again"
                );
            }
        }
    }
}
