//! NATS JetStream: each message published to its subject and the stream's PubAck awaited.
//!
//! A batch is published back to back on one connection and its PubAcks awaited together,
//! so a batch costs about one round trip. `Nats-Msg-Id` is `<id prefix>:<id>` (the CLI's
//! prefix is the queue's name): a message sent again carries the same id, and JetStream
//! drops it within the stream's duplicate window. The relay does not create streams: the
//! subjects it publishes to must be covered by a stream of yours, or every message is
//! refused ("no stream") and dead-lettered.

use std::str::FromStr as _;
use std::time::Duration;

use async_nats::jetstream::context::{Context, ContextBuilder, PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use futures::StreamExt as _;
use futures::stream::FuturesOrdered;

use crate::error::RelayError;
use crate::sink::{Outgoing, Sink, SinkError, redact};
use crate::template::Template;

/// The header that carries the message's group.
pub const GROUP_HEADER: &str = "Rowbus-Group";
/// The header that carries the message's ordering key, when it has one.
pub const KEY_HEADER: &str = "Rowbus-Key";
/// JetStream's deduplication header.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// The most PubAcks a sink waits for at once. The client holds a permit for each until it
/// is awaited, and a publish waits for a free one: a send of a larger batch awaits the
/// oldest PubAcks before it publishes more.
pub const MAX_ACKS_PENDING: usize = 5_000;

/// How a [`NatsSink`] publishes.
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// The subject of each message (`{group}` and `{key}` may appear in it).
    pub subject: Template,
    /// What `Nats-Msg-Id` starts with, before `:` and the message's id: the queue's name,
    /// so that two queues' messages of the same id are not taken for duplicates.
    pub id_prefix: String,
    /// How long a PubAck may take before the message counts as unconfirmed (sent again
    /// later): 5 seconds by default.
    pub ack_timeout: Duration,
}

impl NatsOptions {
    /// Publishing to `subject`, message ids prefixed with `id_prefix`, the default timeout.
    pub fn new(subject: Template, id_prefix: impl Into<String>) -> Self {
        NatsOptions { subject, id_prefix: id_prefix.into(), ack_timeout: Duration::from_secs(5) }
    }
}

/// A [`Sink`] to NATS JetStream. The client reconnects by itself after the server comes
/// back; meanwhile sends are unconfirmed ([`SinkError::Unavailable`]).
#[derive(Debug)]
pub struct NatsSink {
    jetstream: Context,
    options: NatsOptions,
}

impl NatsSink {
    /// Connects to the NATS server at `url` (`nats://host:port`, with `user:password@`
    /// where the server wants them). Fails when the server cannot be reached now.
    ///
    /// A subject template whose own text NATS refuses ([`check_subject_template`]) is
    /// [`RelayError::Config`], before any connection.
    pub async fn connect(url: &str, options: NatsOptions) -> Result<NatsSink, RelayError> {
        check_subject_template(&options.subject)?;
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(|e| RelayError::Connect { system: "nats", url: redact(url), reason: e.to_string() })?;
        let jetstream = ContextBuilder::new()
            .timeout(options.ack_timeout)
            .max_ack_inflight(MAX_ACKS_PENDING)
            .backpressure_on_inflight(true)
            .build(client);
        Ok(NatsSink { jetstream, options })
    }

    /// The headers of `message`: its own, then the group, the key and the message id.
    fn headers(&self, message: &Outgoing) -> Result<HeaderMap, SinkError> {
        let mut headers = HeaderMap::new();
        let mut add = |name: &str, value: &str| {
            let name = HeaderName::from_str(name)
                .map_err(|_| SinkError::Refused(format!("nats: {name:?} cannot be a header name")))?;
            let value = HeaderValue::from_str(value).map_err(|_| {
                SinkError::Refused(format!("nats: the value of header {name} cannot be sent"))
            })?;
            headers.append(name, value);
            Ok::<(), SinkError>(())
        };
        for (name, value) in &message.headers {
            add(name, value)?;
        }
        add(GROUP_HEADER, &message.group)?;
        if let Some(key) = &message.key {
            add(KEY_HEADER, key)?;
        }
        add(MSG_ID_HEADER, &format!("{}:{}", self.options.id_prefix, message.id))?;
        Ok(headers)
    }

    /// Publishes `message`: the PubAck to wait for, or why it was not sent.
    async fn publish(&self, message: &Outgoing) -> Result<PublishAckFuture, SinkError> {
        let subject = self.options.subject.render(&message.group, message.key.as_deref());
        check_subject(&subject)?;
        let headers = self.headers(message)?;
        let publish =
            PublishMessage::build().payload(bytes::Bytes::copy_from_slice(&message.payload)).headers(headers);
        self.jetstream.send_publish(subject, publish).await.map_err(|e| match e.kind() {
            PublishErrorKind::MaxPayloadExceeded => SinkError::Refused(format!("nats: {e}")),
            _ => SinkError::Unavailable(format!("nats: {e}")),
        })
    }

    /// The JetStream stream that takes messages published to `subject`, if any: without
    /// one, every message sent there is refused ("no stream") and dead-lettered.
    pub async fn stream_for(&self, subject: &str) -> Result<Option<String>, RelayError> {
        use async_nats::jetstream::context::GetStreamByNameErrorKind;
        match self.jetstream.stream_by_subject(subject).await {
            Ok(name) => Ok(Some(name)),
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => Ok(None),
            Err(e) => Err(RelayError::Config {
                system: "nats",
                reason: format!("cannot look up the JetStream stream of subject {subject:?}: {e}"),
            }),
        }
    }
}

/// Refuses a subject template that no message can be published to, whatever its group
/// and key: white space, an empty token or a wildcard (`*`, `>`) in its own text.
///
/// ```
/// use rowbus_relay::Template;
/// use rowbus_relay::sink::nats::check_subject_template;
/// assert!(check_subject_template(&Template::parse("orders.{group}")?).is_ok());
/// assert!(check_subject_template(&Template::parse("orders.>")?).is_err());
/// # Ok::<(), rowbus_relay::RelayError>(())
/// ```
pub fn check_subject_template(subject: &Template) -> Result<(), RelayError> {
    match subject_fault(&subject.sample()) {
        Some(why) => Err(RelayError::Config {
            system: "nats",
            reason: format!(
                "subject {:?} {why}: a relay publishes each message to one subject, never a pattern",
                subject.as_str()
            ),
        }),
        None => Ok(()),
    }
}

/// Why the PubAck of a message published to `subject` is not a confirmation.
fn ack_error(subject: &str, error: &async_nats::jetstream::context::PublishError) -> SinkError {
    use std::error::Error as _;
    match error.kind() {
        PublishErrorKind::StreamNotFound => {
            SinkError::Refused(format!("nats: no JetStream stream covers subject {subject:?}"))
        }
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe | PublishErrorKind::MaxAckPending => {
            SinkError::Unavailable(format!("nats: {error}"))
        }
        _ => match error.source().and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>()) {
            // 503: JetStream is not available now (starting, no quorum).
            Some(api) if api.code() == 503 => SinkError::Unavailable(format!("nats: {api}")),
            // The stream refused it: too large for the stream, a sealed stream, ...
            Some(api) => SinkError::Refused(format!("nats: {api}")),
            None => SinkError::Unavailable(format!("nats: {error}")),
        },
    }
}

/// Refuses a subject NATS would refuse: empty, with white space, an empty token or a
/// wildcard.
fn check_subject(subject: &str) -> Result<(), SinkError> {
    match subject_fault(subject) {
        Some(why) => Err(SinkError::Refused(format!("nats: subject {subject:?} {why}"))),
        None => Ok(()),
    }
}

/// What NATS refuses in `subject` as one to publish to, if anything.
fn subject_fault(subject: &str) -> Option<&'static str> {
    if subject.chars().any(char::is_whitespace) {
        return Some("has white space");
    }
    subject.split('.').find_map(|token| match token {
        "" => Some("has an empty token"),
        "*" | ">" => Some("has a wildcard (* or >)"),
        _ => None,
    })
}

impl Sink for NatsSink {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        // Published back to back, at most MAX_ACKS_PENDING PubAcks awaited at once; once
        // one could not be handed to the client (the connection's buffer full while the
        // server is away), the rest are not tried.
        let mut results = Vec::with_capacity(batch.len());
        let mut acks = FuturesOrdered::new();
        let mut down: Option<String> = None;
        for message in batch {
            if acks.len() >= MAX_ACKS_PENDING
                && let Some(result) = acks.next().await
            {
                results.push(result);
            }
            let subject = self.options.subject.render(&message.group, message.key.as_deref());
            let sent = match &down {
                Some(reason) => Err(SinkError::Unavailable(reason.clone())),
                None => {
                    // The client's MAX_ACKS_PENDING are shared by the sends at the sink,
                    // and each PubAck awaited holds one until it is read: this send reads
                    // its own while it waits for one to be free, or sends that overlap
                    // could each wait for the others'.
                    let publish = self.publish(message);
                    tokio::pin!(publish);
                    loop {
                        tokio::select! {
                            biased;
                            sent = &mut publish => break sent,
                            Some(result) = acks.next(), if !acks.is_empty() => results.push(result),
                        }
                    }
                }
            };
            if let Err(SinkError::Unavailable(reason)) = &sent {
                down.get_or_insert_with(|| reason.clone());
            }
            acks.push_back(async move {
                match sent {
                    Ok(ack) => ack.await.map(drop).map_err(|e| ack_error(&subject, &e)),
                    Err(e) => Err(e),
                }
            });
        }
        while let Some(result) = acks.next().await {
            results.push(result);
        }
        results
    }

    fn system(&self) -> &'static str {
        "nats"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_nats_would_refuse_are_refused() {
        assert!(check_subject("orders.eu").is_ok());
        assert!(check_subject("orders").is_ok());
        for bad in ["", "orders.", ".orders", "a..b", "a b", "a.*", "a.>", "tab\there"] {
            assert!(matches!(check_subject(bad), Err(SinkError::Refused(_))), "{bad:?}");
        }
    }

    /// A template's own text is checked; what its placeholders stand for is not known yet.
    #[test]
    fn templates_nats_would_refuse_are_refused() {
        for good in ["orders.{group}", "{group}.{key}", "a*.{key}", "orders"] {
            assert!(check_subject_template(&Template::parse(good).unwrap()).is_ok(), "{good:?}");
        }
        for (bad, says) in [
            ("orders.*", "has a wildcard"),
            ("orders.>", "has a wildcard"),
            ("{group}.>", "has a wildcard"),
            ("orders new.{group}", "white space"),
            ("orders..{key}", "empty token"),
            ("orders.", "empty token"),
        ] {
            match check_subject_template(&Template::parse(bad).unwrap()) {
                Err(RelayError::Config { system: "nats", reason }) => {
                    assert!(reason.contains(says) && reason.contains(&format!("{bad:?}")), "{reason}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
