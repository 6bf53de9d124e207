//! What a publish carries ([`Message`]) and what it reports ([`Published`]).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::Error;

/// A message's headers: string keys and values, kept in key order.
pub type Headers = BTreeMap<String, String>;

/// The header that carries a message's own timeout ([`Message::timeout`]), in whole
/// milliseconds.
pub const TIMEOUT_HEADER: &str = "rowbus-timeout-ms";

/// The longest ordering key or deduplication id, in characters (what a MySQL/MariaDB
/// index column holds).
pub const MAX_KEY_CHARS: usize = 255;

/// A message to publish: a payload (bytes, text or JSON), a group, and optionally a
/// delay, a priority, an ordering key, a deduplication id and headers.
///
/// ```
/// use std::time::Duration;
/// use rowbus::Message;
/// let m = Message::text("resize 42.png")
///     .group("images")
///     .delay(Duration::from_secs(5))
///     .priority(-1)
///     .key("user-7")
///     .dedup_id("resize-42")
///     .header("trace", "abc");
/// assert_eq!(m.payload(), b"resize 42.png");
/// assert_eq!(m.headers()["trace"], "abc");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    pub(crate) payload: Vec<u8>,
    pub(crate) group: String,
    pub(crate) delay: Duration,
    pub(crate) priority: i16,
    pub(crate) key: Option<String>,
    pub(crate) dedup_id: Option<String>,
    pub(crate) headers: Headers,
}

impl Message {
    /// A message with these bytes.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        Message { payload: payload.into(), ..Message::default() }
    }

    /// A message with this text.
    pub fn text(payload: impl Into<String>) -> Self {
        Message::new(payload.into().into_bytes())
    }

    /// A message with this value as JSON.
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        Ok(Message::new(serde_json::to_vec(value)?))
    }

    /// In this group of the table (`""`, the default, is the table's only group when it
    /// has none).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// Claimable only after this delay: at most [`MAX_DURATION`](crate::limits::MAX_DURATION)
    /// (100 years), or the publish is refused with [`Error::InvalidDuration`].
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Its priority: lower is claimed sooner (as in Oban, River and Solid Queue); 0 by
    /// default, negative allowed. Within one priority, messages go in publish order.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Its ordering key: the messages of one key (in this queue) are handled one at a
    /// time, in publish order, across every worker and process. A message waits while an
    /// earlier one of its key is in the queue (in flight, waiting for a retry, or
    /// delayed); other keys and messages without one go in parallel. At most
    /// [`MAX_KEY_CHARS`] characters, not ending with a space.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Its deduplication id: while a message with this id is in the queue (ready,
    /// delayed or in flight), publishing another stores nothing and reports it in
    /// [`Published::duplicates`]; once the first is acknowledged or dead-lettered the id
    /// publishes again. At most [`MAX_KEY_CHARS`] characters, not ending with a space.
    pub fn dedup_id(mut self, id: impl Into<String>) -> Self {
        self.dedup_id = Some(id.into());
        self
    }

    /// Adds a header (a second one of the same name replaces the first). Headers travel
    /// with the message to its delivery and its dead letter, and count towards its size.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// How long a handler may run on it: past that, a runner asks its handler to stop
    /// ([`Delivery::cancelled`](crate::broker::Delivery::cancelled)) and the attempt fails with
    /// "timed out after ..." as its error (retried, then dead-lettered, as any failure).
    /// Overrides the subscription's [`timeout`](crate::broker::SubscriptionBuilder::timeout).
    /// Greater than zero and at most [`MAX_DURATION`](crate::limits::MAX_DURATION), or the publish
    /// is refused; kept in whole milliseconds (at least one) as the header
    /// [`TIMEOUT_HEADER`], so it travels with the message to its retries, its dead letter
    /// and back.
    pub fn timeout(self, timeout: Duration) -> Self {
        let ms = timeout.as_millis().max(u128::from(!timeout.is_zero()));
        self.header(TIMEOUT_HEADER, ms.to_string())
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The headers as the queue table stores them: a JSON object, or none.
    pub(crate) fn headers_json(&self) -> Option<String> {
        (!self.headers.is_empty()).then(|| encode_headers(&self.headers))
    }

    /// Its bytes as a statement carries them: payload, group, key, id and headers.
    pub(crate) fn size(&self) -> u64 {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len() + 6).sum();
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        (self.payload.len() + self.group.len() + text(&self.key) + text(&self.dedup_id) + headers) as u64
    }

    /// Refuses a key or deduplication id the queue table cannot hold the same way on
    /// every database.
    pub(crate) fn check(&self) -> Result<(), Error> {
        check_key("key", self.key.as_deref())?;
        check_key("dedup_id", self.dedup_id.as_deref())?;
        check_timeout(&self.headers)
    }
}

fn check_key(field: &'static str, value: Option<&str>) -> Result<(), Error> {
    let Some(value) = value else { return Ok(()) };
    let invalid =
        |reason: &str| Error::InvalidMessage { field, value: value.to_owned(), reason: reason.to_owned() };
    if value.is_empty() {
        return Err(invalid("must not be empty (leave it out instead)"));
    }
    if value.chars().count() > MAX_KEY_CHARS {
        return Err(invalid("has at most 255 characters"));
    }
    // MySQL/MariaDB compare `'a '` and `'a'` as equal: refused so that a key means the
    // same on every database.
    if value.ends_with(' ') {
        return Err(invalid("must not end with a space"));
    }
    Ok(())
}

/// Refuses a timeout header that is not a whole number of milliseconds, greater than
/// zero and at most [`MAX_DURATION`](crate::limits::MAX_DURATION), saying so in the
/// header's own unit.
fn check_timeout(headers: &Headers) -> Result<(), Error> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else { return Ok(()) };
    let ms: Option<u64> = value.parse().ok();
    let in_range = |ms: u64| notify_table::DurationRange::Positive.contains(Duration::from_millis(ms));
    match ms {
        Some(ms) if in_range(ms) => Ok(()),
        _ => Err(Error::InvalidMessage {
            field: "timeout",
            value: value.clone(),
            reason: format!(
                "must be a whole number of milliseconds from 1 to {} (100 years) in the {TIMEOUT_HEADER} header",
                notify_table::MAX_DURATION.as_millis()
            ),
        }),
    }
}

/// A delivered message's own timeout, from its headers: none when it has none or one
/// that is not a positive number of milliseconds.
pub(crate) fn message_timeout(headers: &Headers) -> Option<Duration> {
    let ms: u64 = headers.get(TIMEOUT_HEADER)?.parse().ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Headers as a JSON object.
pub(crate) fn encode_headers(headers: &Headers) -> String {
    serde_json::to_string(headers).unwrap_or_else(|_| "{}".to_owned())
}

/// Headers from their stored JSON object; none for NULL. A value that is not an object of
/// strings (written by something else) is kept under the name `""` rather than lost.
pub(crate) fn decode_headers(stored: Option<&str>) -> Headers {
    match stored {
        None => Headers::new(),
        Some(json) => {
            serde_json::from_str(json).unwrap_or_else(|_| Headers::from([(String::new(), json.to_owned())]))
        }
    }
}

/// What a publish did: how many messages it stored, and the deduplication ids of those it
/// did not store because a message with that id is in the queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// Messages stored.
    pub stored: u64,
    /// The deduplication ids refused as duplicates, in the order published.
    pub duplicates: Vec<String>,
}

impl Published {
    /// Whether nothing was refused as a duplicate.
    pub fn all_stored(&self) -> bool {
        self.duplicates.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        assert!(Message::text("x").key("a").dedup_id("b").check().is_ok());
        let err = Message::text("x").key("a ").check().unwrap_err();
        assert!(matches!(err, Error::InvalidMessage { field: "key", .. }), "{err}");
        let err = Message::text("x").dedup_id("").check().unwrap_err();
        assert!(matches!(err, Error::InvalidMessage { field: "dedup_id", .. }), "{err}");
        assert!(Message::text("x").key("é".repeat(255)).check().is_ok());
        assert!(Message::text("x").key("é".repeat(256)).check().is_err());
    }

    /// A timeout header out of range is refused in its own words and unit: milliseconds as
    /// written, not a duration of nanoseconds.
    #[test]
    fn timeout_header_is_refused_in_milliseconds() {
        for value in ["0", "soon", "-5", "3153600000001"] {
            let err = Message::text("x").header(TIMEOUT_HEADER, value).check().unwrap_err();
            assert!(matches!(err, Error::InvalidMessage { field: "timeout", .. }), "{err}");
            assert_eq!(
                err.to_string(),
                format!(
                    "invalid message timeout {value:?}: it must be a whole number of milliseconds from 1 to \
                     3153600000000 (100 years) in the rowbus-timeout-ms header"
                )
            );
        }
        assert!(Message::text("x").header(TIMEOUT_HEADER, "1").check().is_ok());
        assert!(Message::text("x").timeout(Duration::from_micros(1)).check().is_ok());
    }

    #[test]
    fn headers_round_trip() {
        let m = Message::text("x").header("b", "2").header("a", "1\"");
        let json = m.headers_json().unwrap();
        assert_eq!(json, r#"{"a":"1\"","b":"2"}"#);
        assert_eq!(decode_headers(Some(&json)), m.headers);
        assert!(Message::text("x").headers_json().is_none());
        assert_eq!(decode_headers(Some("7"))[""], "7");
        assert!(m.size() > 1);
    }
}
