//! The relay: claims a queue's messages in batches, hands each batch to a [`Sink`], and
//! settles each message as the broker answered: removed once confirmed, given back to be
//! sent again when the broker was unavailable, dead-lettered when the broker refused it
//! for good.
//!
//! It claims in one of two ways. In transactions (the default where writers run side by
//! side: PostgreSQL, MySQL/MariaDB): each batch is deleted in a transaction held open
//! until the broker answered, then committed; up to `in_flight` such transactions at once,
//! their sends overlapping at the sink. Under leases (SQLite, whose one write transaction
//! at a time would hold every publisher while the broker answers): three stages run at
//! once, so that a batch is being claimed while the one before it is sent and the one
//! before that settled: the claims (a [`Subscription`](rowbus::Subscription) stream,
//! batches taken as they are ready), the sends (this task, which owns the sink, each batch
//! sent as it comes, overlapping the sends before it) and the settlements. A batch holds a
//! permit from claim to settlement; `in_flight` permits bound how many batches are between
//! the two.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::{BoxFuture, FutureExt as _, Shared};
use futures::stream::FuturesOrdered;
use rowbus::stats::Counted;
use rowbus::{Backend, BatchOutcome, Db, Delivery, Outcome, Queue, TxMessage};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::error::RelayError;
use crate::sink::{Outgoing, Sink, SinkError};

/// The batch a relay claims and sends by default.
pub const DEFAULT_BATCH: usize = 500;
/// The batches a relay has between claim and settlement by default.
pub const DEFAULT_IN_FLIGHT: usize = 3;
/// The first wait after a batch the broker could not take; each next one in a row waits
/// twice as long, up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two tries while the broker is unavailable.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often a relay adds what it did to the queue's counts table.
const COUNT_EVERY: Duration = Duration::from_secs(1);

/// What a relay did while it ran, as [`Relay::run`] reports it (the queue's counts table
/// adds up every relay's, [`Queue::counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Messages handed to the broker (each send).
    pub relayed: u64,
    /// Messages the broker confirmed, removed from the queue.
    pub confirmed: u64,
    /// Messages to be sent again: given back unconfirmed, or claimed again after another
    /// relay's lease ran out.
    pub resent: u64,
    /// Messages the broker refused for good, dead-lettered.
    pub refused: u64,
}

/// What happened since the last addition to the counts table, and in all.
#[derive(Debug, Default)]
struct Tally {
    now: [AtomicU64; 4],
    all: [AtomicU64; 4],
}

const KINDS: [Counted; 4] = [Counted::Relayed, Counted::Confirmed, Counted::Resent, Counted::Refused];

impl Tally {
    fn add(&self, kind: Counted, n: u64) {
        if let Some(i) = KINDS.iter().position(|k| *k == kind) {
            self.now[i].fetch_add(n, Ordering::Relaxed);
            self.all[i].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// [`flush`](Self::flush) run to its end even if the relay stops meanwhile
    /// ([`to_the_end`]).
    async fn flush_to_the_end<DB: Db>(tally: &Arc<Self>, queue: &Queue<DB>) {
        let (tally, queue) = (tally.clone(), queue.clone());
        to_the_end(async move { tally.flush(&queue).await }).await;
    }

    /// Adds what happened since the last time to the queue's counts.
    async fn flush<DB: Db>(&self, queue: &Queue<DB>) {
        for (i, kind) in KINDS.into_iter().enumerate() {
            let n = self.now[i].swap(0, Ordering::Relaxed);
            queue.add_count(kind, n).await;
        }
    }

    fn report(&self) -> RelayReport {
        let all = |i: usize| self.all[i].load(Ordering::Relaxed);
        RelayReport { relayed: all(0), confirmed: all(1), resent: all(2), refused: all(3) }
    }
}

/// When the next claim may go: after a batch the broker could not take, the relay waits
/// before it claims again, twice as long each time in a row.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    until: Option<Instant>,
}

impl Backoff {
    fn failed(&mut self) -> Duration {
        // Batches at the broker together fail together: one wait for them all, not one
        // doubling each.
        let now = Instant::now();
        if let Some(until) = self.until
            && until > now
        {
            return until - now;
        }
        let wait = self.next;
        self.until = Some(now + wait);
        self.next = (wait * 2).min(MAX_BACKOFF);
        wait
    }

    fn succeeded(&mut self) {
        self.next = MIN_BACKOFF;
    }
}

/// The relay's own tasks, aborted when [`Relay::run`]'s future is dropped before it
/// returns (its task aborted, a `select!` that took another branch): without this the
/// claims would go on, each taking a batch no one sends, held until its lease runs out.
struct Tasks(Vec<tokio::task::AbortHandle>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A batch between claim and settlement.
struct Batch<DB: Db> {
    deliveries: Vec<Delivery<DB>>,
    _permit: OwnedSemaphorePermit,
}

/// Relays a queue to a message broker: the transactional outbox's second half. Build it
/// with [`new`](Self::new), set what differs from the defaults, then [`run`](Self::run).
///
/// ```no_run
/// # #[cfg(feature = "nats")]
/// # async fn f(queue: rowbus::Queue<rowbus::sqlx::Postgres>) -> Result<(), rowbus_relay::RelayError> {
/// use rowbus_relay::sink::nats::{NatsOptions, NatsSink};
/// use rowbus_relay::{Relay, Template};
///
/// let options = NatsOptions::new(Template::parse("orders.{group}")?, queue.table().to_string());
/// let sink = NatsSink::connect("nats://127.0.0.1:4222", options).await?;
/// Relay::new(queue, sink).batch(500).run().await?; // until the broker shuts down
/// # Ok(()) }
/// ```
pub struct Relay<DB: Db, S: Sink> {
    queue: Queue<DB>,
    sink: S,
    group: String,
    batch: usize,
    in_flight: usize,
    ordered: bool,
    transactional: bool,
    lease: Option<Duration>,
    until: Option<Shared<BoxFuture<'static, ()>>>,
}

impl<DB: Db, S: Sink> std::fmt::Debug for Relay<DB, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("queue", &self.queue.table().to_string())
            .field("system", &self.sink.system())
            .field("group", &self.group)
            .field("batch", &self.batch)
            .field("in_flight", &self.in_flight)
            .field("ordered", &self.ordered)
            .field("transactional", &self.transactional)
            .finish_non_exhaustive()
    }
}

impl<DB: Db, S: Sink> Relay<DB, S> {
    /// A relay of `queue`'s default group to `sink`: batches of [`DEFAULT_BATCH`],
    /// [`DEFAULT_IN_FLIGHT`] batches in flight, not ordered, claimed in transactions except
    /// on SQLite (see [`transactional`](Self::transactional)).
    pub fn new(queue: Queue<DB>, sink: S) -> Self {
        Relay {
            queue,
            sink,
            group: String::new(),
            batch: DEFAULT_BATCH,
            in_flight: DEFAULT_IN_FLIGHT,
            ordered: false,
            transactional: DB::BACKEND != Backend::Sqlite,
            lease: None,
            until: None,
        }
    }

    /// Relays this group's messages (`""`, the default group, by default). One relay
    /// relays one group; run one per group.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// Messages one claim takes, and one send hands to the broker, at most.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Batches between claim and settlement at once (claimed, being sent, being settled):
    /// more keep the broker and the database busy together. `ordered` makes it one. Claimed
    /// in transactions, each holds a connection of the broker's pool until the broker has
    /// answered: leave the pool room beyond them for the broker's other statements.
    pub fn in_flight(mut self, batches: usize) -> Self {
        self.in_flight = batches.max(1);
        self
    }

    /// Keeps the group's order at the broker: one batch at a time, sent in the queue's
    /// claim order, the next claimed only once the last is settled; what the broker did
    /// not confirm is given back and goes first in the next batch. Without it, messages of
    /// one ordering key still reach the broker in order (the queue hands out a key's next
    /// message only once the one before it left), but messages without a key may pass
    /// each other between batches in flight. The order holds within one relay: several
    /// ordered relays of one group interleave their batches.
    pub fn ordered(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// Claims each batch by deleting it in a transaction held open until the broker
    /// answered (`true`, the default on PostgreSQL and MySQL/MariaDB), or under a lease,
    /// deleting what the broker confirmed afterwards (`false`, the default on SQLite).
    ///
    /// In a transaction each message is written once rather than twice, which about
    /// doubles what the database lets through (docs/relay.md has the figures); the price
    /// is a transaction and a pooled connection held per batch in flight while the broker
    /// answers. A relay that dies mid-batch leaves its transaction to be rolled back by the
    /// server: the messages are there again at once, not after a lease. When the broker
    /// does not confirm a whole batch, the whole batch is given back (its confirmed
    /// messages are sent again, with the same ids) and the relay waits before its next
    /// send. On SQLite, a transaction held open holds the database's one write lock, and
    /// with it every publisher.
    pub fn transactional(mut self, transactional: bool) -> Self {
        self.transactional = transactional;
        self
    }

    /// How long a claimed message stays with a relay claiming under leases before another
    /// may take it (the broker's options' lease by default): longer than a batch takes to
    /// be confirmed. A relay claiming in transactions holds no lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Stops the relay when `stop` resolves: no more claims; the batches in flight are
    /// sent and settled; then [`run`](Self::run) returns.
    pub fn until(mut self, stop: impl Future<Output = ()> + Send + 'static) -> Self {
        self.until = Some(stop.boxed().shared());
        self
    }

    /// Relays until [`until`](Self::until) resolves or the queue's broker shuts down;
    /// returns what it did. Fails only when the subscription cannot start (the queue is not
    /// deployed, a lease out of range, the broker shutting down).
    pub async fn run(self) -> Result<RelayReport, RelayError> {
        if self.transactional {
            return self.run_locked().await;
        }
        let Relay { queue, sink, group, batch, in_flight, ordered, transactional, lease, until } = self;
        let in_flight = if ordered { 1 } else { in_flight };
        let mut builder = queue.subscribe().group(group.clone()).batch(batch);
        if let Some(lease) = lease {
            builder = builder.lease(lease);
        }
        let subscription = builder.stream().await?;
        let system = sink.system();
        info!(table = %queue.table(), group, system, batch, in_flight, ordered, transactional, "relay started");

        let tally = Arc::new(Tally::default());
        let backoff = Arc::new(Mutex::new(Backoff { next: MIN_BACKOFF, until: None }));
        let permits = Arc::new(Semaphore::new(in_flight));
        let stop: Pin<Box<dyn Future<Output = ()> + Send>> = match until {
            Some(until) => Box::pin(until),
            None => Box::pin(std::future::pending()),
        };

        // Claims: a batch per permit, after any backoff.
        let (to_send, mut sending) = mpsc::channel::<Batch<DB>>(in_flight);
        let claims = {
            let (permits, backoff, tally) = (permits.clone(), backoff.clone(), tally.clone());
            let mut chunks = subscription.ready_chunks(batch);
            tokio::spawn(async move {
                let mut stop = stop;
                loop {
                    let permit = tokio::select! {
                        biased;
                        () = &mut stop => break,
                        permit = permits.clone().acquire_owned() => permit.expect("never closed"),
                    };
                    let wait = backoff.lock().await.until.take();
                    if let Some(until) = wait {
                        tokio::select! {
                            biased;
                            () = &mut stop => break,
                            () = tokio::time::sleep_until(until) => {}
                        }
                    }
                    let chunk = tokio::select! {
                        biased;
                        () = &mut stop => break,
                        chunk = chunks.next() => chunk,
                    };
                    let Some(chunk) = chunk else { break };
                    let mut deliveries = Vec::with_capacity(chunk.len());
                    for claimed in chunk {
                        match claimed {
                            Ok(delivery) => deliveries.push(delivery),
                            // The stream waits a while before its next claim.
                            Err(error) => warn!(%error, "relay: claim failed"),
                        }
                    }
                    if deliveries.is_empty() {
                        continue;
                    }
                    // Claimed again after a lease ran out: another relay (or this one,
                    // before a restart) sent it and did not settle it.
                    tally.add(Counted::Resent, deliveries.iter().filter(|d| d.attempt() > 1).count() as u64);
                    if to_send.send(Batch { deliveries, _permit: permit }).await.is_err() {
                        break;
                    }
                }
            })
        };

        // Settlements, in the order the batches were sent.
        let (to_settle, mut settling) = mpsc::unbounded_channel::<(Batch<DB>, Vec<Result<(), SinkError>>)>();
        let settlements = {
            let (queue, backoff, tally) = (queue.clone(), backoff.clone(), tally.clone());
            tokio::spawn(async move {
                while let Some((batch, results)) = settling.recv().await {
                    let (queue, backoff, tally) = (queue.clone(), backoff.clone(), tally.clone());
                    to_the_end(async move { settle(&queue, batch, results, &backoff, &tally, system).await })
                        .await;
                }
            })
        };

        let counting = counting(&queue, &tally);

        let _tasks = Tasks(vec![claims.abort_handle(), settlements.abort_handle(), counting.abort_handle()]);

        // Sends, on this task, which owns the sink: each batch as soon as it is claimed,
        // while the batches before it are still at the broker; handed on to be settled in
        // the order they were claimed.
        let mut sends = FuturesOrdered::new();
        let mut claiming = true;
        while claiming || !sends.is_empty() {
            tokio::select! {
                batch = sending.recv(), if claiming => match batch {
                    Some(batch) => {
                        let outgoing: Vec<Outgoing> = batch.deliveries.iter().map(|d| outgoing(d)).collect();
                        tally.add(Counted::Relayed, outgoing.len() as u64);
                        let sink = &sink;
                        sends.push_back(async move {
                            let results = send(sink, &outgoing).await;
                            (batch, results)
                        });
                    }
                    None => claiming = false,
                },
                Some(sent) = sends.next(), if !sends.is_empty() => {
                    if to_settle.send(sent).is_err() {
                        break;
                    }
                }
            }
        }
        drop(sends);
        drop(to_settle);
        let _ = claims.await;
        let _ = settlements.await;
        counting.abort();
        Tally::flush_to_the_end(&tally, &queue).await;
        let report = tally.report();
        info!(table = %queue.table(), system, ?report, "relay stopped");
        Ok(report)
    }
}

/// Adds what the relay did to the queue's counts every [`COUNT_EVERY`], until aborted.
fn counting<DB: Db>(queue: &Queue<DB>, tally: &Arc<Tally>) -> tokio::task::JoinHandle<()> {
    let (queue, tally) = (queue.clone(), tally.clone());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(COUNT_EVERY);
        every.tick().await;
        loop {
            every.tick().await;
            Tally::flush_to_the_end(&tally, &queue).await;
        }
    })
}

/// Runs `work` (statements on the queue's pool) on a task of its own and waits for it. A
/// relay stopped meanwhile (its future dropped, its tasks aborted) stops waiting, and the
/// statements still run to their end: sqlx's MySQL driver does not recover a connection
/// whose statement was cut off while its answer was being read, and the pool waited for
/// that connection for good.
async fn to_the_end<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) {
    let _ = tokio::spawn(work).await;
}

/// Hands `outgoing` to the sink: an answer for each message, in order.
async fn send<S: Sink>(sink: &S, outgoing: &[Outgoing]) -> Vec<Result<(), SinkError>> {
    let results = sink.send(outgoing).await;
    if results.len() == outgoing.len() {
        return results;
    }
    // A sink that does not answer for each message confirmed none of them.
    let reason = format!("{}: {} results for {} messages", sink.system(), results.len(), outgoing.len());
    warn!(reason, "relay: the sink's answer does not match its batch");
    outgoing.iter().map(|_| Err(SinkError::Unavailable(reason.clone()))).collect()
}

/// The message as the sink gets it.
fn outgoing(message: &TxMessage) -> Outgoing {
    Outgoing {
        id: message.id(),
        group: message.group().to_owned(),
        key: message.key().map(str::to_owned),
        headers: message.headers().iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        payload: message.payload().to_vec(),
        attempt: message.attempt(),
    }
}

/// A batch's messages (or their ids) sorted by the broker's answer to each.
struct Answers<T> {
    confirmed: Vec<T>,
    refused: Vec<(T, String)>,
    unsent: Vec<T>,
    /// Why the first unsent one was not taken; `None` when the broker took them all.
    first_reason: Option<String>,
}

impl<T> Answers<T> {
    fn sort(items: impl IntoIterator<Item = T>, results: Vec<Result<(), SinkError>>) -> Self {
        let mut answers =
            Answers { confirmed: Vec::new(), refused: Vec::new(), unsent: Vec::new(), first_reason: None };
        for (item, result) in items.into_iter().zip(results) {
            match result {
                Ok(()) => answers.confirmed.push(item),
                Err(SinkError::Refused(reason)) => answers.refused.push((item, reason)),
                Err(SinkError::Unavailable(reason)) => {
                    answers.first_reason.get_or_insert(reason);
                    answers.unsent.push(item);
                }
            }
        }
        answers
    }
}

/// What the relay's transactional handlers share: the sink, whose sends overlap, the
/// backoff and the tally.
struct Locked<S> {
    sink: S,
    backoff: std::sync::Mutex<Backoff>,
    tally: Arc<Tally>,
    table: String,
    system: &'static str,
}

impl<DB: Db, S: Sink> Relay<DB, S> {
    /// [`run`](Self::run) claiming in transactions: a transactional batch runner of
    /// `in_flight` workers whose handler sends its batch and ends it as the broker answered.
    async fn run_locked(self) -> Result<RelayReport, RelayError> {
        let Relay { queue, sink, group, batch, in_flight, ordered, until, .. } = self;
        let in_flight = if ordered { 1 } else { in_flight };
        let system = sink.system();
        let tally = Arc::new(Tally::default());
        let locked = Arc::new(Locked {
            sink,
            backoff: std::sync::Mutex::new(Backoff { next: MIN_BACKOFF, until: None }),
            tally: tally.clone(),
            table: queue.table().to_string(),
            system,
        });
        let mut builder = queue.subscribe().group(group.clone()).batch(batch).workers(in_flight);
        if let Some(until) = until {
            builder = builder.until(until);
        }
        info!(table = %queue.table(), group, system, batch, in_flight, ordered, transactional = true, "relay started");
        let counting = counting(&queue, &tally);
        let _tasks = Tasks(vec![counting.abort_handle()]);
        let ran = builder
            .run_batch_tx(move |_conn, messages| {
                let locked = locked.clone();
                Box::pin(async move { Ok::<_, std::convert::Infallible>(locked.relay(messages).await) })
            })
            .await;
        counting.abort();
        Tally::flush_to_the_end(&tally, &queue).await;
        ran?;
        let report = tally.report();
        info!(table = %queue.table(), system, ?report, "relay stopped");
        Ok(report)
    }
}

impl<S: Sink> Locked<S> {
    /// Sends a batch claimed in a transaction and says how the transaction ends: committed
    /// (the refused dead-lettered) when the broker answered for every message, rolled back
    /// when it could not take one of them.
    async fn relay(&self, messages: Vec<TxMessage>) -> BatchOutcome {
        let outgoing: Vec<Outgoing> = messages.iter().map(outgoing).collect();
        let n = outgoing.len() as u64;
        // After a batch the broker could not take, the sends wait.
        let wait = self.backoff.lock().expect("never poisoned").until;
        if let Some(until) = wait {
            tokio::time::sleep_until(until).await;
        }
        self.tally.add(Counted::Relayed, n);
        let results = send(&self.sink, &outgoing).await;
        let Answers { confirmed, refused, first_reason, .. } =
            Answers::sort(outgoing.iter().map(|message| message.id), results);
        let (table, system) = (&self.table, self.system);
        if let Some(reason) = first_reason {
            let wait = self.backoff.lock().expect("never poisoned").failed();
            warn!(%table, system, batch = n, ?wait, reason, "relay: the broker did not confirm; giving the batch back and waiting");
            self.tally.add(Counted::Resent, n);
            return BatchOutcome::Rollback;
        }
        self.backoff.lock().expect("never poisoned").succeeded();
        self.tally.add(Counted::Confirmed, confirmed.len() as u64);
        debug!(%table, confirmed = confirmed.len(), "relay: batch confirmed");
        if refused.is_empty() {
            return BatchOutcome::All(Outcome::Ack);
        }
        self.tally.add(Counted::Refused, refused.len() as u64);
        for (id, reason) in &refused {
            warn!(%table, id, reason, "relay: the broker refused a message; dead-lettered");
        }
        BatchOutcome::DeadLetter(refused)
    }
}

/// Settles a sent batch: the confirmed acknowledged together, the refused dead-lettered
/// with the broker's reason, the rest given back together and the next claim held back.
async fn settle<DB: Db>(
    queue: &Queue<DB>,
    batch: Batch<DB>,
    results: Vec<Result<(), SinkError>>,
    backoff: &Mutex<Backoff>,
    tally: &Tally,
    system: &str,
) {
    let Batch { deliveries, _permit } = batch;
    let Answers { confirmed, refused, unsent, first_reason } = Answers::sort(deliveries, results);
    let counts = (confirmed.len() as u64, unsent.len() as u64);
    if !confirmed.is_empty() {
        match queue.ack_all(confirmed).await {
            Ok(acked) => tally.add(Counted::Confirmed, acked),
            Err(error) => {
                warn!(%error, table = %queue.table(), "relay: acknowledging confirmed messages failed; they are sent again when their lease runs out");
            }
        }
    }
    for (delivery, reason) in refused {
        let id = delivery.id();
        match delivery.dead_letter(&reason).await {
            Ok(()) => {
                tally.add(Counted::Refused, 1);
                warn!(table = %queue.table(), id, reason, "relay: the broker refused a message; dead-lettered");
            }
            Err(error) => {
                warn!(%error, table = %queue.table(), id, "relay: dead-lettering a refused message failed")
            }
        }
    }
    if !unsent.is_empty() {
        let wait = backoff.lock().await.failed();
        let reason = first_reason.unwrap_or_default();
        warn!(table = %queue.table(), system, unconfirmed = counts.1, ?wait, reason, "relay: the broker did not confirm; giving the messages back and waiting");
        match queue.release_all(unsent).await {
            Ok(released) => tally.add(Counted::Resent, released),
            Err(error) => {
                warn!(%error, table = %queue.table(), "relay: giving back unconfirmed messages failed; they are sent again when their lease runs out");
            }
        }
    } else if counts.0 > 0 {
        backoff.lock().await.succeeded();
        debug!(table = %queue.table(), confirmed = counts.0, "relay: batch confirmed");
    }
}
