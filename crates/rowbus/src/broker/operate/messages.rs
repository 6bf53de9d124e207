//! A queue's messages for its operators: a page of those in the queue table (queued,
//! delayed, in flight, waiting to be retried), read-only, in id order with a cursor.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::broker::exec::retrying;
use crate::broker::publish::message::decode_headers;
use crate::broker::{Headers, Queue, check_group};
use crate::driver::{Arg, QueuedRow};
use crate::error::Error;
use crate::sql::Db;

/// The most messages one page of [`Queue::messages`] holds.
pub const MAX_MESSAGE_PAGE: u32 = 1000;

/// Which page of a queue's messages [`Queue::messages`] returns: those after an id, lowest
/// id first.
///
/// ```
/// let page = rowbus::MessagePage::default().group("mail").after(42).limit(50);
/// assert_eq!((page.after_id, page.limit), (Some(42), 50));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessagePage {
    /// Only this group's; every group's when `None`.
    pub group: Option<String>,
    /// Start after this id (the previous page's [`next`](Messages::next)); from the first
    /// when `None`.
    pub after_id: Option<i64>,
    /// The most to return, 1 to [`MAX_MESSAGE_PAGE`] (100 by default; others are brought
    /// within).
    pub limit: u32,
}

impl Default for MessagePage {
    fn default() -> Self {
        MessagePage { group: None, after_id: None, limit: 100 }
    }
}

impl MessagePage {
    /// This page, of `group` only.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// This page, starting after id `id`.
    pub fn after(mut self, id: i64) -> Self {
        self.after_id = Some(id);
        self
    }

    /// This page, at most `limit` long.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }
}

/// Where a message in the queue table stands, by the database's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageState {
    /// Claimable now (a lease that ran out included).
    Queued,
    /// Not yet claimable, never tried: published with a delay, or snoozed before its first
    /// counted attempt.
    Delayed,
    /// Claimed, under a lease that has not run out.
    InFlight,
    /// Not yet claimable, tried before: waiting for a retry's backoff (or a snooze after a
    /// counted attempt).
    Retrying,
}

impl MessageState {
    /// `queued`, `delayed`, `in_flight`, `retrying`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Queued => "queued",
            MessageState::Delayed => "delayed",
            MessageState::InFlight => "in_flight",
            MessageState::Retrying => "retrying",
        }
    }
}

/// A message in a queue table, as [`Queue::messages`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuedMessage {
    /// Its id.
    pub id: i64,
    /// Its group.
    pub group: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its attempts so far (counting one in flight).
    pub attempts: i64,
    /// Its priority.
    pub priority: i16,
    /// Its ordering key, if it has one.
    pub key: Option<String>,
    /// Its last error, if an attempt failed.
    pub last_error: Option<String>,
    /// Its headers.
    pub headers: Headers,
    /// When it was published.
    pub published_at: SystemTime,
    /// Where it stands.
    pub state: MessageState,
    /// How long until it is claimable (zero when it is, and while in flight it is its
    /// lease that counts).
    pub visible_in: Duration,
    /// While in flight: how long its lease has left.
    pub lease_left: Option<Duration>,
}

impl QueuedMessage {
    fn from_row(row: QueuedRow) -> Self {
        let ahead = |age: i64| Duration::from_micros(u64::try_from(-age).unwrap_or(0));
        let lease_left = row.lease_age.filter(|age| *age < 0).map(ahead);
        let state = match (lease_left, row.visible_age < 0) {
            (Some(_), _) => MessageState::InFlight,
            (None, true) if row.attempts > 0 => MessageState::Retrying,
            (None, true) => MessageState::Delayed,
            (None, false) => MessageState::Queued,
        };
        QueuedMessage {
            id: row.id,
            group: row.group,
            payload: row.payload,
            attempts: row.attempts,
            priority: i16::try_from(row.priority).unwrap_or_default(),
            key: row.key,
            last_error: row.last_error,
            headers: decode_headers(row.headers.as_deref()),
            published_at: SystemTime::UNIX_EPOCH
                + Duration::from_micros(u64::try_from(row.created_at).unwrap_or(0)),
            state,
            visible_in: ahead(row.visible_age),
            lease_left,
        }
    }
}

/// A page of a queue's messages, and where the next one starts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Messages {
    /// The messages, lowest id first.
    pub messages: Vec<QueuedMessage>,
    /// The [`after_id`](MessagePage::after_id) of the next page, when this one was full
    /// (the next may still be empty); `None` at the end.
    pub next: Option<i64>,
}

impl<DB: Db> Queue<DB> {
    /// A page of the messages in the queue table (queued, delayed, in flight or waiting
    /// for a retry), lowest id first, read-only. Each page reads the table as it stands:
    /// messages handled meanwhile are gone, new ones come at the end.
    pub async fn messages(&self, page: &MessagePage) -> Result<Messages, Error> {
        if let Some(group) = &page.group {
            check_group(group)?;
        }
        let limit = page.limit.clamp(1, MAX_MESSAGE_PAGE);
        let sql = Arc::from(self.sql.messages_list(page.group.is_some()));
        let mut args: Vec<Arg<'_>> = page.group.as_deref().map(Arg::Text).into_iter().collect();
        args.push(Arg::Int(page.after_id.unwrap_or(0)));
        args.push(Arg::Int(i64::from(limit)));
        let (pool, sql, args) = (&self.inner().pool, &sql, &args);
        let rows =
            retrying(self, || async move { DB::fetch_queued(&mut *pool.acquire().await?, sql, args).await })
                .await?;
        let full = rows.len() >= limit as usize;
        let messages: Vec<QueuedMessage> = rows.into_iter().map(QueuedMessage::from_row).collect();
        let next = if full { messages.last().map(|m| m.id) } else { None };
        Ok(Messages { messages, next })
    }
}
