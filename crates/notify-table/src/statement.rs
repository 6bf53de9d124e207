//! What crosses the boundary: statements out, rows in, notifications out.

use std::sync::Arc;

/// A bind value, in the order its placeholder appears in [`Statement::sql`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string (channel, payload, cutoff, SQLite time modifier).
    Text(Arc<str>),
    /// A signed integer (ids, microseconds, row limits, pids).
    Int(i64),
}

impl Value {
    /// The text, when this is [`Value::Text`].
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(text) => Some(text),
            Value::Int(_) => None,
        }
    }

    /// The integer, when this is [`Value::Int`].
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(int) => Some(*int),
            Value::Text(_) => None,
        }
    }
}

/// One SQL statement with `?` placeholders and the values to bind to them, in order.
///
/// The SQL text depends only on the configuration, the dialect and (for a poll) the
/// number of channels, so a driver's prepared-statement cache keeps hitting.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a statement does nothing until the caller runs it"]
pub struct Statement {
    /// The SQL, with one `?` per bind value.
    pub sql: Arc<str>,
    /// The values to bind, in placeholder order.
    pub binds: Vec<Value>,
}

/// A row of a subscribe or poll statement, as the caller's driver decoded it.
///
/// Both statements return the same six columns: `id`, `channel`, `payload`, `pid`,
/// `cutoff`, `at`. A notification row has `cutoff` NULL (`None`). Exactly one row of each
/// statement, its *head*, has a `cutoff` and carries the server's time in `at`: in a
/// subscribe statement it carries the channel's mark in `id`; in a poll statement its
/// other columns are `0` and empty. The other rows of a subscribe statement carry only an
/// `id`. A notification row read by a poll's id ranges (gaps and first windows) has its
/// `created_at` in `at`; every other notification row has `at` NULL.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Row {
    /// The notification's id (the mark, in a subscribe statement's cutoff row).
    pub id: u64,
    /// The channel as stored.
    pub channel: String,
    /// The payload as stored.
    pub payload: String,
    /// The notifying session's id.
    pub pid: u64,
    /// The server time minus lookback, as the server formatted it; `None` on data rows.
    pub cutoff: Option<String>,
    /// On the head row, the server's time, formatted like `cutoff`; on a row a poll's id
    /// ranges read, its `created_at`; otherwise `None`.
    pub at: Option<String>,
}

impl Row {
    /// A notification row.
    pub fn notification(id: u64, channel: impl Into<String>, payload: impl Into<String>, pid: u64) -> Self {
        Row { id, channel: channel.into(), payload: payload.into(), pid, cutoff: None, at: None }
    }

    /// The row carrying the cutoff (and, for a subscribe statement, the mark in `id`),
    /// without the server's time: gaps it opens never age out and a first window ends only
    /// when it watches no id (see [`Row::head`]).
    pub fn cutoff(id: u64, cutoff: impl Into<String>) -> Self {
        Row { id, cutoff: Some(cutoff.into()), ..Row::default() }
    }

    /// The head row as both statements return it: the cutoff, the server's time `at`,
    /// and for a subscribe statement the mark in `id`.
    pub fn head(id: u64, cutoff: impl Into<String>, at: impl Into<String>) -> Self {
        Row { id, cutoff: Some(cutoff.into()), at: Some(at.into()), ..Row::default() }
    }
}

/// A notification delivered to a listener: what PostgreSQL's `NOTIFY` delivers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Notification {
    /// The channel it was sent on.
    pub channel: String,
    /// The payload; an absent payload is the empty string.
    pub payload: String,
    /// The id of the session that sent it (`CONNECTION_ID()`, or the sender's process id
    /// on SQLite).
    pub pid: u64,
}
