//! A claimed message and what its holder can do with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{debug, warn};

use crate::broker::claim::slot::Slot;
use crate::broker::exec::to_the_end;
use crate::broker::operate::counts::{self, Counted};
use crate::broker::publish::message::{decode_headers, message_timeout};
use crate::broker::settle::control::{Control, StopReason};
use crate::broker::settle::lease;
use crate::broker::{Headers, Queue};
use crate::driver::ClaimedRow;
use crate::error::Error;
use crate::sql::Db;

/// What a handler decided about its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Done: delete it.
    Ack,
    /// Run it again after this delay (counts as an attempt). A delay over
    /// [`MAX_DURATION`](crate::limits::MAX_DURATION) is the attempt's failure instead: retried
    /// with the broker's backoff, the refusal recorded as its error.
    Retry(Duration),
    /// Discard it without running it again or dead-lettering it.
    Drop,
    /// Put it back to run after this delay, the attempt not counted (so
    /// [`RetryPolicy::max_attempts`](crate::RetryPolicy::max_attempts) is not used up) and
    /// its last error left as it was: not a failure, "not now". The next delivery has the
    /// same [`attempt`](Received::attempt). Counted in the queue's counts
    /// ([`Queue::counts`](crate::Queue::counts)). A delay over
    /// [`MAX_DURATION`](crate::limits::MAX_DURATION) is the attempt's failure instead, as for
    /// [`Retry`](Self::Retry). A transactional handler's snooze undoes its writes, as a
    /// failure does, and puts its messages back, their attempt not counted.
    Snooze(Duration),
}

impl From<()> for Outcome {
    fn from((): ()) -> Self {
        Outcome::Ack
    }
}

/// What a [`run_batch_tx`](crate::SubscriptionBuilder::run_batch_tx) handler decided
/// about its batch: one [`Outcome`] for every message, or an end its messages do not share.
///
/// ```no_run
/// # async fn f(queue: rowbus::Queue<sqlx::Postgres>) -> Result<(), rowbus::Error> {
/// use rowbus::BatchOutcome;
///
/// queue.subscribe().batch(100).run_batch_tx(|_conn, messages| Box::pin(async move {
///     // The empty ones go to the dead letters; the others are done.
///     let empty: Vec<(i64, String)> =
///         messages.iter().filter(|m| m.payload().is_empty()).map(|m| (m.id(), "empty".into())).collect();
///     Ok::<_, std::convert::Infallible>(match empty.is_empty() {
///         true => BatchOutcome::All(rowbus::Outcome::Ack),
///         false => BatchOutcome::DeadLetter(empty),
///     })
/// })).await
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchOutcome {
    /// Every message as this outcome says.
    All(Outcome),
    /// The messages named by id go to the dead letters, each with its reason as its last
    /// error (this attempt counted); the others are acknowledged. The handler's writes
    /// commit. An id not in the batch is ignored.
    DeadLetter(Vec<(i64, String)>),
    /// Undoes the batch: the handler's writes and the claim are rolled back, and the
    /// messages are back as they were, their attempt not counted and nothing counted:
    /// "not now" that leaves no trace, for a handler that could not reach what it hands
    /// the messages to. (On SQLite, whose batches of one broker may share a transaction,
    /// the messages are put back ready at once instead, their last error cleared, as a
    /// snooze of no delay does.) The next claim may take them at once: a handler that
    /// should wait before it tries again waits itself.
    Rollback,
}

impl From<Outcome> for BatchOutcome {
    fn from(outcome: Outcome) -> Self {
        BatchOutcome::All(outcome)
    }
}

impl From<()> for BatchOutcome {
    fn from((): ()) -> Self {
        BatchOutcome::All(Outcome::Ack)
    }
}

fn decode_text(id: i64, payload: &[u8]) -> Result<&str, Error> {
    std::str::from_utf8(payload).map_err(|e| Error::Payload { id, reason: e.to_string() })
}

fn decode_json<T: serde::de::DeserializeOwned>(id: i64, payload: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(payload).map_err(|e| Error::Payload { id, reason: e.to_string() })
}

fn published_at(row: &ClaimedRow) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(row.created_at).unwrap_or(0))
}

/// The lease on one claimed message: what settles it.
#[derive(Debug)]
pub(crate) struct Lease<DB: Db> {
    queue: Queue<DB>,
    id: i64,
    token: i64,
    attempt: u32,
    /// The message's group when it has an ordering key: settling it frees the key's next
    /// message, whose subscriptions are then woken.
    keyed: Option<Arc<str>>,
    /// Shared by a delivery and its runner's ticket: set once either settled it.
    settled: Arc<AtomicBool>,
    /// What the runner signals to the handler.
    control: Control,
    /// How long its handler may run ([`Message::timeout`](crate::broker::Message::timeout)).
    timeout: Option<Duration>,
}

impl<DB: Db> Clone for Lease<DB> {
    fn clone(&self) -> Self {
        Lease {
            queue: self.queue.clone(),
            id: self.id,
            token: self.token,
            attempt: self.attempt,
            keyed: self.keyed.clone(),
            settled: self.settled.clone(),
            control: self.control.clone(),
            timeout: self.timeout,
        }
    }
}

impl<DB: Db> Lease<DB> {
    fn settling(&self) {
        self.settled.store(true, Ordering::Release);
    }

    /// Claims the settling for the caller: `true` unless it was settled already.
    pub fn take(&self) -> bool {
        !self.settled.swap(true, Ordering::AcqRel)
    }

    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    pub fn id(&self) -> i64 {
        self.id
    }

    pub fn token(&self) -> i64 {
        self.token
    }

    /// What the runner signals to the handler.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// The message's own timeout, if it has one.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The queue it came from.
    pub fn queue(&self) -> &Queue<DB> {
        &self.queue
    }

    /// Whether the message has an ordering key.
    pub fn is_keyed(&self) -> bool {
        self.keyed.is_some()
    }

    /// The message's group, when it has an ordering key.
    pub fn keyed_group(&self) -> Option<&str> {
        self.keyed.as_deref()
    }

    /// After the message left the queue: wakes the subscriptions that can take the next
    /// message of its key, if it has one, and cleans up after it.
    pub async fn free_key(&self) {
        if let Some(group) = &self.keyed {
            crate::broker::publish::insert::wake_group(&self.queue, group).await;
            lease::keys_gone(&self.queue, &[self.id]).await;
        }
    }

    async fn ack(&self, dropped: bool) -> Result<(), Error> {
        self.settling();
        lease::ack(&self.queue, self.id, self.token, dropped).await?;
        self.free_key().await;
        Ok(())
    }

    async fn snooze(&self, after: Duration) -> Result<(), Error> {
        self.settling();
        lease::snooze(&self.queue, self.id, self.token, after).await?;
        counts::count(&self.queue, Counted::Snoozed, 1).await;
        Ok(())
    }

    async fn retry(&self, after: Duration, reason: &str) -> Result<(), Error> {
        self.settling();
        lease::retry(&self.queue, self.id, self.token, after, reason).await
    }

    /// Moves the message to the dead-letter table; where that fails, it runs again after
    /// the retry policy's delay for this attempt.
    async fn dead_letter(&self, reason: &str) -> Result<(), Error> {
        self.settling();
        let after = self.queue.inner().options.retry.delay(self.attempt);
        lease::dead_letter(&self.queue, self.id, self.token, reason, after).await?;
        self.free_key().await;
        Ok(())
    }

    async fn fail(&self, error: &str) -> Result<(), Error> {
        let policy = &self.queue.inner().options.retry;
        let (table, id, attempt) = (self.queue.table(), self.id, self.attempt);
        if policy.exhausted(attempt) {
            self.dead_letter(error).await?;
            warn!(%table, id, attempt, error, "dead-lettered");
            Ok(())
        } else {
            let after = policy.delay(attempt);
            debug!(%table, id, attempt, ?after, error, "retrying");
            self.retry(after, error).await
        }
    }

    /// Gives the message back at once, its attempt not counted, unless it was settled: its
    /// handler was aborted at the shutdown deadline. Whether it was given back.
    pub async fn abandon(&self) -> bool {
        if !self.take() {
            return false;
        }
        match lease::abandon(&self.queue, self.id, self.token).await {
            Ok(()) => true,
            Err(error) => {
                warn!(%error, table = %self.queue.table(), id = self.id, "giving an abandoned message back failed; it comes back when its lease runs out");
                false
            }
        }
    }

    /// Settles the message as a handler's result says, unless it settled it itself; to
    /// its end, also when the runner that called it stops meanwhile ([`to_the_end`]).
    pub async fn settle(&self, result: Result<Outcome, String>) {
        if self.is_settled() {
            return;
        }
        let lease = self.clone();
        to_the_end(async move { lease.settle_now(result).await }).await
    }

    /// [`settle`](Self::settle) itself.
    async fn settle_now(&self, result: Result<Outcome, String>) {
        let settled = match result {
            Ok(Outcome::Ack) => self.ack(false).await,
            Ok(Outcome::Retry(after)) => match lease::handler_retry(after) {
                (reason, Some(after)) => self.retry(after, &reason).await,
                (reason, None) => self.fail(&reason).await,
            },
            Ok(Outcome::Drop) => self.ack(true).await,
            Ok(Outcome::Snooze(after)) => match lease::handler_snooze(after) {
                Ok(after) => self.snooze(after).await,
                Err(reason) => self.fail(&reason).await,
            },
            Err(error) => self.fail(&error).await,
        };
        match settled {
            // Logged, counted and given back where it failed.
            Ok(()) | Err(Error::DeadLetterFailed { .. }) => {}
            Err(error) => {
                warn!(%error, table = %self.queue.table(), id = self.id, "settling a message failed; it comes back when its lease runs out");
            }
        }
    }
}

/// A message claimed under a lease. Acknowledge it, retry it, or let the lease run out
/// (then it comes back to a subscription). Every settlement is refused with
/// [`Error::LeaseLost`] once the lease ran out, so it never touches a message another
/// worker holds now. A settlement whose future is dropped part way still runs to its end.
#[derive(Debug)]
pub struct Delivery<DB: Db> {
    lease: Lease<DB>,
    message: Received,
    /// The start a rate gave it, if one did: its handler begins then.
    slot: Option<Slot>,
}

impl<DB: Db> std::ops::Deref for Delivery<DB> {
    type Target = Received;

    /// The message's contents: [`id`](Received::id), [`payload`](Received::payload),
    /// [`text`](Received::text), [`json`](Received::json), [`attempt`](Received::attempt)...
    fn deref(&self) -> &Received {
        &self.message
    }
}

impl<DB: Db> Delivery<DB> {
    pub(crate) fn new(queue: Queue<DB>, row: ClaimedRow, token: i64) -> Self {
        let attempt = u32::try_from(row.attempts).unwrap_or(u32::MAX);
        let keyed = row.key.is_some().then(|| Arc::from(row.group.as_str()));
        let message = Received::new(row, attempt);
        let timeout = message_timeout(&message.headers);
        let (id, settled, control) = (message.row.id, Arc::default(), Control::default());
        let lease = Lease { queue, id, token, attempt, keyed, settled, control, timeout };
        Delivery { lease, message, slot: None }
    }

    /// With the start a rate gave it (see `claim::limited::claim_in`).
    pub(crate) fn starting_at(mut self, slot: Option<Slot>) -> Self {
        self.slot = slot;
        self
    }

    /// The start a rate gave it, if one did.
    pub(crate) fn slot(&self) -> Option<Slot> {
        self.slot
    }

    /// What the runner signals to the handler.
    pub(crate) fn control(&self) -> &Control {
        &self.lease.control
    }

    /// The lease, for a runner to settle the message after its handler.
    pub(crate) fn lease(&self) -> Lease<DB> {
        self.lease.clone()
    }

    /// The queue it came from.
    pub fn queue(&self) -> &Queue<DB> {
        &self.lease.queue
    }

    /// Done: deletes it.
    pub async fn ack(self) -> Result<(), Error> {
        to_the_end(async move { self.lease.ack(false).await }).await
    }

    /// Runs it again after `after`, recording `reason` as its last error. An `after` over
    /// [`MAX_DURATION`](crate::limits::MAX_DURATION) is refused with [`Error::InvalidDuration`]
    /// and the message stays leased.
    pub async fn retry(self, after: Duration, reason: &str) -> Result<(), Error> {
        let reason = reason.to_owned();
        to_the_end(async move { self.lease.retry(after, &reason).await }).await
    }

    /// A failed attempt: retries with the broker's backoff, or dead-letters the message
    /// once it has used its attempts. A dead-letter move that fails is refused with
    /// [`Error::DeadLetterFailed`], and the message runs again after the backoff.
    pub async fn fail(self, error: &str) -> Result<(), Error> {
        let error = error.to_owned();
        to_the_end(async move { self.lease.fail(&error).await }).await
    }

    /// Moves it to the dead-letter table now, with `reason`. A move that fails (the
    /// dead-letter table missing, say) is refused with [`Error::DeadLetterFailed`] and the
    /// message runs again after the retry policy's delay, its attempt not counted.
    pub async fn dead_letter(self, reason: &str) -> Result<(), Error> {
        let reason = reason.to_owned();
        to_the_end(async move { self.lease.dead_letter(&reason).await }).await
    }

    /// Discards it: deleted, not dead-lettered.
    pub async fn discard(self) -> Result<(), Error> {
        to_the_end(async move { self.lease.ack(true).await }).await
    }

    /// Puts it back to run after `after`, the attempt not counted and its last error left
    /// as it was (see [`Outcome::Snooze`]). An `after` over
    /// [`MAX_DURATION`](crate::limits::MAX_DURATION) is refused with [`Error::InvalidDuration`]
    /// and the message stays leased.
    pub async fn snooze(self, after: Duration) -> Result<(), Error> {
        to_the_end(async move { self.lease.snooze(after).await }).await
    }

    /// Gives it back unstarted: claimable again at once, the attempt not counted.
    pub async fn release(self) -> Result<(), Error> {
        self.lease.settling();
        let lease = self.lease;
        to_the_end(async move { lease::release(&lease.queue, lease.id, lease.token).await }).await
    }

    /// Keeps it for `lease` more from now, for work that takes longer than the lease:
    /// extend before the lease runs out. A lease that already ran out (by the database's
    /// clock) is not renewed, even where nobody claimed the message since: the extension
    /// is refused with [`Error::LeaseLost`], as a settle by a stale holder is, and the
    /// message is claimable by anyone (a concurrency limit no longer counts it). A lease
    /// of zero or over [`MAX_DURATION`](crate::limits::MAX_DURATION) is refused with
    /// [`Error::InvalidDuration`].
    pub async fn extend_lease(&self, lease: Duration) -> Result<(), Error> {
        let held = self.lease.clone();
        to_the_end(async move { lease::extend(&held.queue, held.id, held.token, lease).await }).await
    }
}

/// What a received message holds: its id, group, payload, attempt, priority, key and
/// headers. A [`Delivery`] dereferences to it; a transactional handler gets it with the
/// claim's transaction.
#[derive(Debug)]
pub struct Received {
    row: ClaimedRow,
    attempt: u32,
    headers: Headers,
}

/// The message a transactional handler gets, with the claim's transaction: it is deleted
/// when that transaction commits.
pub type TxMessage = Received;

impl Received {
    /// The message of a row claimed without a lease, in a transaction: the claim did not
    /// count this attempt yet.
    pub(crate) fn locked(row: ClaimedRow) -> Self {
        let attempt = u32::try_from(row.attempts + 1).unwrap_or(u32::MAX);
        Received::new(row, attempt)
    }

    fn new(row: ClaimedRow, attempt: u32) -> Self {
        let headers = decode_headers(row.headers.as_deref());
        Received { row, attempt, headers }
    }

    /// The message's id in its table.
    pub fn id(&self) -> i64 {
        self.row.id
    }

    /// Its group (`""` by default).
    pub fn group(&self) -> &str {
        &self.row.group
    }

    /// Its payload.
    pub fn payload(&self) -> &[u8] {
        &self.row.payload
    }

    /// Its payload as UTF-8 text.
    pub fn text(&self) -> Result<&str, Error> {
        decode_text(self.row.id, &self.row.payload)
    }

    /// Its payload decoded from JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        decode_json(self.row.id, &self.row.payload)
    }

    /// Which attempt this is: 1 the first time.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When it was published (the database's clock; on MySQL/MariaDB, for a message a
    /// publish of this process handed straight to its runner, this process's clock as the
    /// insert left).
    pub fn published_at(&self) -> SystemTime {
        published_at(&self.row)
    }

    /// Its priority (lower is claimed sooner).
    pub fn priority(&self) -> i16 {
        i16::try_from(self.row.priority).unwrap_or_default()
    }

    /// Its ordering key, if it has one.
    pub fn key(&self) -> Option<&str> {
        self.row.key.as_deref()
    }

    /// Its deduplication id, if it has one.
    pub fn dedup_id(&self) -> Option<&str> {
        self.row.dedup_id.as_deref()
    }

    /// Its headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// One header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

impl<DB: Db> Delivery<DB> {
    /// Resolves when the runner asks this handler to stop: its message was cancelled
    /// ([`Queue::cancel`](crate::broker::Queue::cancel), from any process), or it ran past its
    /// timeout ([`Message::timeout`](crate::broker::Message::timeout),
    /// [`SubscriptionBuilder::timeout`](crate::broker::SubscriptionBuilder::timeout)). The
    /// handler should stop and return: after the subscription's
    /// [`grace`](crate::broker::SubscriptionBuilder::grace) the runner drops its future.
    /// Never resolves for a delivery taken from a [`stream`](crate::broker::SubscriptionBuilder::stream)
    /// (nothing watches it there).
    pub async fn cancelled(&self) -> StopReason {
        self.control().stopped().await
    }

    /// Whether the runner asked this handler to stop (see [`cancelled`](Self::cancelled)).
    pub fn is_cancelled(&self) -> bool {
        self.control().reason().is_some()
    }

    /// Why the runner asked this handler to stop, if it did.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.control().reason()
    }

    /// Resolves when the runner finds this message's lease lost: its lease ran out (and
    /// another consumer may hold it now), or another claim took it. Its settlement is then
    /// refused ([`Error::LeaseLost`](crate::error::Error::LeaseLost)): the handler may stop, its
    /// work may be done again elsewhere. The runner looks at every poll interval, and
    /// at each [`heartbeat`](crate::broker::SubscriptionBuilder::heartbeat).
    pub async fn lease_lost(&self) {
        self.control().lease_lost().await;
    }

    /// Whether the runner found this message's lease lost (see [`lease_lost`](Self::lease_lost)).
    pub fn is_lease_lost(&self) -> bool {
        self.control().is_lease_lost()
    }
}
