//! Publishing: the INSERT of a batch of messages, and the wake-ups of subscriptions in
//! other processes that go with it.

use std::sync::Arc;

use notify_table::DurationRange;
use tracing::Instrument as _;

use crate::broker::claim::handoff::GiveBack;
use crate::broker::exec::{DEADLOCK_TRIES, micros, queue_error, to_the_end};
use crate::broker::publish::coalesce::{Entry, Merged, SHARED_AT_MOST};
use crate::broker::settle::lease;
use crate::broker::telemetry;
use crate::broker::{BrokerTx, Message, Published, Queue, check_group};
use crate::driver::{Arg, ClaimedRow};
use crate::error::{Error, check_duration, is_retryable};
use crate::sql::Db;
use crate::sql::InsertForm;

/// Most messages one INSERT carries (at most six binds each).
const INSERT_CHUNK: usize = 1000;

/// What a statement carries besides its messages' contents: its SQL and the binds'
/// headers.
const STATEMENT_OVERHEAD: u64 = 64 * 1024;
/// What one row of an INSERT adds besides its contents.
const ROW_OVERHEAD: u64 = 48;

/// The largest message (payload and group) one statement can carry on this database.
pub(crate) async fn message_limit<DB: Db>(queue: &Queue<DB>) -> Result<u64, Error> {
    message_limit_on(queue, None).await
}

/// [`message_limit`], read (the first time) on `conn` when given, else on a pooled
/// connection. A transaction passes its own: with every pooled connection held by a
/// transaction, reading it on another would wait for the pool until one of them ends,
/// and none ends before its publish returns (MariaDB, 8 transactions on an 8-connection
/// pool, all timed out).
async fn message_limit_on<DB: Db>(
    queue: &Queue<DB>,
    conn: Option<&mut DB::Connection>,
) -> Result<u64, Error> {
    let inner = queue.inner();
    let limit = inner
        .statement_limit
        .get_or_try_init(|| async {
            let Some(sql) = DB::STATEMENT_LIMIT_SQL else { return Ok(DB::STATEMENT_LIMIT.0) };
            let sql = Arc::from(sql);
            let rows = match conn {
                Some(conn) => DB::fetch_rows(conn, &sql, &[], 0).await?,
                None => DB::fetch_rows(&mut *inner.pool.acquire().await?, &sql, &[], 0).await?,
            };
            Ok::<_, Error>(
                rows.first().map_or(DB::STATEMENT_LIMIT.0, |r| u64::try_from(r.int(0)).unwrap_or(0)),
            )
        })
        .await?;
    Ok(limit.saturating_sub(STATEMENT_OVERHEAD + ROW_OVERHEAD))
}

/// Refuses a batch with a group name, key or deduplication id rowbus refuses or a delay
/// over [`MAX_DURATION`](crate::limits::MAX_DURATION), before any of it is sent.
fn check(messages: &[Message]) -> Result<(), Error> {
    for m in messages {
        check_group(&m.group)?;
        m.check()?;
        check_duration("delay", m.delay, DurationRange::Span)?;
    }
    Ok(())
}

/// Checks `messages` before anything is sent (groups, delays, sizes); the message limit.
pub(crate) async fn checked<DB: Db>(queue: &Queue<DB>, messages: &[Message]) -> Result<u64, Error> {
    checked_on(queue, messages, None).await
}

/// [`checked`], the limit read on `conn` when given (see [`message_limit_on`]).
async fn checked_on<DB: Db>(
    queue: &Queue<DB>,
    messages: &[Message],
    conn: Option<&mut DB::Connection>,
) -> Result<u64, Error> {
    check(messages)?;
    let limit = message_limit_on(queue, conn).await?;
    if let Some(m) = messages.iter().find(|m| m.size() > limit) {
        let bytes = usize::try_from(m.size()).unwrap_or(usize::MAX);
        return Err(Error::MessageTooLarge { bytes, limit, setting: DB::STATEMENT_LIMIT.1 });
    }
    Ok(limit)
}

/// Publishes `messages` (checked, see [`checked`]) outside any transaction, merged with
/// the publishes of the queue made at the same moment when they fit one statement (see
/// [`coalesce`](crate::broker::publish::coalesce)), then wakes their groups' subscriptions.
pub(crate) async fn autocommitted<DB: Db>(
    queue: &Queue<DB>,
    messages: Vec<Message>,
    limit: u64,
) -> Result<Published, Error> {
    let bytes = statement_bytes(&messages);
    let mergeable = !messages.is_empty()
        && messages.len() <= if DB::ONE_WRITER { INSERT_CHUNK } else { SHARED_AT_MOST }
        && bytes <= limit
        && messages.iter().all(|m| m.dedup_id.is_none());
    if !mergeable {
        return send(queue, &messages, limit).await;
    }
    match queue.publishing.enter(messages, bytes) {
        Entry::Send(messages) => {
            let slot = Slot { queue: queue.clone(), limit };
            let sent = send(queue, &messages, limit).await;
            drop(slot);
            sent
        }
        // The statement's task only goes away with the runtime.
        Entry::Wait(carried) => carried.await.unwrap_or(Err(Error::ShuttingDown)),
    }
}

/// What became of a publish offered to a runner of this process.
enum HandOff {
    /// Stored leased to an idle runner and handed to it, under this id.
    Done(Published, i64),
    /// No runner took it: the messages, to publish as usual.
    Not(Vec<Message>),
}

/// Publishes `messages` straight to a runner of this broker that waits for work, when
/// they are one message a claim could take at once (no ordering key, no delay, no
/// deduplication id) and such a runner has a free worker (see
/// [`handoff`](crate::broker::claim::handoff)): one statement stores it leased to the
/// runner, unless a pause or a limit holds its group, and the runner starts it without
/// a claim. Nobody else is woken: the message is taken.
async fn hand_off<DB: Db>(queue: &Queue<DB>, mut messages: Vec<Message>) -> Result<HandOff, Error> {
    let [m] = &messages[..] else { return Ok(HandOff::Not(messages)) };
    if m.key.is_some() || m.dedup_id.is_some() || !m.delay.is_zero() {
        return Ok(HandOff::Not(messages));
    }
    let inner = queue.inner();
    let Some(reserved) = inner.wakers.reserve(queue.table().channel(), &m.group) else {
        return Ok(HandOff::Not(messages));
    };
    let (token, headers) = (inner.token(), m.headers_json());
    let args = [
        Arg::Text(&m.group),
        Arg::Bytes(&m.payload),
        Arg::Int(i64::from(m.priority)),
        headers.as_deref().map_or(Arg::Null, Arg::Text),
        Arg::Int(token),
        Arg::Int(micros(reserved.lease)),
        Arg::Text(&m.group),
        Arg::Text(&m.group),
    ];
    let mut conn = inner.pool.acquire().await?;
    let stored = DB::insert_handed(&mut conn, &queue.sql, &args).await.map_err(|e| queue_error(queue, e))?;
    drop(conn);
    let Some((id, created_at)) = stored else {
        reserved.refused();
        return Ok(HandOff::Not(messages));
    };
    inner.counters.handed_off();
    let m = messages.pop().expect("one message");
    let priority = i64::from(m.priority);
    let row = ClaimedRow {
        id,
        group: m.group,
        payload: m.payload,
        attempts: 1,
        created_at,
        priority,
        key: None,
        dedup_id: None,
        headers,
    };
    let give_back = give_back(queue, &row, token);
    reserved.send(row, token, give_back);
    Ok(HandOff::Done(Published { stored: 1, duplicates: Vec::new() }, id))
}

/// What gives a message handed over back, should its runner stop before starting it:
/// released at once (its attempt not counted), then its group woken here and elsewhere.
fn give_back<DB: Db>(queue: &Queue<DB>, row: &ClaimedRow, token: i64) -> GiveBack {
    let (queue, id, group) = (queue.clone(), row.id, row.group.clone());
    Box::new(move || {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            match lease::release(&queue, id, token).await {
                Ok(()) => wake_group(&queue, &group).await,
                Err(error) => {
                    tracing::warn!(%error, table = %queue.table(), id, "giving back a message handed to a runner that stopped failed; it returns when its lease runs out");
                }
            }
        });
    })
}

/// One INSERT's worth of the queue's publishes in flight. Dropped (its statement done, or
/// its publish's future dropped), it hands over to the publishes that waited meanwhile: a
/// task sends them, holding the slot in turn.
struct Slot<DB: Db> {
    queue: Queue<DB>,
    limit: u64,
}

impl<DB: Db> Drop for Slot<DB> {
    fn drop(&mut self) {
        let Some(merged) = self.queue.publishing.next(INSERT_CHUNK, self.limit) else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            merged.settle(Err(Error::ShuttingDown));
            self.queue.publishing.abandon(|| Error::ShuttingDown);
            return;
        };
        let slot = Slot { queue: self.queue.clone(), limit: self.limit };
        runtime.spawn(send_merged(slot, merged));
    }
}

async fn send_merged<DB: Db>(slot: Slot<DB>, merged: Merged) {
    let sent = send(&slot.queue, &merged.messages, slot.limit).await;
    merged.settle(sent.map(drop));
    drop(slot);
}

/// Inserts `messages` on a pooled connection, then wakes their groups' subscriptions,
/// here and (with `listen_notify`) in other processes.
async fn send<DB: Db>(queue: &Queue<DB>, messages: &[Message], limit: u64) -> Result<Published, Error> {
    let mut conn = queue.inner().pool.acquire().await?;
    let published = insert(queue, &mut conn, messages, limit, true).await?;
    let groups = groups_of(messages);
    wake_others(queue, &mut conn, &groups).await;
    drop(conn);
    for group in &groups {
        queue.inner().wakers.wake(queue.table().channel(), Some(group));
    }
    Ok(published)
}

/// What `messages` weigh against a statement's limit, as [`statements`] counts.
fn statement_bytes(messages: &[Message]) -> u64 {
    messages.iter().map(|m| m.size() + ROW_OVERHEAD).sum()
}

/// `messages` in runs that one INSERT each carries: at most [`INSERT_CHUNK`] rows whose
/// bytes stay within `limit`.
fn statements(messages: &[Message], limit: u64) -> impl Iterator<Item = &[Message]> {
    let mut rest = messages;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (mut rows, mut bytes) = (0, 0);
        while rows < rest.len().min(INSERT_CHUNK) {
            let next = rest[rows].size() + ROW_OVERHEAD;
            if rows > 0 && bytes + next > limit {
                break;
            }
            bytes += next;
            rows += 1;
        }
        let (run, after) = rest.split_at(rows);
        rest = after;
        Some(run)
    })
}

/// Inserts `messages` (checked, see [`checked`]) on `conn`, as few statements as
/// `limit` allows: those without a deduplication id together, each with one in a
/// statement of its own (whether it was a duplicate is the rows it stored). `alone`: no
/// transaction is open on `conn`, so a statement that deadlocked is tried again (an
/// insert of an id waits for the transaction that holds it, which may put it back).
pub(crate) async fn insert<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    messages: &[Message],
    limit: u64,
    alone: bool,
) -> Result<Published, Error> {
    let mut published = Published::default();
    let mut sent = 0;
    let mut told: Option<(&str, i16)> = None;
    // Only claims that skip the other priorities while their floor sees none waiting there
    // (those whose floors step: MySQL/MariaDB) need to hear of a publish.
    let stepped = queue.sql.floor_step.is_some();
    for m in messages.iter().filter(|_| stepped) {
        let group = (m.group.as_str(), m.priority);
        if told != Some(group) {
            queue.inner().upkeep.published(queue.table(), group.0, group.1);
            told = Some(group);
        }
    }
    let unique: Vec<&Message> = messages.iter().filter(|m| m.dedup_id.is_some()).collect();
    // Copies only when a batch mixes the two kinds.
    let plain: std::borrow::Cow<'_, [Message]> = match unique.len() {
        0 => messages.into(),
        _ => messages.iter().filter(|m| m.dedup_id.is_none()).cloned().collect::<Vec<_>>().into(),
    };
    for chunk in statements(&plain, limit) {
        let rows: Vec<Row<'_>> = chunk.iter().map(Row::of).collect();
        // Most messages carry only a payload: their columns' defaults do the rest.
        let form = rows.iter().map(Row::form).max().unwrap_or(InsertForm::Payload);
        let sql = queue.sql.insert_sql(form, chunk.len());
        let (skip, take) = form.binds();
        let args: Vec<Arg<'_>> = rows.iter().flat_map(|r| r.args().skip(skip).take(take)).collect();
        let keyed = chunk.iter().any(|m| m.key.is_some());
        published.stored += DB::insert_messages(conn, &queue.sql, &sql, &args, keyed)
            .await
            .map_err(|e| queue_error(queue, e))?;
        sent += 1;
    }
    for m in unique {
        let row = Row::of(m);
        let id = m.dedup_id.as_deref().unwrap_or_default();
        let args: Vec<Arg<'_>> = row.args().chain([Arg::Text(id)]).collect();
        let mut tries = 0;
        sent += 1;
        let stored = loop {
            tries += 1;
            match DB::insert_deduplicated(conn, &queue.sql, &args, alone).await {
                Err(e) if alone && is_retryable(&e) && tries < DEADLOCK_TRIES => continue,
                done => break done.map_err(|e| queue_error(queue, e))?,
            }
        };
        match stored {
            false => published.duplicates.push(id.to_owned()),
            true => published.stored += 1,
        }
    }
    queue.inner().counters.published(published.stored, sent);
    Ok(published)
}

/// One message's binds in an INSERT, in [`TableSql::insert`](crate::sql::TableSql::insert)'s order.
struct Row<'a> {
    m: &'a Message,
    delay: i64,
    headers: Option<String>,
}

impl<'a> Row<'a> {
    fn of(m: &'a Message) -> Self {
        Row { m, delay: micros(m.delay), headers: m.headers_json() }
    }

    /// The least an INSERT must bind of this message: [`InsertForm::Plain`] for the
    /// default priority, no key and no headers, [`InsertForm::Payload`] if also the
    /// default group and no delay.
    fn form(&self) -> InsertForm {
        let m = self.m;
        if m.priority != 0 || m.key.is_some() || self.headers.is_some() {
            InsertForm::Full
        } else if !m.group.is_empty() || self.delay != 0 {
            InsertForm::Plain
        } else {
            InsertForm::Payload
        }
    }

    fn args(&self) -> impl Iterator<Item = Arg<'_>> {
        [
            Arg::Text(&self.m.group),
            Arg::Bytes(&self.m.payload),
            Arg::Int(self.delay),
            Arg::Int(i64::from(self.m.priority)),
            self.m.key.as_deref().map_or(Arg::Null, Arg::Text),
            self.headers.as_deref().map_or(Arg::Null, Arg::Text),
        ]
        .into_iter()
    }
}

/// With `listen_notify`, wakes the subscriptions of `groups` in other processes, once
/// what they announce committed: where wake-ups go apart
/// ([`Waking::WAKES_APART`](crate::sql::Waking::WAKES_APART), PostgreSQL), handed to the
/// broker's [`WakeSender`](crate::broker::publish::wakes::WakeSender); elsewhere a
/// notification per group on `conn`, outside a transaction. A failure is logged: the poll
/// interval still reaches the rows.
pub(crate) async fn wake_others<DB: Db>(queue: &Queue<DB>, conn: &mut DB::Connection, groups: &[String]) {
    let inner = queue.inner();
    let Some(notifier) = &inner.notifier else { return };
    match &inner.wakes {
        Some(wakes) => wakes.wake(&inner.pool, &pairs(queue, groups)).await,
        None => DB::wake(conn, notifier, queue.table().channel(), groups).await,
    }
}

/// [`wake_others`] without a connection at hand: one is taken from the pool only where
/// the wake-up needs it.
pub(crate) async fn wake_others_pooled<DB: Db>(queue: &Queue<DB>, groups: &[String]) {
    let inner = queue.inner();
    if groups.is_empty() || inner.notifier.is_none() {
        return;
    }
    if let Some(wakes) = &inner.wakes {
        return wakes.wake(&inner.pool, &pairs(queue, groups)).await;
    }
    match inner.pool.acquire().await {
        Ok(mut conn) => wake_others(queue, &mut conn, groups).await,
        Err(error) => {
            tracing::warn!(%error, table = %queue.table(), "no connection to wake other processes; they wait for their poll interval");
        }
    }
}

/// The (table, group) pairs of `groups` in `queue`.
fn pairs<DB: Db>(queue: &Queue<DB>, groups: &[String]) -> Vec<(Arc<str>, String)> {
    groups.iter().map(|g| (queue.table().channel_arc().clone(), g.clone())).collect()
}

/// Wakes the subscriptions of `group`, here and (with `listen_notify`) in other
/// processes, as a publish does: a message became claimable without one, because the
/// message before it of its ordering key was acknowledged or dead-lettered.
pub(crate) async fn wake_group<DB: Db>(queue: &Queue<DB>, group: &str) {
    wake_others_pooled(queue, &[group.to_owned()]).await;
    queue.inner().wakers.wake(queue.table().channel(), Some(group));
}

/// [`wake_others`] inside a transaction, where the wake-up is written in it (a
/// notify-table row, delivered when it commits); where wake-ups go apart, nothing: the
/// commit hands them to the sender ([`BrokerTx::commit`]).
pub(crate) async fn wake_others_in_tx<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
    groups: &[String],
) {
    if !DB::WAKES_APART {
        wake_others(queue, conn, groups).await;
    }
}

/// The distinct groups of `messages`.
pub(crate) fn groups_of(messages: &[Message]) -> Vec<String> {
    let mut groups: Vec<String> = messages.iter().map(|m| m.group.clone()).collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

impl<DB: Db> Queue<DB> {
    /// Publishes one message; wakes this broker's subscriptions of its table and group.
    /// Stores nothing when it carries a [`dedup_id`](Message::dedup_id) a message in the
    /// queue has: [`Published::duplicates`] then names it.
    ///
    /// Publishes of one queue that overlap share statements: while two of its statements
    /// are on the way, the publishes that arrive wait, and the next statement carries all
    /// of them as one multi-row INSERT (one commit for many callers; a lone publisher
    /// never waits). Each publish still returns only when its own messages are stored,
    /// and a failed statement fails each publish it carried ([`Error::Shared`]). A publish
    /// whose future is dropped once polled is stored all the same: it runs to its end.
    /// Publishes with a deduplication id, and batches too large for one statement, go on
    /// their own. Inside a transaction ([`BrokerTx::publish`]) nothing is shared.
    ///
    /// When a runner of this broker on the message's group waits for work with a worker
    /// free, a message without an ordering key, delay or deduplication id goes straight
    /// to it: stored already leased to the runner (unless a pause or a limit holds the
    /// group, which the insert checks), and started without a claim
    /// ([`Stats::handed_off`](crate::stats::Stats::handed_off)).
    pub async fn publish(&self, message: Message) -> Result<Published, Error> {
        self.publish_batch(std::iter::once(message)).await
    }

    /// Publishes one message in a statement of its own (not shared with other publishes)
    /// and returns its id: `None` when it was not stored, a message with its
    /// [`dedup_id`](Message::dedup_id) being in the queue. The id is the one the database
    /// generated on the same connection, read right after the insert (PostgreSQL
    /// `lastval()`, MySQL/MariaDB `LAST_INSERT_ID()`, SQLite `last_insert_rowid()`): one
    /// more round trip than [`publish`](Self::publish). Wakes subscriptions as it does,
    /// and hands the message to a runner of this broker waiting for work as it does (then
    /// without the second round trip: the id comes back with the insert).
    pub async fn publish_with_id(&self, message: Message) -> Result<Option<i64>, Error> {
        let queue = self.clone();
        to_the_end(async move { queue.publish_with_id_now(message).await }).await
    }

    /// [`publish_with_id`](Self::publish_with_id) itself.
    async fn publish_with_id_now(&self, message: Message) -> Result<Option<i64>, Error> {
        let limit = checked(self, std::slice::from_ref(&message)).await?;
        let messages = match hand_off(self, vec![message]).await? {
            HandOff::Done(_, id) => return Ok(Some(id)),
            HandOff::Not(messages) => messages,
        };
        let mut conn = self.inner().pool.acquire().await?;
        let published = insert(self, &mut conn, &messages, limit, true).await?;
        let id = match published.stored {
            0 => None,
            _ => {
                let sql: Arc<str> = Arc::from(DB::LAST_ID_SQL);
                let rows = DB::fetch_rows(&mut conn, &sql, &[], 0).await.map_err(|e| queue_error(self, e))?;
                rows.first().and_then(|row| row.ints.first().copied().flatten())
            }
        };
        let groups = groups_of(&messages);
        wake_others(self, &mut conn, &groups).await;
        drop(conn);
        for group in &groups {
            self.inner().wakers.wake(self.table().channel(), Some(group));
        }
        Ok(id)
    }

    /// Publishes many messages in one statement (per 1,000; a message with a
    /// deduplication id in one of its own); says how many were stored and which ids were
    /// duplicates. Wakes each group's subscriptions once. Shares statements with other
    /// publishes of the queue made at the same moment, as [`publish`](Self::publish) says.
    pub async fn publish_batch(
        &self,
        messages: impl IntoIterator<Item = Message>,
    ) -> Result<Published, Error> {
        #[cfg_attr(not(feature = "opentelemetry"), expect(unused_mut))]
        let mut messages: Vec<Message> = messages.into_iter().collect();
        let span = telemetry::publish_span(self.table(), messages.len());
        #[cfg(feature = "opentelemetry")]
        telemetry::inject(&span, &mut messages);
        let queue = self.clone();
        to_the_end(
            async move {
                let limit = checked(&queue, &messages).await?;
                match hand_off(&queue, messages).await? {
                    HandOff::Done(published, _) => Ok(published),
                    HandOff::Not(messages) => autocommitted(&queue, messages, limit).await,
                }
            }
            .instrument(span),
        )
        .await
    }

    /// The largest message (payload and group, in bytes) the database takes: a publish of
    /// a larger one is refused with [`Error::MessageTooLarge`] before anything is sent.
    /// On MySQL/MariaDB it follows the server's `max_allowed_packet` (read once).
    pub async fn max_message_bytes(&self) -> Result<u64, Error> {
        message_limit(self).await
    }
}

impl<DB: Db> BrokerTx<DB> {
    /// Publishes one message in this transaction (see [`Queue::publish`]).
    pub async fn publish(&mut self, queue: &Queue<DB>, message: Message) -> Result<Published, Error> {
        self.publish_batch(queue, std::iter::once(message)).await
    }

    /// Publishes many messages in this transaction (see [`Queue::publish_batch`]). A
    /// deduplication id is taken when the transaction commits: another transaction
    /// publishing the same id meanwhile waits for this one to end.
    pub async fn publish_batch(
        &mut self,
        queue: &Queue<DB>,
        messages: impl IntoIterator<Item = Message>,
    ) -> Result<Published, Error> {
        #[cfg_attr(not(feature = "opentelemetry"), expect(unused_mut))]
        let mut messages: Vec<Message> = messages.into_iter().collect();
        let span = telemetry::publish_span(queue.table(), messages.len());
        #[cfg(feature = "opentelemetry")]
        telemetry::inject(&span, &mut messages);
        let channel = queue.table().channel_arc();
        let fresh: Vec<String> = groups_of(&messages)
            .into_iter()
            .filter(|group| !self.woken.iter().any(|(t, g)| t == channel && g == group))
            .collect();
        // The statements own the transaction while they run: dropped part way, they run
        // to their end on a task of their own (a statement cut off half way could cost the
        // pool its connection, on MariaDB), and the transaction is rolled back there.
        let (mut tx, queue) = (self.take_tx()?, queue.clone());
        let woken = fresh.clone();
        let (tx, published) = to_the_end(async move {
            let published = async {
                let limit = checked_on(&queue, &messages, Some(&mut *tx)).instrument(span.clone()).await?;
                let n = insert(&queue, &mut *tx, &messages, limit, false).instrument(span).await?;
                wake_others_in_tx(&queue, &mut *tx, &woken).await;
                Ok::<_, Error>(n)
            }
            .await;
            (tx, published)
        })
        .await;
        self.put_tx(tx);
        let n = published?;
        self.woken.extend(fresh.into_iter().map(|group| (channel.clone(), group)));
        Ok(n)
    }

    /// Publishes one message in this transaction (see [`BrokerTx::publish`]) and returns
    /// its id, read on the transaction's connection right after the insert (as
    /// [`Queue::publish_with_id`] does): `None` when a message with its deduplication id
    /// is in the queue. For the workflows, which record the message that runs each.
    pub(crate) async fn publish_with_id(
        &mut self,
        queue: &Queue<DB>,
        message: Message,
    ) -> Result<Option<i64>, Error> {
        let published = self.publish(queue, message).await?;
        if published.stored == 0 {
            return Ok(None);
        }
        let sql: Arc<str> = Arc::from(DB::LAST_ID_SQL);
        let rows = DB::fetch_rows(&mut **self.tx(), &sql, &[], 0).await.map_err(|e| queue_error(queue, e))?;
        Ok(rows.first().and_then(|row| row.ints.first().copied().flatten()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn rows_bind_no_more_than_they_set() {
        let form = |m: Message| Row::of(&m).form();
        assert_eq!(form(Message::text("x")), InsertForm::Payload);
        assert_eq!(form(Message::text("x").group("g")), InsertForm::Plain);
        assert_eq!(form(Message::text("x").delay(Duration::from_millis(1))), InsertForm::Plain);
        assert_eq!(form(Message::text("x").priority(-1)), InsertForm::Full);
        assert_eq!(form(Message::text("x").key("k")), InsertForm::Full);
        assert_eq!(form(Message::text("x").header("h", "v")), InsertForm::Full);
        // A dedup id goes in a statement of its own, not in these forms.
        assert_eq!(form(Message::text("x").dedup_id("d")), InsertForm::Payload);

        let m = Message::text("x").group("g");
        let row = Row::of(&m);
        let (skip, take) = InsertForm::Payload.binds();
        let binds: Vec<Arg<'_>> = row.args().skip(skip).take(take).collect();
        assert!(matches!(binds[..], [Arg::Bytes(b"x")]), "{binds:?}");
        let (skip, take) = InsertForm::Plain.binds();
        let binds: Vec<Arg<'_>> = row.args().skip(skip).take(take).collect();
        assert!(matches!(binds[..], [Arg::Text("g"), Arg::Bytes(b"x"), Arg::Int(0)]), "{binds:?}");
    }

    #[test]
    fn statements_stay_within_the_limit() {
        let m = |n: usize| Message::new(vec![0u8; n]);
        let sizes = |messages: &[Message], limit| {
            statements(messages, limit).map(<[Message]>::len).collect::<Vec<_>>()
        };
        assert_eq!(sizes(&[m(10), m(10), m(10)], 1000), vec![3]);
        // 100 + 32 per row: two fit in 300, the third goes alone.
        assert_eq!(sizes(&[m(100), m(100), m(100)], 300), vec![2, 1]);
        // One over the limit still goes (checked before), alone.
        assert_eq!(sizes(&[m(10), m(500), m(10)], 300), vec![1, 1, 1]);
        assert_eq!(sizes(&vec![m(0); 2500], u64::MAX), vec![1000, 1000, 500]);
        assert!(statements(&[], 10).next().is_none());
    }
}
