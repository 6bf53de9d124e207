//! RabbitMQ (AMQP 0.9.1, through lapin): persistent, mandatory publishes on a channel in
//! confirm mode.
//!
//! A batch is published whole on one channel and only then are the broker's confirms
//! awaited, so a batch costs one round trip, not one per message. RabbitMQ keeps the order
//! of one channel's publishes into each queue, so messages of one key reach a queue in the
//! batch's order.
//!
//! What each outcome becomes:
//! - `basic.ack`: delivered.
//! - `basic.return` (the message was published `mandatory` and no queue is bound for its
//!   routing key): [`SinkError::Refused`] with the broker's reply (`312 NO_ROUTE`); the
//!   broker still acks a returned message, so the return is what tells.
//! - `basic.nack`: [`SinkError::Unavailable`]. RabbitMQ nacks when a queue could not take
//!   the message now (a full queue with `x-overflow: reject-publish`, a quorum queue
//!   without a majority): sent again later.
//! - The channel closed by the broker for a message larger than its `max_message_size`
//!   (`406 PRECONDITION_FAILED - message size ... is larger than configured max size ...`):
//!   that message is [`SinkError::Refused`], the other unconfirmed ones of the batch are
//!   [`SinkError::Unavailable`] (sent again on a new channel); later messages over that
//!   size are refused without being sent.
//! - Any other channel or connection error (the exchange deleted, the broker gone, no
//!   confirm within [`AmqpOptions::confirm_timeout`]): every unconfirmed message of the
//!   batch is [`SinkError::Unavailable`], and the next batch opens a new connection.

use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::MAX_SHORT_STRING_LENGTH;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind, ExchangeKind,
};
use rowbus::redact;

use crate::Template;
use crate::error::RelayError;
use crate::sink::{Outgoing, Sink, SinkError};

/// The header that carries the message's group (`""` for the default group).
pub const GROUP_HEADER: &str = "rowbus-group";
/// The header that carries the message's ordering key (absent when it has none).
pub const KEY_HEADER: &str = "rowbus-key";

/// How an [`AmqpSink`] publishes.
#[derive(Debug, Clone)]
pub struct AmqpOptions {
    /// The exchange; `""` is the default exchange, which routes to the queue named by the
    /// routing key.
    pub exchange: String,
    /// The routing key of each message (`{group}` and `{key}` may appear in it).
    pub routing_key: Template,
    /// What `message_id` starts with, before `:` and the message's id: the queue's name,
    /// so that two queues' messages of the same id are not taken for one.
    pub id_prefix: String,
    /// How long a batch's confirms may take before its unconfirmed messages count as
    /// unconfirmed (sent again later) and the connection is replaced: 30 seconds by
    /// default.
    pub confirm_timeout: Duration,
}

impl AmqpOptions {
    /// Publishing to `exchange` with `routing_key`, message ids prefixed with
    /// `id_prefix`, the default timeout.
    pub fn new(exchange: impl Into<String>, routing_key: Template, id_prefix: impl Into<String>) -> Self {
        AmqpOptions {
            exchange: exchange.into(),
            routing_key,
            id_prefix: id_prefix.into(),
            confirm_timeout: Duration::from_secs(30),
        }
    }
}

/// A [`Sink`] that publishes to a RabbitMQ exchange with publisher confirms, persistent
/// delivery (`delivery_mode` 2) and `mandatory` set.
///
/// Each message's `message_id` is `<id prefix>:<id>` ([`AmqpOptions::id_prefix`]), the
/// same each time it is sent again; its headers become AMQP headers (long strings), with
/// [`GROUP_HEADER`] and [`KEY_HEADER`] added; the payload is the body, byte for byte.
///
/// Batches sent at once take turns on its one channel: a broker that closes the channel
/// for one message's size closes it for every publish in flight, and only the batch that
/// published that message can tell it from the rest.
pub struct AmqpSink {
    publisher: tokio::sync::Mutex<Publisher>,
}

/// What an [`AmqpSink`] publishes with, one batch at a time.
struct Publisher {
    url: String,
    options: AmqpOptions,
    link: Option<Link>,
    /// The largest body the broker takes, once it refused a larger one.
    max_body: Option<usize>,
}

/// One connection and its channel in confirm mode.
struct Link {
    // Kept so the connection lives as long as the channel.
    connection: Connection,
    channel: Channel,
}

impl Link {
    fn is_open(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }
}

impl AmqpSink {
    /// How long connecting (TCP, AMQP handshake, channel, confirm mode) may take.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

    /// Connects to the broker at `url` (`amqp://user:password@host:port/vhost`, `%2f` being
    /// the default vhost `/`) and checks that the exchange exists: an unreachable broker is
    /// [`RelayError::Connect`], a missing exchange [`RelayError::Config`].
    pub async fn connect(url: &str, options: AmqpOptions) -> Result<AmqpSink, RelayError> {
        if url.starts_with("amqps://") {
            let reason = format!("{}: TLS (amqps://) is not built in; use amqp://", redact(url));
            return Err(RelayError::Config { system: "amqp", reason });
        }
        if !url.starts_with("amqp://") {
            return Err(RelayError::Config {
                system: "amqp",
                reason: format!("{} is not an amqp:// URL", redact(url)),
            });
        }
        let key_len = options.routing_key.sample().len();
        if key_len > MAX_SHORT_STRING_LENGTH {
            return Err(RelayError::Config {
                system: "amqp",
                reason: format!(
                    "the routing key {:?} is {key_len} bytes long without its group and key; AMQP allows 255",
                    options.routing_key.as_str()
                ),
            });
        }
        if options.exchange.len() > MAX_SHORT_STRING_LENGTH {
            return Err(RelayError::Config {
                system: "amqp",
                reason: format!(
                    "the exchange name is {} bytes long; AMQP allows 255",
                    options.exchange.len()
                ),
            });
        }
        let link = open(url, &options).await.map_err(|e| match e {
            OpenError::Connect(reason) => RelayError::Connect { system: "amqp", url: redact(url), reason },
            OpenError::Exchange(reason) => RelayError::Config { system: "amqp", reason },
        })?;
        let publisher = Publisher { url: url.to_owned(), options, link: Some(link), max_body: None };
        Ok(AmqpSink { publisher: tokio::sync::Mutex::new(publisher) })
    }
}

impl Publisher {
    /// The channel to publish on: the open one, or a new connection's.
    async fn link(&mut self) -> Result<&Channel, SinkError> {
        if !self.link.as_ref().is_some_and(Link::is_open) {
            self.link = None;
            let link = open(&self.url, &self.options).await.map_err(|e| match e {
                OpenError::Connect(reason) => {
                    SinkError::Unavailable(format!("cannot connect to {}: {reason}", redact(&self.url)))
                }
                OpenError::Exchange(reason) => SinkError::Unavailable(reason),
            })?;
            self.link = Some(link);
        }
        Ok(&self.link.as_ref().expect("just opened").channel)
    }

    /// The routing key and properties of one message, or why it can never be published.
    fn prepare(&self, message: &Outgoing) -> Result<(ShortString, BasicProperties), SinkError> {
        if let Some(max) = self.max_body
            && message.payload.len() > max
        {
            return Err(SinkError::Refused(format!(
                "the message is {} bytes; the broker takes at most {max} (max_message_size)",
                message.payload.len()
            )));
        }
        let routing_key = self.options.routing_key.render(&message.group, message.key.as_deref());
        let routing_key = ShortString::try_new(routing_key)
            .map_err(|e| SinkError::Refused(format!("the routing key is too long: {e}")))?;
        let message_id = ShortString::try_new(format!("{}:{}", self.options.id_prefix, message.id))
            .map_err(|e| SinkError::Refused(format!("the message id is too long: {e}")))?;
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            let name = ShortString::try_new(name.as_str())
                .map_err(|e| SinkError::Refused(format!("the header name {name:?} is too long: {e}")))?;
            headers.insert(name, AMQPValue::LongString(LongString::from(value.as_bytes())));
        }
        headers
            .insert(GROUP_HEADER.into(), AMQPValue::LongString(LongString::from(message.group.as_bytes())));
        if let Some(key) = &message.key {
            headers.insert(KEY_HEADER.into(), AMQPValue::LongString(LongString::from(key.as_bytes())));
        }
        let properties = BasicProperties::default()
            .with_message_id(message_id)
            .with_delivery_mode(2)
            .with_headers(headers);
        Ok((routing_key, properties))
    }

    async fn send(&mut self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        let mut results: Vec<Option<Result<(), SinkError>>> = vec![None; batch.len()];
        let prepared: Vec<_> = batch.iter().map(|m| self.prepare(m)).collect();
        let exchange = ShortString::try_new(self.options.exchange.as_str()).expect("checked by connect");
        let channel = match self.link().await {
            Ok(channel) => channel.clone(),
            Err(e) => {
                return prepared.into_iter().map(|p| p.and(Err(e.clone()))).collect();
            }
        };

        // Everything first, then the confirms: one round trip for the batch. The deadline
        // covers the publishing too: a broker under a resource alarm stops reading.
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut broken: Option<String> = None;
        let work = async {
            let mut pending = Vec::with_capacity(batch.len());
            for (i, (message, prepared)) in batch.iter().zip(prepared).enumerate() {
                let (routing_key, properties) = match prepared {
                    Ok(p) => p,
                    Err(e) => {
                        results[i] = Some(Err(e));
                        continue;
                    }
                };
                if broken.is_some() {
                    continue;
                }
                let options = BasicPublishOptions { mandatory: true, immediate: false };
                match channel
                    .basic_publish(exchange.clone(), routing_key, options, &message.payload, properties)
                    .await
                {
                    Ok(confirm) => pending.push((i, confirm)),
                    Err(e) => broken = Some(format!("publishing failed: {e}")),
                }
            }
            for (i, confirm) in pending {
                outcomes.push((i, confirm.await));
            }
        };
        if tokio::time::timeout(self.options.confirm_timeout, work).await.is_err() {
            broken = Some(format!(
                "the broker did not confirm everything within {}s",
                self.options.confirm_timeout.as_secs_f64()
            ));
        }
        for (i, outcome) in outcomes {
            results[i] = Some(self.judge(&batch[i], outcome, &mut broken));
        }
        if let Some(reason) = &broken {
            tracing::warn!(target: "rowbus_relay", "amqp: {reason}; reconnecting for the next batch");
            self.link = None;
        }
        let fallback = broken.unwrap_or_else(|| "not confirmed".to_owned());
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(SinkError::Unavailable(fallback.clone()))))
            .collect()
    }

    /// What the broker's answer to one publish means.
    fn judge(
        &mut self,
        message: &Outgoing,
        outcome: lapin::Result<Confirmation>,
        broken: &mut Option<String>,
    ) -> Result<(), SinkError> {
        match outcome {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(SinkError::Refused(format!(
                "no route: exchange {:?} routing key {:?} ({} {})",
                returned.delivery.exchange.as_str(),
                returned.delivery.routing_key.as_str(),
                returned.reply_code,
                returned.reply_text
            ))),
            Ok(Confirmation::Nack(_)) => {
                Err(SinkError::Unavailable("the broker nacked it (a queue could not take it now)".to_owned()))
            }
            Ok(Confirmation::NotRequested) => {
                *broken = Some("the channel is not in confirm mode".to_owned());
                Err(SinkError::Unavailable("not confirmed".to_owned()))
            }
            Err(e) => {
                let reason = e.to_string();
                if broken.is_none() {
                    *broken = Some(reason.clone());
                }
                match too_large(&e) {
                    Some(max) => {
                        self.max_body = Some(max);
                        if message.payload.len() > max {
                            return Err(SinkError::Refused(format!(
                                "the message is {} bytes; the broker takes at most {max} (max_message_size)",
                                message.payload.len()
                            )));
                        }
                        Err(SinkError::Unavailable(reason))
                    }
                    None => Err(SinkError::Unavailable(reason)),
                }
            }
        }
    }
}

impl Sink for AmqpSink {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        self.publisher.lock().await.send(batch).await
    }

    fn system(&self) -> &'static str {
        "amqp"
    }
}

/// The broker's `max_message_size` when `error` is its refusal of a larger message.
fn too_large(error: &lapin::Error) -> Option<usize> {
    let ErrorKind::ProtocolError(amqp) = error.kind() else { return None };
    if amqp.kind() != &AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) {
        return None;
    }
    // "PRECONDITION_FAILED - message size 200 is larger than configured max size 100"
    let text = amqp.get_message().as_str();
    let (_, max) = text.split_once("larger than configured max size ")?;
    max.trim().trim_end_matches(|c: char| !c.is_ascii_digit()).parse().ok()
}

enum OpenError {
    Connect(String),
    Exchange(String),
}

/// A new connection with one channel in confirm mode, after checking the exchange exists.
async fn open(url: &str, options: &AmqpOptions) -> Result<Link, OpenError> {
    let connect = async {
        let properties = ConnectionProperties::default().with_connection_name("rowbus relay".into());
        let connection =
            Connection::connect(url, properties).await.map_err(|e| OpenError::Connect(e.to_string()))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| OpenError::Connect(format!("cannot open a channel: {e}")))?;
        if !options.exchange.is_empty() {
            // Passive: fails on a missing exchange, creates nothing.
            let passive = ExchangeDeclareOptions { passive: true, ..ExchangeDeclareOptions::default() };
            let declared = channel
                .exchange_declare(
                    options.exchange.as_str().into(),
                    ExchangeKind::Direct,
                    passive,
                    FieldTable::default(),
                )
                .await;
            if let Err(e) = declared {
                return Err(match e.kind() {
                    ErrorKind::ProtocolError(amqp)
                        if amqp.kind() == &AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) =>
                    {
                        OpenError::Exchange(format!(
                            "the exchange {:?} does not exist on {}",
                            options.exchange,
                            redact(url)
                        ))
                    }
                    _ => OpenError::Connect(format!("cannot check the exchange {:?}: {e}", options.exchange)),
                });
            }
            // A failed passive declare closed that channel; a good one left it usable.
        }
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| OpenError::Connect(format!("cannot turn on publisher confirms: {e}")))?;
        Ok(Link { connection, channel })
    };
    match tokio::time::timeout(AmqpSink::CONNECT_TIMEOUT, connect).await {
        Ok(result) => result,
        Err(_) => {
            Err(OpenError::Connect(format!("no answer within {}s", AmqpSink::CONNECT_TIMEOUT.as_secs())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_brokers_size_limit_is_read_from_its_refusal() {
        let error = |kind, text: &str| -> lapin::Error {
            ErrorKind::ProtocolError(lapin::protocol::AMQPError::new(kind, text.into())).into()
        };
        let refusal = error(
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
            "PRECONDITION_FAILED - message size 200 is larger than configured max size 100",
        );
        assert_eq!(too_large(&refusal), Some(100));
        let other =
            error(AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED), "PRECONDITION_FAILED - other");
        assert_eq!(too_large(&other), None);
        let not_found = error(AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND), "NOT_FOUND - no exchange 'x'");
        assert_eq!(too_large(&not_found), None);
    }
}
