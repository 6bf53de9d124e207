//! The seam between the relay and a message broker: a [`Sink`] takes a batch of
//! [`Outgoing`] messages and says, for each, whether the broker confirmed it.

#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub mod amqp;
#[cfg(feature = "mqtt")]
#[cfg_attr(docsrs, doc(cfg(feature = "mqtt")))]
pub mod mqtt;

/// One message handed to a sink: what the broker is given.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The message's id in its queue: the broker's message id (with the queue's name where
    /// the broker deduplicates), the same each time the message is sent again.
    pub id: i64,
    /// The message's group (`""` for the default group).
    pub group: String,
    /// The message's ordering key, if it has one.
    pub key: Option<String>,
    /// The message's headers, in name order.
    pub headers: Vec<(String, String)>,
    /// The payload, byte for byte.
    pub payload: Vec<u8>,
    /// Which attempt to send it this is: 1 the first time.
    pub attempt: u32,
}

/// Why a sink did not deliver a message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// The broker could not be reached or did not confirm in time: send again later (same id).
    #[error("{0}")]
    Unavailable(String),
    /// The broker refused this message for good (too large, no route, ...): dead-letter it with this reason.
    #[error("{0}")]
    Refused(String),
}

/// A message broker the relay hands messages to.
///
/// Sends may overlap: a relay has up to its `in_flight` batches at the sink at once, so
/// that the broker is handed the next batch while it still confirms the last. No two
/// batches at the sink at once hold messages of one ordering key (the queue hands out a
/// key's next message only once the one before it left), and an ordered relay sends one
/// batch at a time.
pub trait Sink: Send + Sync + 'static {
    /// Sends every message of the batch and waits for the broker's confirmation of each;
    /// result i belongs to message i. Messages of one key in the batch are sent in the
    /// batch's order.
    fn send(
        &self,
        batch: &[Outgoing],
    ) -> impl std::future::Future<Output = Vec<Result<(), SinkError>>> + Send;
    /// The broker's name for logs and stats ("nats", "redis", "amqp", "mqtt").
    fn system(&self) -> &'static str;
}

/// One sink shared, by the relays of several groups or by a relay and the code that made
/// it: each send goes through to the shared sink, on its connection.
impl<S: Sink> Sink for std::sync::Arc<S> {
    fn send(
        &self,
        batch: &[Outgoing],
    ) -> impl std::future::Future<Output = Vec<Result<(), SinkError>>> + Send {
        (**self).send(batch)
    }

    fn system(&self) -> &'static str {
        (**self).system()
    }
}

#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

/// A broker's URL fit for messages and logs: any password replaced by `***`.
pub fn redact(url: &str) -> String {
    rowbus::redact(url)
}
