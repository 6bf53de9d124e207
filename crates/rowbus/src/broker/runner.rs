//! Runners: a subscription driven for you, with N handlers at once, a batch handler, or a
//! transactional handler; all stop at the broker's shutdown.

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt as _;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{Instrument as _, info_span, warn};

use super::acks::PendingAcks;
use super::delivery::Lease;
use super::subscription::{Claimer, SubscriptionBuilder};
use super::{Delivery, Inner, Outcome, Queue, ops};
use crate::backend::Backend;
use crate::db::Db;
use crate::error::Error;

/// Counts a runner as running until dropped, so that shutdown can wait for it.
pub(super) struct Running<DB: Db>(Arc<Inner<DB>>);

impl<DB: Db> Running<DB> {
    pub(super) fn new(inner: &Arc<Inner<DB>>) -> Self {
        inner.running.fetch_add(1, Ordering::AcqRel);
        Running(inner.clone())
    }
}

impl<DB: Db> Drop for Running<DB> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
        self.0.ended.notify_waiters();
    }
}

/// A handler's result, with a panic turned into a failure.
pub(super) async fn outcome<F, O, E>(handler: F) -> Result<Outcome, String>
where
    F: Future<Output = Result<O, E>>,
    O: Into<Outcome>,
    E: Display,
{
    match AssertUnwindSafe(handler).catch_unwind().await {
        Ok(Ok(o)) => Ok(o.into()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("the handler panicked: {what}"))
        }
    }
}

/// Free workers: waits for one, then takes every other free one too.
pub(super) async fn free_workers(semaphore: &Arc<Semaphore>, max: usize) -> Vec<OwnedSemaphorePermit> {
    let first = semaphore.clone().acquire_owned().await.expect("the semaphore is never closed");
    let mut permits = vec![first];
    while permits.len() < max {
        match semaphore.clone().try_acquire_owned() {
            Ok(permit) => permits.push(permit),
            Err(_) => break,
        }
    }
    permits
}

/// Handlers spawned but not yet begun. A claim waits for them to begin before it counts
/// free workers: on a busy runtime the claim loop is woken by the first handler to finish
/// while the others, runnable, still wait their turn, and a claim would take a row or two
/// where a moment later it would have taken one per worker.
#[derive(Default)]
struct Starting {
    count: Arc<AtomicUsize>,
    begun: Arc<Notify>,
}

/// Held by a handler until it begins.
struct Begun {
    count: Arc<AtomicUsize>,
    begun: Arc<Notify>,
}

impl Starting {
    fn spawned(&self) -> Begun {
        self.count.fetch_add(1, Ordering::AcqRel);
        Begun { count: self.count.clone(), begun: self.begun.clone() }
    }

    /// Returns once every handler spawned so far has begun (or was dropped unstarted).
    async fn wait(&self) {
        loop {
            let begun = self.begun.notified();
            tokio::pin!(begun);
            begun.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            begun.await;
        }
    }
}

impl Drop for Begun {
    fn drop(&mut self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.begun.notify_waiters();
        }
    }
}

/// One message's handler on its worker; an acknowledgement joins others in one statement.
async fn handle<DB, F, Fut, O, E>(
    handler: Arc<F>,
    acks: Arc<PendingAcks>,
    delivery: Delivery<DB>,
    worker: OwnedSemaphorePermit,
    begun: Begun,
) where
    DB: Db,
    F: Fn(Delivery<DB>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    O: Into<Outcome> + Send + 'static,
    E: Display + Send + 'static,
{
    let span = info_span!("rowbus.message", id = delivery.id(), attempt = delivery.attempt());
    async move {
        drop(begun);
        let lease = delivery.lease();
        let result = outcome(handler(delivery)).await;
        match result {
            Ok(Outcome::Ack) if lease.take() => {
                // Pending before the worker is free, so that the claim for that worker
                // carries it: one commit for the acknowledgement and the next claim.
                acks.push([(lease.id(), lease.token())]);
                drop(worker);
            }
            other => {
                drop(worker);
                lease.settle(other).await;
            }
        }
    }
    .instrument(span)
    .await
}

/// A runner's pending acknowledgements, carried by its claimer's claims, and the task that
/// sends those no claim carries.
fn pending_acks<DB: Db>(claimer: &mut Claimer<DB>) -> Flusher {
    // SQLite has one writer: an acknowledgement that rides on the next claim saves a write
    // transaction and its sync. On PostgreSQL and MariaDB it would hold its row locks
    // while the claim runs, and other claims' deletions queue behind them (measured: no
    // faster, and slower for batches of 100 on PostgreSQL).
    let acks = Arc::new(PendingAcks::new(DB::BACKEND == Backend::Sqlite));
    claimer.acks = Some(acks.clone());
    let (pending, queue) = (acks.clone(), claimer.queue.clone());
    let task =
        tokio::spawn(async move { pending.flushed(queue).await }.instrument(info_span!("rowbus.acks")));
    Flusher { acks, task }
}

/// The task that sends acknowledgements no claim carries. Dropped (the runner ended, or
/// its future was dropped), it closes them: the task sends what is left and stops.
struct Flusher {
    acks: Arc<PendingAcks>,
    task: JoinHandle<()>,
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.acks.close();
    }
}

/// After the claim loop: handlers finish (see [`drain`]) while their acknowledgements go
/// out by themselves, then the last of those.
async fn finish(set: &mut JoinSet<()>, timeout: std::time::Duration, mut flusher: Flusher) {
    flusher.acks.idle(true);
    drain(set, timeout).await;
    flusher.acks.close();
    let _ = (&mut flusher.task).await;
}

/// Lets handlers in flight finish within the shutdown timeout; aborts the rest (their
/// messages come back when their leases run out; a transaction rolls back at once).
pub(super) async fn drain(set: &mut JoinSet<()>, timeout: std::time::Duration) {
    let finished = tokio::time::timeout(timeout, async { while set.join_next().await.is_some() {} }).await;
    if finished.is_err() {
        warn!(unfinished = set.len(), "handlers still running at the shutdown deadline; aborting them");
        set.abort_all();
        while set.join_next().await.is_some() {}
    }
}

/// Gives claimed messages back unstarted (claimed while shutdown began).
async fn release_all<DB: Db>(deliveries: Vec<Delivery<DB>>) {
    for delivery in deliveries {
        if let Err(error) = delivery.release().await {
            warn!(%error, "giving a claimed message back failed; it returns when its lease runs out");
        }
    }
}

impl<DB: Db> SubscriptionBuilder<DB> {
    /// Runs `handler` on each message, up to `workers` at once, until the broker shuts
    /// down. Each claim takes a message per free worker. `Ok` acknowledges (or does what
    /// the [`Outcome`] says); `Err` or a panic retries with backoff, then dead-letters.
    pub async fn run<F, Fut, O, E>(self, handler: F) -> Result<(), Error>
    where
        F: Fn(Delivery<DB>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
        O: Into<Outcome> + Send + 'static,
        E: Display + Send + 'static,
    {
        let mut claimer = Claimer::start(&self).await?;
        let _running = Running::new(self.queue.inner());
        let handler = Arc::new(handler);
        let workers = Arc::new(Semaphore::new(self.workers));
        let flusher = pending_acks(&mut claimer);
        let mut set = JoinSet::new();
        let starting = Starting::default();
        loop {
            while set.try_join_next().is_some() {}
            let permits = tokio::select! {
                biased;
                _ = claimer.shutdown.wait_for(|stop| *stop) => break,
                permits = async {
                    starting.wait().await;
                    free_workers(&workers, self.workers).await
                } => permits,
            };
            if !claimer.wait().await {
                break;
            }
            let Ok(deliveries) = claimer.claim(permits.len()).await else { continue };
            if *claimer.shutdown.borrow() {
                release_all(deliveries).await;
                break;
            }
            for (delivery, permit) in deliveries.into_iter().zip(permits) {
                let begun = starting.spawned();
                set.spawn(handle(handler.clone(), flusher.acks.clone(), delivery, permit, begun));
            }
        }
        finish(&mut set, self.shutdown_timeout, flusher).await;
        Ok(())
    }

    /// Runs `handler` on batches of up to `batch` messages, `workers` batches at once.
    /// The outcome applies to the whole batch; an acknowledgement is one statement.
    pub async fn run_batch<F, Fut, O, E>(self, handler: F) -> Result<(), Error>
    where
        F: Fn(Vec<Delivery<DB>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
        O: Into<Outcome> + Send + 'static,
        E: Display + Send + 'static,
    {
        let mut claimer = Claimer::start(&self).await?;
        let _running = Running::new(self.queue.inner());
        let handler = Arc::new(handler);
        let workers = Arc::new(Semaphore::new(self.workers));
        let flusher = pending_acks(&mut claimer);
        let mut set = JoinSet::new();
        loop {
            while set.try_join_next().is_some() {}
            let permit = tokio::select! {
                biased;
                _ = claimer.shutdown.wait_for(|stop| *stop) => break,
                permit = workers.clone().acquire_owned() => permit.expect("never closed"),
            };
            if !claimer.wait().await {
                break;
            }
            let Ok(batch) = claimer.claim(self.batch).await else { continue };
            if *claimer.shutdown.borrow() {
                release_all(batch).await;
                break;
            }
            if batch.is_empty() {
                continue;
            }
            let (handler, queue, acks) = (handler.clone(), self.queue.clone(), flusher.acks.clone());
            let span = info_span!("rowbus.batch", size = batch.len());
            set.spawn(
                async move {
                    // Held until the batch is settled: the claim for this worker then
                    // carries its acknowledgement.
                    let _worker = permit;
                    let leases: Vec<Lease<DB>> = batch.iter().map(Delivery::lease).collect();
                    let result = outcome(handler(batch)).await;
                    settle_batch(&queue, &acks, leases, result).await;
                }
                .instrument(span),
            );
        }
        finish(&mut set, self.shutdown_timeout, flusher).await;
        Ok(())
    }
}

/// Settles a batch: an acknowledgement joins the pending ones (the next claim carries
/// it), a drop is one statement for the whole claim.
async fn settle_batch<DB: Db>(
    queue: &Queue<DB>,
    acks: &PendingAcks,
    leases: Vec<Lease<DB>>,
    result: Result<Outcome, String>,
) {
    let open: Vec<Lease<DB>> = leases.into_iter().filter(|l| !l.is_settled()).collect();
    match result {
        Ok(Outcome::Ack) => acks.push(open.iter().filter(|l| l.take()).map(|l| (l.id(), l.token()))),
        Ok(Outcome::Drop) => {
            let Some(first) = open.first() else { return };
            let ids: Vec<i64> = open.iter().filter(|l| l.take()).map(Lease::id).collect();
            if let Err(error) = ops::drop_many(queue, first.token(), &ids).await {
                warn!(%error, table = %queue.table(), "dropping a batch failed; it comes back when its lease runs out");
            }
        }
        other => {
            for lease in open {
                lease.settle(other.clone()).await;
            }
        }
    }
}
