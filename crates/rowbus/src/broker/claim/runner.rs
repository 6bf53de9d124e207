//! Runners: a subscription driven for you, with N handlers at once, a batch handler, or a
//! transactional handler; all stop at the broker's shutdown. One claim loop, [`drive`],
//! serves them all; each runner is a [`Turn`]: how it waits for workers and what it
//! does with the ones it got.

use std::any::Any;
use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing::{Instrument as _, debug, info_span, warn};

use crate::broker::claim::ahead::{self, Ahead};
use crate::broker::claim::handoff::{HandedOff, Taker};
use crate::broker::claim::slot;
use crate::broker::claim::subscription::{Claimer, Pace, SubscriptionBuilder};
use crate::broker::claim::until::Until;
use crate::broker::claim::watch::{self, Held, Watch};
use crate::broker::operate::counts::{self, Counted};
use crate::broker::settle::acks::PendingAcks;
use crate::broker::settle::control::{Control, StopReason};
use crate::broker::settle::delivery::Lease;
use crate::broker::settle::lease;
use crate::broker::settle::many::free_keys;
use crate::broker::telemetry;
use crate::broker::{Delivery, Inner, Outcome, Queue};
use crate::error::{Error, chain_line};
use crate::sql::Db;

/// Counts a runner as running until dropped, so that shutdown can wait for it.
pub(in crate::broker) struct Running<DB: Db>(Arc<Inner<DB>>);

impl<DB: Db> Running<DB> {
    pub(in crate::broker) fn new(inner: &Arc<Inner<DB>>) -> Self {
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
pub(in crate::broker) async fn outcome<F, O, E, T>(handler: F) -> Result<T, String>
where
    F: Future<Output = Result<O, E>>,
    O: Into<T>,
    E: Display + 'static,
{
    match AssertUnwindSafe(handler).catch_unwind().await {
        Ok(Ok(o)) => Ok(o.into()),
        Ok(Err(e)) => Err(error_text(&e)),
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

/// A handler's error as its message keeps it, with its causes: an operator reading the
/// dead letter must see why (a "request failed" says nothing without its "connection
/// refused"). The bound is only `Display`, so the error types that carry causes are
/// recognised by type; any other is written in its alternate form (`{:#}`), which is its
/// whole chain for `anyhow` and `eyre` errors and its usual message for most others.
fn error_text<E: Display + 'static>(error: &E) -> String {
    type Dyn = dyn std::error::Error + 'static;
    let any: &dyn Any = error;
    let known: Option<&Dyn> = if let Some(e) = any.downcast_ref::<Error>() {
        Some(e)
    } else if let Some(e) = any.downcast_ref::<Box<dyn std::error::Error + Send + Sync>>() {
        Some(&**e)
    } else if let Some(e) = any.downcast_ref::<Box<dyn std::error::Error + Send>>() {
        Some(&**e)
    } else if let Some(e) = any.downcast_ref::<Box<dyn std::error::Error>>() {
        Some(&**e)
    } else if let Some(e) = any.downcast_ref::<std::io::Error>() {
        Some(e)
    } else {
        any.downcast_ref::<sqlx::Error>().map(|e| e as &Dyn)
    };
    match known {
        Some(e) => chain_line(e),
        None => format!("{error:#}"),
    }
}

/// Free workers: waits for one, then takes every other free one too.
pub(in crate::broker) async fn free_workers(
    semaphore: &Arc<Semaphore>,
    max: usize,
) -> Vec<OwnedSemaphorePermit> {
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

/// What a worker needs besides its handler: where acknowledgements go, the messages
/// claimed ahead of it, and the leases handed out.
struct Shared<DB: Db> {
    acks: Arc<PendingAcks>,
    ahead: Arc<Ahead<Delivery<DB>>>,
    in_flight: InFlight<DB>,
    /// What stops the runner: a worker takes no message claimed ahead once it has.
    stop: Stop,
    /// The timeout of messages without their own, and the grace of a handler asked to stop.
    supervision: Supervision,
}

impl<DB: Db> Clone for Shared<DB> {
    fn clone(&self) -> Self {
        Shared {
            acks: self.acks.clone(),
            ahead: self.ahead.clone(),
            in_flight: self.in_flight.clone(),
            stop: self.stop.clone(),
            supervision: self.supervision,
        }
    }
}

/// How a runner stops handlers: the subscription's timeout for messages without their
/// own, and the grace a handler asked to stop gets.
#[derive(Debug, Clone, Copy)]
struct Supervision {
    timeout: Option<Duration>,
    grace: Duration,
}

/// What became of a handler the runner watched.
enum Supervised<T> {
    /// It returned, unasked.
    Done(T),
    /// It was asked to stop; it returned within the grace period or was dropped.
    Stopped(StopReason),
}

/// Runs `handler` until it returns, or until it is asked to stop (through `control`, or
/// at `timeout`): then it gets `grace` to return, and is dropped if it does not. What it
/// returns after being asked is not used.
async fn supervise<T>(
    handler: impl Future<Output = T>,
    control: &Control,
    timeout: Option<Duration>,
    grace: Duration,
) -> Supervised<T> {
    tokio::pin!(handler);
    let deadline = async {
        match timeout {
            Some(after) => tokio::time::sleep(after).await,
            None => std::future::pending().await,
        }
    };
    let reason = tokio::select! {
        done = &mut handler => return Supervised::Done(done),
        reason = control.stopped() => reason,
        () = deadline => {
            let after = timeout.unwrap_or_default();
            control.stop(StopReason::TimedOut(after));
            // A cancel that came first is the reason.
            control.reason().unwrap_or(StopReason::TimedOut(after))
        }
    };
    if tokio::time::timeout(grace, &mut handler).await.is_err() {
        debug!(?reason, ?grace, "the handler did not return within its grace period; dropped");
    }
    Supervised::Stopped(reason)
}

/// The error a timed-out attempt records: "timed out after 30s".
pub(in crate::broker) fn timed_out(after: Duration) -> String {
    let ms = after.as_millis();
    if ms > 0 && ms.is_multiple_of(1000) {
        format!("timed out after {}s", ms / 1000)
    } else {
        format!("timed out after {}ms", ms.max(1))
    }
}

/// The broker's shutdown and the runner's [`until`](SubscriptionBuilder::until), as a
/// worker checks them between two messages.
#[derive(Clone)]
struct Stop {
    shutdown: tokio::sync::watch::Receiver<bool>,
    until: Option<Until>,
}

impl Stop {
    /// Whether the runner is to stop: the drive loop learns it too, but a worker that has
    /// just finished a message must not start one claimed ahead meanwhile.
    fn now(&self) -> bool {
        *self.shutdown.borrow() || self.until.as_ref().is_some_and(Until::resolved)
    }
}

/// One worker's handler on a message, then on each message claimed ahead that is waiting
/// when it finishes; the worker is free once none is. An acknowledgement joins others in
/// one statement.
async fn handle<DB, F, Fut, O, E>(
    handler: Arc<F>,
    shared: Shared<DB>,
    mut delivery: Delivery<DB>,
    worker: OwnedSemaphorePermit,
    begun: Begun,
) where
    DB: Db,
    F: Fn(Delivery<DB>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    O: Into<Outcome> + Send + 'static,
    E: Display + Send + 'static,
{
    drop(begun);
    loop {
        handle_one(&*handler, &shared, delivery).await;
        if shared.stop.now() {
            // What waits ahead goes back with the runner's end.
            break;
        }
        match next_ahead(&shared.ahead).await {
            Some(next) => delivery = next,
            None => break,
        }
    }
    drop(worker);
}

/// The next message claimed ahead, giving back those that waited too long.
async fn next_ahead<DB: Db>(ahead: &Ahead<Delivery<DB>>) -> Option<Delivery<DB>> {
    let (next, stale) = ahead.next();
    if !stale.is_empty() {
        warn!(
            count = stale.len(),
            "messages claimed ahead waited a quarter of their lease; giving them back"
        );
        release_all(stale).await;
    }
    next
}

async fn handle_one<DB, F, Fut, O, E>(handler: &F, shared: &Shared<DB>, delivery: Delivery<DB>)
where
    DB: Db,
    F: Fn(Delivery<DB>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    O: Into<Outcome> + Send + 'static,
    E: Display + Send + 'static,
{
    let span = telemetry::message_span(
        delivery.queue().table(),
        delivery.id(),
        delivery.attempt(),
        delivery.headers(),
    );
    async move {
        if let Some(at) = delivery.slot()
            && !slot::begin_at(at).await
        {
            release_all(vec![delivery]).await;
            return;
        }
        let lease = delivery.lease();
        shared.in_flight.track([lease.clone()]);
        let started = Instant::now();
        let Supervision { timeout, grace } = shared.supervision;
        let timeout = lease.timeout().or(timeout);
        let supervised = supervise(outcome(handler(delivery)), lease.control(), timeout, grace).await;
        shared.ahead.handled(started.elapsed());
        let result = match supervised {
            Supervised::Done(result) => result,
            Supervised::Stopped(StopReason::Cancelled) => {
                // Gone from the queue: nothing to settle.
                lease.take();
                debug!("cancelled; its handler stopped");
                return;
            }
            Supervised::Stopped(StopReason::TimedOut(after)) => {
                lease.queue().inner().counters.timed_out(1);
                counts::count(lease.queue(), Counted::TimedOut, 1).await;
                Err(timed_out(after))
            }
        };
        match result {
            // A keyed message's acknowledgement goes at once: it frees the key's next
            // message, which other subscriptions wait for.
            Ok(Outcome::Ack) if !lease.is_keyed() && lease.take() => {
                // Pending while the worker is still taken, so that the claim for that
                // worker carries it: one commit for the acknowledgement and the next claim.
                shared.acks.push([(lease.id(), lease.token())]);
            }
            other => lease.settle(other).await,
        }
    }
    .instrument(span)
    .await
}

/// A runner's pending acknowledgements, carried by its claimer's claims where the
/// database wants it ([`Claiming::CLAIMS_CARRY_ACKS`](crate::sql::Claiming::CLAIMS_CARRY_ACKS)),
/// and the task that sends those no claim carries.
fn pending_acks<DB: Db>(claimer: &mut Claimer<DB>) -> Flusher {
    let acks = Arc::new(PendingAcks::new(DB::CLAIMS_CARRY_ACKS));
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

/// The leases of messages handed to handlers, so that those whose handler is aborted at
/// the shutdown deadline are given back at once rather than when their lease runs out.
struct InFlight<DB: Db>(Arc<std::sync::Mutex<Vec<Lease<DB>>>>);

impl<DB: Db> Default for InFlight<DB> {
    fn default() -> Self {
        InFlight(Arc::default())
    }
}

impl<DB: Db> Clone for InFlight<DB> {
    fn clone(&self) -> Self {
        InFlight(self.0.clone())
    }
}

impl<DB: Db> InFlight<DB> {
    /// Adds `leases`, forgetting those settled meanwhile.
    fn track(&self, leases: impl IntoIterator<Item = Lease<DB>>) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|lease| !lease.is_settled());
        all.extend(leases);
    }

    /// The leases no handler settled yet, for the runner's look.
    fn held(&self) -> Held<DB> {
        let all = self.0.clone();
        Arc::new(move || {
            let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
            all.retain(|lease| !lease.is_settled());
            all.clone()
        })
    }

    /// Gives back every message no handler settled; how many.
    async fn abandon(&self) -> u64 {
        let open: Vec<Lease<DB>> = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        let mut given_back = 0;
        for lease in open {
            given_back += u64::from(lease.abandon().await);
        }
        given_back
    }
}

/// After the claim loop: handlers finish (see [`drain`]) while their acknowledgements go
/// out by themselves, then the last of those; the messages of handlers aborted at the
/// deadline are given back.
async fn finish<DB: Db>(
    mut set: JoinSet<()>,
    timeout: Duration,
    mut flusher: Flusher,
    in_flight: InFlight<DB>,
) {
    flusher.acks.idle(true);
    drain(&mut set, timeout).await;
    flusher.acks.close();
    let _ = (&mut flusher.task).await;
    let abandoned = in_flight.abandon().await;
    if abandoned > 0 {
        warn!(abandoned, "messages of handlers aborted at the shutdown deadline were given back");
    }
}

/// Lets handlers in flight finish within the shutdown timeout; aborts the rest (their
/// messages come back when their leases run out; a transaction rolls back at once).
pub(in crate::broker) async fn drain(set: &mut JoinSet<()>, timeout: Duration) {
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

/// One kind of runner, driven by [`drive`].
pub(in crate::broker) trait Turn<DB: Db> {
    /// Waits until there are free workers to claim for; their permits.
    fn free(&mut self) -> impl Future<Output = Vec<OwnedSemaphorePermit>>;
    /// Claims for `workers` and starts their handlers in `set`; the pace of the next
    /// claim, or `None` when shutdown began meanwhile (what was claimed is given back).
    fn claim(
        &mut self,
        claimer: &mut Claimer<DB>,
        workers: Vec<OwnedSemaphorePermit>,
        set: &mut JoinSet<()>,
    ) -> impl Future<Output = Option<Pace>>;
    /// After the loop: lets the handlers in `set` finish within `timeout`.
    fn finish(self, set: JoinSet<()>, timeout: Duration) -> impl Future<Output = ()>;
    /// The workers of a runner that takes messages published in this process straight
    /// while it waits for work (see [`handoff`](crate::broker::claim::handoff)); `None`
    /// (the default) for one that does not.
    fn hand_offs(&self) -> Option<Arc<Semaphore>> {
        None
    }
    /// Starts `delivery`, handed over with `worker` reserved for it, in `set`. Called only
    /// on a turn whose [`hand_offs`](Self::hand_offs) is `Some`; by default the message is
    /// given back.
    fn start_handed(&mut self, delivery: Delivery<DB>, worker: OwnedSemaphorePermit, set: &mut JoinSet<()>) {
        let _ = (worker, set);
        tokio::spawn(release_all(vec![delivery]));
    }
    /// Whether the tasks in `set` are told, rather than aborted, when the runner's future
    /// is dropped before its loop ended: if so, what tells them (`true` then), and they
    /// end by themselves.
    fn detached_when_dropped(&self) -> Option<Arc<tokio::sync::watch::Sender<bool>>> {
        None
    }
}

/// The tasks a runner started. Dropped with the runner's future before its loop ended:
/// aborted, as a `JoinSet` dropped aborts its tasks, or, where the turn says so
/// ([`Turn::detached_when_dropped`]), told that the runner is gone and left to end by
/// themselves.
struct Started {
    set: JoinSet<()>,
    gone: Option<Arc<tokio::sync::watch::Sender<bool>>>,
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(gone) = &self.gone {
            gone.send_replace(true);
            self.set.detach_all();
        }
    }
}

/// What ended a wait of the claim loop.
enum Next {
    Stop,
    Claim(Vec<OwnedSemaphorePermit>),
    Pause(bool),
    Handed(HandedOff),
}

/// A message handed to the runner, from its [`Taker`] if it has one.
async fn handed(taker: &mut Option<Taker>) -> Option<HandedOff> {
    match taker {
        Some(taker) => taker.rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The claim loop of every runner: one `select!` over shutdown, a wake-up, the poll tick
/// and free workers. After a claim that filled its limit the next one goes as soon as
/// workers are free; after a short one it waits the poll interval (or less when woken);
/// after a failed one, the claim error wait. While it pauses, `acks` (if any) go out by
/// themselves rather than with the next claim. While it waits after a short claim, a
/// turn that takes hand-offs starts the messages publishes of this process hand it.
pub(in crate::broker) async fn drive<DB: Db, T: Turn<DB>>(
    mut claimer: Claimer<DB>,
    mut turn: T,
    acks: Option<Arc<PendingAcks>>,
    timeout: Duration,
) {
    let _running = Running::new(claimer.queue.inner());
    let mut started = Started { set: JoinSet::new(), gone: turn.detached_when_dropped() };
    let set = &mut started.set;
    let mut until = Instant::now();
    let stop = claimer.until.take();
    let queue = claimer.queue.clone();
    let mut taker = turn.hand_offs().map(|workers| claimer.wake.take_hand_offs(workers, claimer.lease));
    loop {
        while set.try_join_next().is_some() {}
        let pause = claimer.pause().is_some();
        if let Some(acks) = &acks {
            acks.idle(pause);
            acks.limited(claimer.limited, &claimer.wake.notify);
        }
        if let Some(taker) = &taker {
            taker.idle(claimer.pace == Pace::Idle && !claimer.limited);
        }
        let woken = claimer.wake.notify.clone();
        let next = tokio::select! {
            biased;
            _ = claimer.shutdown.wait_for(|stop| *stop) => Next::Stop,
            () = async { match &stop { Some(stop) => stop.wait().await, None => std::future::pending().await } } => Next::Stop,
            Some(handed) = handed(&mut taker) => Next::Handed(handed),
            _ = woken.notified(), if claimer.wakeable() => Next::Pause(true),
            _ = tokio::time::sleep_until(until), if pause => Next::Pause(false),
            workers = turn.free(), if !pause => Next::Claim(workers),
        };
        if let (Some(taker), false) = (&taker, matches!(next, Next::Handed(_))) {
            taker.idle(false);
        }
        match next {
            Next::Stop => break,
            Next::Handed(handed) => {
                let (row, token, worker) = handed.start();
                turn.start_handed(Delivery::new(queue.clone(), row, token), worker, set);
            }
            Next::Pause(woken) => {
                if woken {
                    debug!(table = %claimer.queue.table(), "woken");
                }
                claimer.pace = Pace::Now;
            }
            Next::Claim(workers) => {
                claimer.taken = 0;
                let Some(pace) = turn.claim(&mut claimer, workers, set).await else { break };
                if claimer.taken > 0
                    && let Some(taker) = &taker
                {
                    taker.claimed();
                }
                claimer.pace = pace;
                until = Instant::now() + claimer.pause().unwrap_or_default();
            }
        }
    }
    if let Some(taker) = &mut taker {
        // What was handed over and not started goes back at once.
        taker.close();
    }
    turn.finish(std::mem::take(set), queue.inner().drain_timeout(timeout)).await;
}

/// [`SubscriptionBuilder::run`]: a message per free worker, and those claimed ahead (see
/// [`Ahead`]).
struct Workers<DB: Db, F> {
    handler: Arc<F>,
    workers: Arc<Semaphore>,
    max: usize,
    starting: Starting,
    flusher: Flusher,
    shared: Shared<DB>,
    /// The look at the messages its handlers hold, while the runner runs.
    _watch: Watch,
}

impl<DB, F, Fut, O, E> Workers<DB, F>
where
    DB: Db,
    F: Fn(Delivery<DB>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    O: Into<Outcome> + Send + 'static,
    E: Display + Send + 'static,
{
    fn start(&self, set: &mut JoinSet<()>, delivery: Delivery<DB>, worker: OwnedSemaphorePermit) {
        let begun = self.starting.spawned();
        set.spawn(handle(self.handler.clone(), self.shared.clone(), delivery, worker, begun));
    }
}

impl<DB, F, Fut, O, E> Turn<DB> for Workers<DB, F>
where
    DB: Db,
    F: Fn(Delivery<DB>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    O: Into<Outcome> + Send + 'static,
    E: Display + Send + 'static,
{
    /// Free workers; or none, when during a backlog the messages claimed ahead run low
    /// before any worker is free: the claim refills them while the workers still work.
    async fn free(&mut self) -> Vec<OwnedSemaphorePermit> {
        self.starting.wait().await;
        let ahead = self.shared.ahead.clone();
        let refill = async move {
            loop {
                ahead.low().await;
                if ahead.wants_refill() {
                    return;
                }
            }
        };
        tokio::select! {
            workers = free_workers(&self.workers, self.max) => workers,
            () = refill => Vec::new(),
        }
    }

    async fn claim(
        &mut self,
        claimer: &mut Claimer<DB>,
        mut workers: Vec<OwnedSemaphorePermit>,
        set: &mut JoinSet<()>,
    ) -> Option<Pace> {
        // A worker can come free while a message claimed ahead still waits (it looked
        // before the last claim added some): those go first.
        while !workers.is_empty() {
            let Some(delivery) = next_ahead(&self.shared.ahead).await else { break };
            let worker = workers.pop().expect("not empty");
            self.start(set, delivery, worker);
        }
        // A limited group's claims take only what free workers start at once: a message
        // claimed ahead would hold a slot, or count as started, while it waits.
        let size = match claimer.limited {
            true => workers.len(),
            false if workers.is_empty() && !self.shared.ahead.wants_refill() => 0,
            false => self.shared.ahead.claim_size(workers.len()),
        };
        if size == 0 {
            return Some(claimer.pace);
        }
        let started = Instant::now();
        let Ok(deliveries) = claimer.claim(size).await else { return Some(claimer.pace) };
        self.shared.ahead.claimed(started.elapsed(), size, deliveries.len());
        if *claimer.shutdown.borrow() {
            release_all(deliveries).await;
            return None;
        }
        let mut deliveries = deliveries.into_iter();
        // Workers first: `zip` takes from its first iterator before it finds the second
        // empty, and a message taken so would be lost until its lease ran out.
        for (worker, delivery) in workers.into_iter().zip(deliveries.by_ref()) {
            self.start(set, delivery, worker);
        }
        self.shared.ahead.keep(deliveries);
        // Workers that came free while the claim was out (a refill is sent with none free)
        // start on what it brought now: the claim loop's next turn may be a poll interval
        // away after a short claim (measured: the last 992 of a 20,000 drain waited 1 s).
        while !self.shared.stop.now()
            && let Ok(worker) = self.workers.clone().try_acquire_owned()
        {
            let Some(delivery) = next_ahead(&self.shared.ahead).await else { break };
            self.start(set, delivery, worker);
        }
        Some(claimer.pace)
    }

    fn hand_offs(&self) -> Option<Arc<Semaphore>> {
        Some(self.workers.clone())
    }

    fn start_handed(&mut self, delivery: Delivery<DB>, worker: OwnedSemaphorePermit, set: &mut JoinSet<()>) {
        self.start(set, delivery, worker);
    }

    async fn finish(self, set: JoinSet<()>, timeout: Duration) {
        // Claimed ahead, never started: given back at once.
        release_all(self.shared.ahead.close()).await;
        finish(set, timeout, self.flusher, self.shared.in_flight).await
    }
}

/// [`SubscriptionBuilder::run_batch`]: a batch per free worker.
struct Batches<DB: Db, F> {
    handler: Arc<F>,
    workers: Arc<Semaphore>,
    queue: Queue<DB>,
    batch: usize,
    flusher: Flusher,
    in_flight: InFlight<DB>,
    /// The look at the messages its handlers hold, while the runner runs.
    _watch: Watch,
}

impl<DB, F, Fut, O, E> Batches<DB, F>
where
    DB: Db,
    F: Fn(Vec<Delivery<DB>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    O: Into<Outcome> + Send + 'static,
    E: Display + Send + 'static,
{
    /// Runs the handler on `batch` with `worker` in `set`, then settles it.
    fn start(&self, set: &mut JoinSet<()>, batch: Vec<Delivery<DB>>, worker: OwnedSemaphorePermit) {
        let (handler, queue, acks) = (self.handler.clone(), self.queue.clone(), self.flusher.acks.clone());
        let in_flight = self.in_flight.clone();
        let span = telemetry::batch_span(queue.table(), batch.len(), batch.iter().map(|d| d.headers()));
        set.spawn(
            async move {
                // Held until the batch is settled: the claim for this worker then
                // carries its acknowledgement.
                let _worker = worker;
                // One start for a rated batch (see `limited::claim_in`).
                if let Some(at) = batch.iter().filter_map(Delivery::slot).max_by_key(|s| s.at)
                    && !slot::begin_at(at).await
                {
                    release_all(batch).await;
                    return;
                }
                let leases: Vec<Lease<DB>> = batch.iter().map(Delivery::lease).collect();
                in_flight.track(leases.iter().cloned());
                let result = outcome(handler(batch)).await;
                settle_batch(&queue, &acks, leases, result).await;
            }
            .instrument(span),
        );
    }
}

impl<DB, F, Fut, O, E> Turn<DB> for Batches<DB, F>
where
    DB: Db,
    F: Fn(Vec<Delivery<DB>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, E>> + Send + 'static,
    O: Into<Outcome> + Send + 'static,
    E: Display + Send + 'static,
{
    async fn free(&mut self) -> Vec<OwnedSemaphorePermit> {
        vec![self.workers.clone().acquire_owned().await.expect("never closed")]
    }

    async fn claim(
        &mut self,
        claimer: &mut Claimer<DB>,
        mut workers: Vec<OwnedSemaphorePermit>,
        set: &mut JoinSet<()>,
    ) -> Option<Pace> {
        let Ok(batch) = claimer.claim(self.batch).await else { return Some(claimer.pace) };
        if *claimer.shutdown.borrow() {
            release_all(batch).await;
            return None;
        }
        if let (false, Some(worker)) = (batch.is_empty(), workers.pop()) {
            self.start(set, batch, worker);
        }
        Some(claimer.pace)
    }

    /// A message handed over is a batch of one.
    fn hand_offs(&self) -> Option<Arc<Semaphore>> {
        Some(self.workers.clone())
    }

    fn start_handed(&mut self, delivery: Delivery<DB>, worker: OwnedSemaphorePermit, set: &mut JoinSet<()>) {
        self.start(set, vec![delivery], worker);
    }

    async fn finish(self, set: JoinSet<()>, timeout: Duration) {
        finish(set, timeout, self.flusher, self.in_flight).await
    }
}

impl<DB: Db> SubscriptionBuilder<DB> {
    /// Runs `handler` on each message, up to `workers` at once, until the broker shuts
    /// down. Each claim takes a message per free worker, and a few more when handlers are
    /// quick (see [`claim_ahead`](Self::claim_ahead)). `Ok` acknowledges (or does what
    /// the [`Outcome`] says); `Err` or a panic retries with backoff, then dead-letters.
    pub async fn run<F, Fut, O, E>(self, handler: F) -> Result<(), Error>
    where
        F: Fn(Delivery<DB>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
        O: Into<Outcome> + Send + 'static,
        E: Display + Send + 'static,
    {
        let workers = Arc::new(Semaphore::new(self.workers));
        let (handler, max, starting) = (Arc::new(handler), self.workers, Starting::default());
        let cap = self.claim_ahead.unwrap_or(ahead::DEFAULT_CAP);
        let ahead = Arc::new(Ahead::new(self.workers, cap, self.lease / 4));
        let stop = Stop { shutdown: self.queue.inner().shutdown.subscribe(), until: self.until.clone() };
        let supervision = Supervision { timeout: self.timeout, grace: self.grace };
        let in_flight = InFlight::default();
        self.leased(false, |flusher| Workers {
            handler,
            workers,
            max,
            starting,
            _watch: self.watch(&in_flight),
            shared: Shared { acks: flusher.acks.clone(), ahead, in_flight, stop, supervision },
            flusher,
        })
        .await
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
        let workers = Arc::new(Semaphore::new(self.workers));
        let (handler, queue, batch) = (Arc::new(handler), self.queue.clone(), self.batch);
        let in_flight = InFlight::default();
        self.leased(true, |flusher| Batches {
            handler,
            workers,
            queue,
            batch,
            flusher,
            _watch: self.watch(&in_flight),
            in_flight,
        })
        .await
    }

    /// The runner's look at the messages its handlers hold (see [`watch`]).
    fn watch(&self, in_flight: &InFlight<DB>) -> Watch {
        watch::start(&self.queue, self.poll_interval, self.heartbeat.then_some(self.lease), in_flight.held())
    }

    /// Drives a lease runner, whose acknowledgements its claims may carry; `together`
    /// when a claim's messages begin at once (a batch).
    async fn leased<T: Turn<DB>>(
        &self,
        together: bool,
        turn: impl FnOnce(Flusher) -> T,
    ) -> Result<(), Error> {
        let mut claimer = Claimer::start(self).await?;
        claimer.together = together;
        let flusher = pending_acks(&mut claimer);
        let acks = flusher.acks.clone();
        drive(claimer, turn(flusher), Some(acks), self.shutdown_timeout).await;
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
        Ok(Outcome::Ack) => {
            // Keyed messages go at once (see `work`): they free their keys' next messages.
            let (keyed, plain): (Vec<_>, Vec<_>) = open.into_iter().partition(Lease::is_keyed);
            acks.push(plain.iter().filter(|l| l.take()).map(|l| (l.id(), l.token())));
            let pairs: Vec<(i64, i64)> =
                keyed.iter().filter(|l| l.take()).map(|l| (l.id(), l.token())).collect();
            if let Err(error) = lease::ack_pairs(queue, &pairs).await {
                warn!(%error, table = %queue.table(), "acknowledging a batch failed; it comes back when its lease runs out");
                return;
            }
            free_keys(queue, &keyed).await;
        }
        Ok(Outcome::Drop) => {
            let Some(first) = open.first() else { return };
            let ids: Vec<i64> = open.iter().filter(|l| l.take()).map(Lease::id).collect();
            if let Err(error) = lease::drop_many(queue, first.token(), &ids).await {
                warn!(%error, table = %queue.table(), "dropping a batch failed; it comes back when its lease runs out");
                return;
            }
            free_keys(queue, &open).await;
        }
        // One addition to the queue's counts for the batch.
        Ok(Outcome::Snooze(after)) if lease::handler_snooze(after).is_ok() => {
            let mut snoozed = 0;
            for lease in open.iter().filter(|l| l.take()) {
                match lease::snooze(queue, lease.id(), lease.token(), after).await {
                    Ok(()) => snoozed += 1,
                    Err(error) => {
                        warn!(%error, table = %queue.table(), id = lease.id(), "snoozing a message failed; it comes back when its lease runs out");
                    }
                }
            }
            counts::count(queue, Counted::Snoozed, snoozed).await;
        }
        other => {
            for lease in open {
                lease.settle(other.clone()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_said_in_its_own_unit() {
        assert_eq!(timed_out(Duration::from_secs(30)), "timed out after 30s");
        assert_eq!(timed_out(Duration::from_millis(1500)), "timed out after 1500ms");
        assert_eq!(timed_out(Duration::from_micros(10)), "timed out after 1ms");
    }
}
