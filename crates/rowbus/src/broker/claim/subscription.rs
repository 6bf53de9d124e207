//! Subscriptions: claim while claims come back full, otherwise wait the poll interval,
//! which a publish of the same broker or a notification cuts short.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::future::Future;

use futures::Stream;
use futures::stream::BoxStream;
use notify_table::DurationRange;
use tokio::sync::watch;
use tracing::{Instrument as _, debug, debug_span, warn};

use crate::broker::claim::claims::{Claim, claim};
use crate::broker::claim::limited::Held;
use crate::broker::claim::slot;
use crate::broker::claim::until::Until;
use crate::broker::claim::wake::Registration;
use crate::broker::operate::scheduler::{self, SchedulerGuard};
use crate::broker::settle::acks::PendingAcks;
use crate::broker::upkeep::{self, UpkeepGuard};
use crate::broker::{Delivery, Queue};
use crate::error::{Error, check_duration};
use crate::sql::{Db, Finishing};

/// Configures a subscription to a [`Queue`]; finish with [`stream`](Self::stream) or one
/// of the runners ([`run`](Self::run), [`run_batch`](Self::run_batch),
/// [`run_tx`](Self::run_tx), [`run_batch_tx`](Self::run_batch_tx)).
#[derive(Debug)]
pub struct SubscriptionBuilder<DB: Db> {
    pub(crate) queue: Queue<DB>,
    pub(crate) group: String,
    pub(crate) poll_interval: Duration,
    pub(crate) lease: Duration,
    pub(crate) batch: usize,
    pub(crate) workers: usize,
    pub(crate) claim_ahead: Option<usize>,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) until: Option<Until>,
    pub(crate) schedules: bool,
    /// How long a handler may run on a message without a timeout of its own.
    pub(crate) timeout: Option<Duration>,
    /// How long a handler asked to stop gets before the runner drops it.
    pub(crate) grace: Duration,
    /// Whether the runner extends its messages' leases while their handlers run.
    pub(crate) heartbeat: bool,
}

/// How long a handler asked to stop gets by default before its runner drops it
/// ([`SubscriptionBuilder::grace`]).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

impl<DB: Db> SubscriptionBuilder<DB> {
    pub(crate) fn new(queue: Queue<DB>) -> Self {
        let options = &queue.inner().options;
        let schedules = options.run_schedules;
        SubscriptionBuilder {
            poll_interval: options.poll_interval,
            lease: options.lease,
            queue,
            group: String::new(),
            batch: 1,
            workers: 1,
            claim_ahead: None,
            shutdown_timeout: Duration::from_secs(30),
            until: None,
            schedules,
            timeout: None,
            grace: DEFAULT_GRACE,
            heartbeat: false,
        }
    }

    /// How long a handler of [`run`](Self::run) may run on a message that has no
    /// [`timeout`](crate::broker::Message::timeout) of its own (none by default): past it, the
    /// handler is asked to stop ([`Delivery::cancelled`](crate::broker::Delivery::cancelled)
    /// resolves), gets the [`grace`](Self::grace) period, and the attempt fails with "timed
    /// out after ..." as its error: retried with backoff, then dead-lettered, as any
    /// failure. Greater than zero and at most [`MAX_DURATION`](crate::limits::MAX_DURATION), or
    /// the subscription is refused when it starts. A timeout longer than the lease needs
    /// [`heartbeat`](Self::heartbeat) (or the handler's own lease extensions) to be reached
    /// before the lease runs out.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long a handler of [`run`](Self::run) asked to stop (its message cancelled, or its
    /// timeout reached) gets to return before the runner drops its future and frees its
    /// worker ([`DEFAULT_GRACE`](crate::control::DEFAULT_GRACE) by default; at most [`MAX_DURATION`](crate::limits::MAX_DURATION)).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Whether the runner ([`run`](Self::run), [`run_batch`](Self::run_batch)) extends the
    /// leases of the messages its handlers hold, every third of the lease, in one statement
    /// for all of them (off by default). A handler can then run longer than its lease, and
    /// a process that dies loses its messages within one lease. A lease lost all the same
    /// (the database unreachable for a whole lease, say) is reported to the handler
    /// ([`Delivery::lease_lost`](crate::broker::Delivery::lease_lost)).
    pub fn heartbeat(mut self, on: bool) -> Self {
        self.heartbeat = on;
        self
    }

    /// Whether this subscription runs its queue's schedules in its broker (publishes
    /// their due ticks, see [`Queue::schedule`](crate::broker::Queue::schedule)) while it runs:
    /// [`BrokerOptions::run_schedules`](crate::broker::BrokerOptions::run_schedules) by default.
    pub fn schedules(mut self, on: bool) -> Self {
        self.schedules = on;
        self
    }

    /// Claim this group's messages only (`""`, the default, is a table's only group when
    /// it has none).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// The longest wait between two claims when nothing wakes the subscription: at least
    /// [`MIN_POLL_INTERVAL`](crate::limits::MIN_POLL_INTERVAL), or the subscription is refused
    /// when it starts.
    pub fn poll_interval(mut self, poll_interval: Duration) -> Self {
        self.poll_interval = poll_interval;
        self
    }

    /// How long a claimed message stays with this subscription's workers: greater than
    /// zero, at most [`MAX_DURATION`](crate::limits::MAX_DURATION), or the subscription is refused
    /// when it starts.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Messages one claim takes at most: the stream's batch, or that of
    /// [`run_batch`](Self::run_batch) or [`run_batch_tx`](Self::run_batch_tx).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Handlers running at once in a runner.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Most messages [`run`](Self::run) holds claimed ahead of its workers (1,000 by
    /// default; 0: never more than one per free worker). Within it, the claims follow what
    /// the runner measures as it goes: a claim takes what the workers are expected to
    /// finish in 10 ms (and in at least two claim latencies), a window that doubles with
    /// each claim that came back full, up to 100 ms, and falls back at the first that found
    /// fewer; while the backlog lasts, the next claim goes when what waits would last two
    /// claim latencies, before the workers run out. With handlers slower than the window
    /// nothing is claimed ahead: a message per free worker. No more wait than the workers
    /// start within a quarter of the lease; one that waited that long anyway is given back
    /// unstarted, as are those waiting at shutdown.
    pub fn claim_ahead(mut self, most: usize) -> Self {
        self.claim_ahead = Some(most);
        self
    }

    /// How long a runner lets handlers in flight finish after shutdown begins (30 s by
    /// default), or less: what is left of [`Broker::shutdown`](crate::broker::Broker::shutdown)'s
    /// deadline, when that stops it.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Stops a runner (not the broker) when `stop` resolves: no more claims, handlers in
    /// flight get the shutdown timeout to finish, then the runner returns. For a runner
    /// that should end after some event (N messages handled, a signal of your own), where
    /// [`Broker::shutdown`](crate::broker::Broker::shutdown) would stop every subscription.
    /// A worker that finishes a message once `stop` has resolved starts none of those
    /// claimed ahead: they go back to the queue as the runner returns. `stop` is polled by
    /// the runner's claim loop and by its workers, one at a time: keep its poll quick.
    ///
    /// ```no_run
    /// # async fn f(queue: rowbus::Queue<sqlx::Sqlite>) -> Result<(), rowbus::Error> {
    /// let (done, stop) = tokio::sync::oneshot::channel::<()>();
    /// let done = std::sync::Mutex::new(Some(done));
    /// queue.subscribe().until(async { let _ = stop.await; }).run(move |delivery| {
    ///     if delivery.text().is_ok_and(|t| t == "last") {
    ///         done.lock().unwrap().take().map(|d| d.send(()));
    ///     }
    ///     async { Ok::<_, rowbus::Error>(()) }
    /// }).await?; // returns once "last" was handled
    /// # Ok(()) }
    /// ```
    pub fn until(mut self, stop: impl Future<Output = ()> + Send + 'static) -> Self {
        self.until = Some(Until::new(stop));
        self
    }

    /// Starts claiming lazily, as a stream polled by you: claims up to `batch` messages
    /// when its buffer is empty. A failed claim is an `Err` item; the stream ends at the
    /// broker's shutdown, giving back the messages it claimed but did not yield.
    pub async fn stream(self) -> Result<Subscription<DB>, Error> {
        let claimer = Claimer::start(&self).await?;
        let state = StreamState { claimer, buffer: VecDeque::new(), limit: self.batch };
        let stream = futures::stream::unfold(state, |mut state| async move {
            loop {
                if *state.claimer.shutdown.borrow() {
                    // Ends the stream; dropping the state gives the buffer back.
                    return None;
                }
                if let Some(delivery) = state.buffer.pop_front() {
                    match delivery.slot() {
                        Some(at) if !slot::begin_at(at).await => {
                            // Too late for the start its rate gave it: back, unstarted.
                            if let Err(error) = delivery.release().await {
                                warn!(%error, "giving a late message back failed; it returns when its lease runs out");
                            }
                            continue;
                        }
                        _ => return Some((Ok(delivery), state)),
                    }
                }
                match state.claimer.next(state.limit).await? {
                    Ok(deliveries) => state.buffer.extend(deliveries),
                    Err(e) => return Some((Err(e), state)),
                }
            }
        });
        Ok(Subscription { stream: Box::pin(stream) })
    }
}

struct StreamState<DB: Db> {
    claimer: Claimer<DB>,
    buffer: VecDeque<Delivery<DB>>,
    limit: usize,
}

impl<DB: Db> Drop for StreamState<DB> {
    fn drop(&mut self) {
        // Claimed but never yielded: give them back now rather than after their lease.
        let unstarted: Vec<_> = self.buffer.drain(..).collect();
        if !unstarted.is_empty() && tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(async move {
                for delivery in unstarted {
                    let _ = delivery.release().await;
                }
            });
        }
    }
}

/// A subscription's deliveries, claimed when polled.
pub struct Subscription<DB: Db> {
    stream: BoxStream<'static, Result<Delivery<DB>, Error>>,
}

impl<DB: Db> std::fmt::Debug for Subscription<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl<DB: Db> Stream for Subscription<DB> {
    type Item = Result<Delivery<DB>, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// What the next claim waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pace {
    /// The last claim filled its limit: claim again at once.
    Now,
    /// The last claim found fewer: wait the poll interval, or less when woken.
    Idle,
    /// The last claim failed: wait the claim error wait.
    Failed,
    /// A limit let the last claim take nothing: wait this long (or less when woken), until
    /// a rate limit's next start, or a while for a concurrency limit's slot.
    Held(Duration),
}

/// The first wait of a claim a concurrency limit let take nothing; each next one in a row
/// waits twice the one before, up to the poll interval. A slot frees when a message in
/// flight settles, in whichever process holds it, which no wake-up announces: the claim
/// looks again soon, and less often the longer the limit stays full.
const HELD_FIRST_WAIT: Duration = Duration::from_millis(10);

/// How long a claim on its way when the broker shuts down is still waited for, before it
/// is left to finish by itself (see [`Claimer::claim`]): far longer than a claim that is
/// not blocked takes.
const CLAIM_AT_SHUTDOWN: Duration = Duration::from_millis(500);

/// The claim loop of one subscription, per the waking diagram.
pub(crate) struct Claimer<DB: Db> {
    pub queue: Queue<DB>,
    pub group: String,
    pub poll_interval: Duration,
    pub lease: Duration,
    pub wake: Registration,
    pub shutdown: watch::Receiver<bool>,
    pub pace: Pace,
    /// A runner's acknowledgements, carried by its claims.
    pub acks: Option<Arc<PendingAcks>>,
    /// What stops a runner early.
    pub until: Option<Until>,
    /// Whether a limit applied to the group at the last claim (see `claims::claim`).
    pub limited: bool,
    /// Whether a claim's messages begin together (a batch): under a rate they then get
    /// one start (see `limited::claim_in`).
    pub together: bool,
    /// Messages the last claim brought back.
    pub taken: usize,
    /// The last wait of a claim held by a concurrency limit (zero after any other claim).
    pub held_wait: Duration,
    /// Keeps the queue's schedules running in this broker while the subscription lives.
    pub _schedules: Option<SchedulerGuard<DB>>,
    /// Keeps the queue's upkeep (its floors, its partitions) running likewise.
    pub _upkeep: Option<UpkeepGuard<DB>>,
}

impl<DB: Db> Claimer<DB> {
    /// Registers for wake-ups and, with `listen_notify`, listens on the table's channel:
    /// both before the first claim. Refuses a group name, poll interval or lease out of
    /// its rule first.
    pub async fn start(builder: &SubscriptionBuilder<DB>) -> Result<Self, Error> {
        crate::names::check_group(&builder.group)?;
        check_duration("poll_interval", builder.poll_interval, DurationRange::PollInterval)?;
        check_duration("lease", builder.lease, DurationRange::Positive)?;
        if let Some(timeout) = builder.timeout {
            check_duration("timeout", timeout, DurationRange::Positive)?;
        }
        check_duration("grace", builder.grace, DurationRange::Span)?;
        let inner = builder.queue.inner();
        if inner.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        let channel = builder.queue.table().channel_arc();
        let wake = inner.wakers.register(channel, &builder.group);
        if let Some(listen) = &inner.listen {
            listen.listen(channel).await?;
        }
        // Before the first claim: its acknowledgements follow the queue's keep setting.
        // Read to its end even if the caller stops waiting (a runner's future dropped as
        // it starts): see `Finishing`.
        let queue = builder.queue.clone();
        Finishing::new(|_| async move { crate::broker::operate::history::load(&queue).await }).await?;
        crate::broker::operate::history::start_cleanup(&builder.queue);
        Ok(Claimer {
            queue: builder.queue.clone(),
            group: builder.group.clone(),
            poll_interval: builder.poll_interval,
            lease: builder.lease,
            wake,
            shutdown: inner.shutdown.subscribe(),
            pace: Pace::Now,
            acks: None,
            until: builder.until.clone(),
            limited: false,
            together: false,
            taken: 0,
            held_wait: Duration::ZERO,
            _schedules: builder.schedules.then(|| scheduler::attach(&builder.queue)),
            _upkeep: upkeep::attach(&builder.queue, &builder.group),
        })
    }

    /// How long the next claim waits when nothing wakes it: not at all after a claim
    /// that filled its limit.
    pub fn pause(&self) -> Option<Duration> {
        match self.pace {
            Pace::Now => None,
            Pace::Idle => Some(self.poll_interval),
            Pace::Failed => Some(self.queue.inner().options.claim_error_wait),
            Pace::Held(wait) => Some(wait),
        }
    }

    /// Whether a wake-up cuts the pause short (not after a failed claim).
    pub fn wakeable(&self) -> bool {
        matches!(self.pace, Pace::Idle | Pace::Held(_))
    }

    /// The pace after a claim that took `taken` of `limit` messages, `held` back by a
    /// limit or not: a claim that took some goes again as soon as workers are free (the
    /// limit tells it what is left); one a limit let take nothing waits for the rate's
    /// next start, or for a concurrency slot (see [`HELD_FIRST_WAIT`]).
    fn pace_after(&mut self, taken: usize, limit: usize, held: Option<Held>) -> Pace {
        let wait = match held {
            Some(Held::Running) if taken == 0 => {
                let wait =
                    (self.held_wait * 2).clamp(HELD_FIRST_WAIT, self.poll_interval.max(HELD_FIRST_WAIT));
                self.held_wait = wait;
                return Pace::Held(wait);
            }
            Some(Held::Rate(wait)) if taken == 0 => wait,
            Some(_) => {
                self.held_wait = Duration::ZERO;
                return Pace::Now;
            }
            None => {
                self.held_wait = Duration::ZERO;
                return if taken >= limit { Pace::Now } else { Pace::Idle };
            }
        };
        self.held_wait = Duration::ZERO;
        Pace::Held(wait)
    }

    /// Waits as the pace says; `false` when the broker shuts down meanwhile.
    pub async fn wait(&mut self) -> bool {
        let Some(pause) = self.pause() else { return !*self.shutdown.borrow() };
        let woken = self.wake.notify.clone();
        let stopped = tokio::select! {
            biased;
            _ = self.shutdown.wait_for(|stop| *stop) => true,
            _ = woken.notified(), if self.wakeable() => {
                debug!(table = %self.queue.table(), "woken");
                false
            }
            _ = tokio::time::sleep(pause) => false,
        };
        !stopped && !*self.shutdown.borrow()
    }

    /// Claims up to `limit` messages and sets the pace for the next claim.
    ///
    /// A claim that carries no acknowledgements is waited for at most [`CLAIM_AT_SHUTDOWN`]
    /// past the broker's shutdown: one blocked behind another session's lock (a `LOCK
    /// TABLE`, a long DDL) would otherwise hold the runner, and the process, until that
    /// lock went, however short the shutdown deadline. It runs on to its end by itself and
    /// gives back what it took ([`claim`]); this returns no message, the pace unchanged,
    /// and the runner then sees the shutdown. (A claim that is merely on its way is
    /// waited for: what it brings is given back by the runner at once, whereas the
    /// give-back of a claim left to finish may find the pool already closed by a process
    /// on its way out, and its messages would wait for their lease.) A claim carrying acknowledgements (SQLite's, bounded by its busy
    /// timeout) is waited for: dropped, its acknowledgements could be neither committed by
    /// it nor safely sent again.
    pub async fn claim(&mut self, limit: usize) -> Result<Vec<Delivery<DB>>, Error> {
        let span = debug_span!("rowbus.claim", table = %self.queue.table(), group = self.group, limit);
        let acks = self.acks.as_ref().map(|acks| acks.take()).unwrap_or_default();
        let claiming =
            claim(&self.queue, &self.group, limit, self.lease, &acks, &mut self.limited, self.together)
                .instrument(span);
        let claimed = if acks.is_empty() {
            let mut shutdown = self.shutdown.clone();
            let blocked = async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
                tokio::time::sleep(CLAIM_AT_SHUTDOWN).await;
            };
            tokio::select! {
                biased;
                claimed = claiming => claimed,
                () = blocked => {
                    debug!(table = %self.queue.table(), "a claim still out after shutdown: it finishes by itself");
                    return Ok(Vec::new());
                }
            }
        } else {
            claiming.await
        };
        if claimed.is_err() {
            // Not acknowledged: the next claim, or the flusher, tries again.
            if let Some(pending) = &self.acks {
                pending.push(acks);
            }
        }
        match claimed {
            Ok(Claim { rows, token, held, slots }) => {
                self.pace = self.pace_after(rows.len(), limit, held);
                self.taken = rows.len();
                debug!(table = %self.queue.table(), group = self.group, claimed = rows.len(), limit, "claim");
                let mut slots = slots.into_iter();
                Ok(rows
                    .into_iter()
                    .map(|row| Delivery::new(self.queue.clone(), row, token).starting_at(slots.next()))
                    .collect())
            }
            Err(error) => {
                self.pace = Pace::Failed;
                self.queue.inner().claim_failed(self.queue.table(), &error);
                warn!(%error, table = %self.queue.table(), "claim failed; next claim in a second");
                Err(error)
            }
        }
    }

    /// Waits, then claims; `None` at shutdown.
    pub async fn next(&mut self, limit: usize) -> Option<Result<Vec<Delivery<DB>>, Error>> {
        if !self.wait().await {
            return None;
        }
        Some(self.claim(limit).await)
    }
}

impl<DB: Db> Queue<DB> {
    /// A subscription to this queue (the default group unless you name one).
    pub fn subscribe(&self) -> SubscriptionBuilder<DB> {
        SubscriptionBuilder::new(self.clone())
    }
}
