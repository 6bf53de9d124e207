//! What a listener yields, and what its task hands it.

use notify_table::Notification;

use crate::error::Error;

/// What a [`Listener`](super::Listener) yields.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event {
    /// A notification on a channel this listener listens on.
    Notification(Notification),
    /// A plain notification on a durable channel (PostgreSQL only): a `pg_notify` sent
    /// without a row in the notify table (not by a
    /// [`Notifier::durable`](crate::Notifier::durable)). Delivered while the listener is
    /// connected, as LISTEN delivers it, but kept nowhere: not counted by
    /// [`ack`](super::Listener::ack), and not delivered again after a restart or a
    /// reconnect. In order among themselves; durable notifications, in order among
    /// themselves, may come before or after them.
    Transient(Notification),
    /// The connection was lost. The listener reconnects by itself with capped
    /// exponential backoff, then reports [`Event::Reconnected`].
    Disconnected(Error),
    /// The listener has a new connection and listens again on every channel. On the
    /// notify table (MySQL/MariaDB, SQLite) each channel resumes where it was, so what was
    /// committed while the connection was lost is delivered now, unless it was cleaned up
    /// meanwhile; PostgreSQL's LISTEN starts afresh, and what was sent meanwhile is gone,
    /// except on its durable channels, which resume from the notify table too.
    Reconnected {
        /// The channels on which notifications may have been missed: resynchronise those
        /// from the database. Every plain channel on PostgreSQL; on the notify table only those
        /// whose position fell behind the retention while disconnected (a durable
        /// channel's rows are kept while it checked in within `durable_live`).
        missed: Vec<String>,
    },
    /// The listener stopped listening on a durable channel: another process took its
    /// name over ([`Error::DurableNameLost`]) after this one missed its lease.
    Stopped {
        /// The channel.
        channel: String,
        /// Why.
        error: Error,
    },
}

/// Where [`Listener::listen_durable`](super::Listener::listen_durable) starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// No position was stored under the name: listening starts now, as
    /// [`Listener::listen`](super::Listener::listen) does, and this position is stored.
    New,
    /// From the stored position: every notification committed after what was
    /// acknowledged is delivered (a notification delivered but not acknowledged before,
    /// again).
    Resumed,
    /// From the stored position, but it is older than the notify table's retention and
    /// the name was not checked in within `durable_live`: rows it had not read may have
    /// been cleaned up. What is still there is delivered; resynchronise from the database.
    Gap,
}

/// What the listener's task hands its [`Listener`](super::Listener).
#[derive(Debug)]
pub(crate) enum Item {
    Event(Event),
    /// From here on, count the notifications of this durable channel.
    Durable(String),
}
