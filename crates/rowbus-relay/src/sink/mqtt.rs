//! MQTT 5 (through rumqttc's v5 client): QoS 1 publishes, each confirmed by its `PUBACK`.
//!
//! The client's event loop runs in a task of its own for as long as the connection lasts
//! (it sends the keep-alive pings between batches too). A batch is queued whole and the
//! acknowledgements are then matched to the messages by packet id: the event loop
//! announces each publish it writes, with the packet id it gave it, in the order the
//! publishes were queued, and its task hands each `PUBACK` to the batch that queued the
//! publish. MQTT keeps the order of one connection's publishes to a topic, so messages of
//! one key reach subscribers in the batch's order.
//!
//! Batches sent at once share the connection, each queued whole in its turn: the next
//! batch's publishes go out while the broker still acknowledges the last one's. That is
//! also what keeps a broker that leaves Nagle's algorithm on (Mosquitto as installed)
//! from holding the last acknowledgements of a batch until the client's delayed TCP ACK,
//! 40 ms later on Linux: the client's next publishes carry that ACK at once.
//!
//! MQTT 5 rather than 3.1.1 because 3.1.1 has nowhere to put anything but the payload: the
//! headers, the id, the group and the key travel as user properties. Mosquitto has spoken
//! MQTT 5 since 1.6.
//!
//! What each outcome becomes:
//! - `PUBACK` with reason 0 (success) or 16 (no matching subscribers): delivered. MQTT has
//!   no way to refuse a message nobody subscribed to: the broker drops it.
//! - `PUBACK` with reason 135 (not authorized), 144 (topic name invalid) or 153 (payload
//!   format invalid): [`SinkError::Refused`] with the reason.
//! - `PUBACK` with any other failure (quota exceeded, unspecified or implementation
//!   specific error): [`SinkError::Unavailable`].
//! - A topic that no broker accepts (empty, with `+`, `#` or U+0000, over 65,535 bytes), a
//!   header with U+0000, or a packet over the broker's maximum packet size:
//!   [`SinkError::Refused`] without sending.
//! - The connection lost or refused, or no `PUBACK` for [`MqttOptions::ack_timeout`]: every
//!   unacknowledged message of the batch is [`SinkError::Unavailable`]; the next batch
//!   connects again, with a clean session, so the client resends nothing on its own.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rowbus::redact;
use rumqttc::Outgoing as Written;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions as ClientOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::Template;
use crate::error::RelayError;
use crate::sink::{Outgoing, Sink, SinkError};

/// The user property that carries the message's id: `<id prefix>:<id>`
/// ([`MqttOptions::id_prefix`]).
pub const ID_PROPERTY: &str = "rowbus-id";
/// The user property that carries the message's group (`""` for the default group).
pub const GROUP_PROPERTY: &str = "rowbus-group";
/// The user property that carries the message's ordering key (absent when it has none).
pub const KEY_PROPERTY: &str = "rowbus-key";

/// The largest remaining length an MQTT packet can declare (four bytes of variable length
/// integer).
const MAX_REMAINING_LENGTH: usize = 268_435_455;

/// How an [`MqttSink`] publishes.
#[derive(Debug, Clone)]
pub struct MqttOptions {
    /// The topic of each message (`{group}` and `{key}` may appear in it).
    pub topic: Template,
    /// What the [`ID_PROPERTY`] starts with, before `:` and the message's id: the queue's
    /// name, so that two queues' messages of the same id are not taken for one.
    pub id_prefix: String,
    /// How long the broker may go without acknowledging anything while a batch waits
    /// before its unacknowledged messages count as unconfirmed (sent again later) and the
    /// connection is replaced: 30 seconds by default.
    pub ack_timeout: Duration,
}

impl MqttOptions {
    /// Publishing to `topic`, message ids prefixed with `id_prefix`, the default timeout.
    pub fn new(topic: Template, id_prefix: impl Into<String>) -> Self {
        MqttOptions { topic, id_prefix: id_prefix.into(), ack_timeout: Duration::from_secs(30) }
    }
}

/// A [`Sink`] that publishes to an MQTT 5 broker at QoS 1, not retained.
///
/// The payload is passed byte for byte; the message's headers become user properties, in
/// order, followed by [`ID_PROPERTY`], [`GROUP_PROPERTY`] and (when it has one)
/// [`KEY_PROPERTY`].
pub struct MqttSink {
    url: String,
    options: MqttOptions,
    client_options: ClientOptions,
    /// The connection sends share; replaced by the first send after it broke. Locked while
    /// a new one is made, so that sends waiting for it make one, not one each.
    link: tokio::sync::Mutex<Option<Arc<Link>>>,
}

/// Where the answer to one publish goes: the send that queued it, and the message's place
/// in its batch.
struct Waiting {
    answers: mpsc::UnboundedSender<(usize, Result<(), SinkError>)>,
    index: usize,
}

impl Waiting {
    fn answer(self, result: Result<(), SinkError>) {
        // A send that stopped waiting (its future dropped) needs no answer.
        let _ = self.answers.send((self.index, result));
    }
}

/// The publishes in flight on one connection, shared by the sends and the task polling
/// the client's event loop.
struct InFlight {
    /// Handed to the client and not yet written, in the order the client takes them.
    queued: VecDeque<Waiting>,
    /// Written, each waiting for the `PUBACK` of its packet id.
    written: HashMap<u16, Waiting>,
    /// When a publish was last written or acknowledged.
    progress: Instant,
    /// Why the connection is no longer used, once it is not.
    broken: Option<String>,
}

impl InFlight {
    /// Ends the connection's use: every publish in flight on it is answered unavailable.
    fn fail(&mut self, reason: String) {
        for waiting in self.queued.drain(..).chain(self.written.drain().map(|(_, w)| w)) {
            waiting.answer(Err(SinkError::Unavailable(reason.clone())));
        }
        if self.broken.is_none() {
            tracing::warn!(target: "rowbus_relay", "mqtt: {reason}; reconnecting for the next batch");
            self.broken = Some(reason);
        }
    }
}

/// One connection: the client, the task polling its event loop, and what is in flight.
struct Link {
    client: AsyncClient,
    in_flight: Arc<Mutex<InFlight>>,
    /// Held by a send while it hands its batch to the client, so that `queued` is in the
    /// order the client takes the publishes.
    turn: tokio::sync::Mutex<()>,
    task: tokio::task::AbortHandle,
    /// The broker's maximum packet size, when its CONNACK gave one.
    max_packet: Option<usize>,
}

impl Link {
    fn in_flight(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.in_flight.lock().expect("never poisoned")
    }

    /// Stops using the connection: what is in flight on it is answered unavailable.
    fn fail(&self, reason: String) {
        self.task.abort();
        self.in_flight().fail(reason);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MqttSink {
    /// How long connecting (TCP and CONNACK) may take.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

    /// Connects to the broker at `url`: `mqtt://[user[:password]@]host[:port]` (port 1883
    /// by default), `?client_id=ID` to name the client (a unique name is made otherwise).
    /// An unreachable broker, or one that refuses the connection, is
    /// [`RelayError::Connect`]; a URL that cannot be read, or a topic template whose own
    /// text no broker takes ([`check_topic_template`]), is [`RelayError::Config`].
    pub async fn connect(url: &str, options: MqttOptions) -> Result<MqttSink, RelayError> {
        check_topic_template(&options.topic)?;
        let client_options = client_options(url)?;
        let sink =
            MqttSink { url: url.to_owned(), options, client_options, link: tokio::sync::Mutex::new(None) };
        sink.link().await.map_err(|e| RelayError::Connect {
            system: "mqtt",
            url: redact(url),
            reason: e.to_string(),
        })?;
        Ok(sink)
    }

    /// The live connection, or a new one once the old one broke.
    async fn link(&self) -> Result<Arc<Link>, SinkError> {
        let mut shared = self.link.lock().await;
        if let Some(link) = &*shared
            && link.in_flight().broken.is_none()
        {
            return Ok(link.clone());
        }
        *shared = None;
        let link = Arc::new(self.open().await?);
        *shared = Some(link.clone());
        Ok(link)
    }

    /// A new connection, once the broker's CONNACK came, and the task that polls its
    /// event loop from then on.
    async fn open(&self) -> Result<Link, SinkError> {
        let (client, mut eventloop) = AsyncClient::new(self.client_options.clone(), 1024);
        let connack = tokio::time::timeout(Self::CONNECT_TIMEOUT, eventloop.poll()).await;
        let max_packet = match connack {
            Ok(Ok(Event::Incoming(Packet::ConnAck(ack)))) => {
                ack.properties.and_then(|p| p.max_packet_size).map(|m| m as usize)
            }
            Ok(Ok(other)) => {
                return Err(SinkError::Unavailable(format!("expected a CONNACK, got {other:?}")));
            }
            Ok(Err(e)) => return Err(SinkError::Unavailable(e.to_string())),
            Err(_) => {
                return Err(SinkError::Unavailable(format!(
                    "no CONNACK within {}s",
                    Self::CONNECT_TIMEOUT.as_secs()
                )));
            }
        };
        let in_flight = Arc::new(Mutex::new(InFlight {
            queued: VecDeque::new(),
            written: HashMap::new(),
            progress: Instant::now(),
            broken: None,
        }));
        let task = tokio::spawn(poll(eventloop, in_flight.clone())).abort_handle();
        Ok(Link { client, in_flight, turn: tokio::sync::Mutex::new(()), task, max_packet })
    }
    /// `work`, unless the broker goes [`ack_timeout`](MqttOptions::ack_timeout) without
    /// taking or acknowledging anything on `link` (any batch's publishes) since `started`
    /// or since it last did: then `None`.
    async fn within_ack_timeout<T>(
        &self,
        link: &Link,
        started: Instant,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(work);
        loop {
            let progress = link.in_flight().progress.max(started);
            match tokio::time::timeout_at(progress + self.options.ack_timeout, &mut work).await {
                Ok(done) => return Some(done),
                Err(_) if link.in_flight().progress.max(started) > progress => continue,
                Err(_) => return None,
            }
        }
    }

    /// Why a batch is given up after [`within_ack_timeout`](Self::within_ack_timeout).
    fn silent(&self) -> String {
        format!("the broker acknowledged nothing for {}s", self.options.ack_timeout.as_secs_f64())
    }

    /// The topic and properties of one message, or why no broker would take it.
    fn prepare(
        &self,
        message: &Outgoing,
        max_packet: Option<usize>,
    ) -> Result<(String, PublishProperties), SinkError> {
        let topic = self.options.topic.render(&message.group, message.key.as_deref());
        if topic.is_empty() || topic.contains(['+', '#', '\0']) || topic.len() > 65_535 {
            return Err(SinkError::Refused(format!(
                "the topic {topic:?} is not a valid MQTT topic name (empty, with +, # or U+0000, or over 65535 bytes)"
            )));
        }
        let mut user_properties = Vec::with_capacity(message.headers.len() + 3);
        for (name, value) in &message.headers {
            if name.contains('\0') || value.contains('\0') || name.len() > 65_535 || value.len() > 65_535 {
                return Err(SinkError::Refused(format!(
                    "the header {name:?} cannot be an MQTT user property (U+0000, or over 65535 bytes)"
                )));
            }
            user_properties.push((name.clone(), value.clone()));
        }
        user_properties.push((ID_PROPERTY.to_owned(), format!("{}:{}", self.options.id_prefix, message.id)));
        user_properties.push((GROUP_PROPERTY.to_owned(), message.group.clone()));
        if let Some(key) = &message.key {
            user_properties.push((KEY_PROPERTY.to_owned(), key.clone()));
        }
        let properties_len: usize = user_properties.iter().map(|(k, v)| 1 + 2 + k.len() + 2 + v.len()).sum();
        let remaining =
            2 + topic.len() + 2 + varint_len(properties_len) + properties_len + message.payload.len();
        let packet = 1 + varint_len(remaining) + remaining;
        let limit = max_packet.unwrap_or(usize::MAX);
        if remaining > MAX_REMAINING_LENGTH || packet > limit {
            return Err(SinkError::Refused(format!(
                "the message is too large: a {packet}-byte packet; the broker takes at most {}",
                max_packet.unwrap_or(MAX_REMAINING_LENGTH + 5)
            )));
        }
        Ok((topic, PublishProperties { user_properties, ..PublishProperties::default() }))
    }
}

/// Refuses a topic template that no message can be published to, whatever its group and
/// key: a wildcard (`+`, `#`) or U+0000 in its own text, or its text alone over 65,535
/// bytes.
///
/// ```
/// use rowbus_relay::Template;
/// use rowbus_relay::sink::mqtt::check_topic_template;
/// assert!(check_topic_template(&Template::parse("orders/{group}")?).is_ok());
/// assert!(check_topic_template(&Template::parse("orders/#")?).is_err());
/// # Ok::<(), rowbus_relay::RelayError>(())
/// ```
pub fn check_topic_template(topic: &Template) -> Result<(), RelayError> {
    let sample = topic.sample();
    let why = if sample.contains(['+', '#']) {
        "has a wildcard (+ or #): a relay publishes each message to one topic, never a filter"
    } else if sample.contains('\0') {
        "has U+0000, which no MQTT topic may hold"
    } else if sample.len() > 65_535 {
        "is over 65535 bytes, the most an MQTT topic holds"
    } else {
        return Ok(());
    };
    Err(RelayError::Config { system: "mqtt", reason: format!("topic {:?} {why}", topic.as_str()) })
}

/// The bytes of an MQTT variable byte integer for `n`.
fn varint_len(n: usize) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Polls a connection's event loop for as long as the connection lasts (it sends the
/// keep-alive pings between batches too), matching each publish written to the send that
/// queued it and each `PUBACK` to its publish.
async fn poll(mut eventloop: rumqttc::v5::EventLoop, in_flight: Arc<Mutex<InFlight>>) {
    let lock = || in_flight.lock().expect("never poisoned");
    loop {
        // A failed event loop would reconnect on the next poll and resend what was in
        // flight; the sink connects afresh instead, and resends itself.
        let event = match eventloop.poll().await {
            Ok(event) => event,
            Err(e) => return lock().fail(format!("the connection failed: {e}")),
        };
        match event {
            Event::Outgoing(Written::Publish(pkid)) => {
                let mut in_flight = lock();
                in_flight.progress = Instant::now();
                match in_flight.queued.pop_front() {
                    Some(waiting) => {
                        in_flight.written.insert(pkid, waiting);
                    }
                    None => {
                        return in_flight
                            .fail(format!("the client wrote a publish ({pkid}) no batch queued"));
                    }
                }
            }
            Event::Incoming(Packet::PubAck(ack)) => {
                let mut in_flight = lock();
                in_flight.progress = Instant::now();
                let Some(waiting) = in_flight.written.remove(&ack.pkid) else {
                    return in_flight.fail(format!("a PUBACK for packet {} that is not in flight", ack.pkid));
                };
                let reason = ack.properties.and_then(|p| p.reason_string);
                waiting.answer(judge(ack.reason, reason));
            }
            Event::Incoming(Packet::Disconnect(disconnect)) => {
                return lock().fail(format!("the broker disconnected: {:?}", disconnect.reason_code));
            }
            _ => {}
        }
    }
}

impl Sink for MqttSink {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        let mut results: Vec<Option<Result<(), SinkError>>> = vec![None; batch.len()];
        let link = match self.link().await {
            Ok(link) => link,
            Err(e) => {
                let reason = format!("cannot connect to {}: {e}", redact(&self.url));
                return vec![Err(SinkError::Unavailable(reason)); batch.len()];
            }
        };
        let started = Instant::now();

        // Hand the whole batch to the client; its event loop writes each in turn, as the
        // broker's receive maximum allows, and the answers come back through `answers`.
        let (answers, mut answered) = mpsc::unbounded_channel();
        let mut waiting = 0;
        {
            let _turn = link.turn.lock().await;
            for (i, message) in batch.iter().enumerate() {
                let (topic, properties) = match self.prepare(message, link.max_packet) {
                    Ok(p) => p,
                    Err(e) => {
                        results[i] = Some(Err(e));
                        continue;
                    }
                };
                {
                    // Queued before the client has it: its event loop may write it at once.
                    let mut in_flight = link.in_flight();
                    if let Some(reason) = &in_flight.broken {
                        results[i] = Some(Err(SinkError::Unavailable(reason.clone())));
                        continue;
                    }
                    in_flight.queued.push_back(Waiting { answers: answers.clone(), index: i });
                    waiting += 1;
                }
                // Waits while the client's queue is full, which the broker's acknowledgements
                // empty.
                let payload = message.payload.clone();
                let publish =
                    link.client.publish_with_properties(topic, QoS::AtLeastOnce, false, payload, properties);
                match self.within_ack_timeout(&link, started, publish).await {
                    Some(Ok(())) => {}
                    // The event loop is gone: nothing queued on this connection will be written.
                    Some(Err(e)) => link.fail(format!("cannot queue the publish: {e}")),
                    None => link.fail(self.silent()),
                }
            }
        }
        drop(answers);

        while waiting > 0 {
            match self.within_ack_timeout(&link, started, answered.recv()).await {
                Some(Some((i, result))) => {
                    results[i] = Some(result);
                    waiting -= 1;
                }
                // Every publish left was dropped unanswered.
                Some(None) => break,
                None => link.fail(self.silent()),
            }
        }
        let fallback = link.in_flight().broken.clone().unwrap_or_else(|| "not acknowledged".to_owned());
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(SinkError::Unavailable(fallback.clone()))))
            .collect()
    }

    fn system(&self) -> &'static str {
        "mqtt"
    }
}
/// What a `PUBACK`'s reason code means for the message.
fn judge(reason: PubAckReason, text: Option<String>) -> Result<(), SinkError> {
    let said = |code: u8, name: &str| match &text {
        Some(text) => format!("the broker answered {code} ({name}): {text}"),
        None => format!("the broker answered {code} ({name})"),
    };
    match reason {
        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
        PubAckReason::NotAuthorized => Err(SinkError::Refused(said(135, "not authorized"))),
        PubAckReason::TopicNameInvalid => Err(SinkError::Refused(said(144, "topic name invalid"))),
        PubAckReason::PayloadFormatInvalid => Err(SinkError::Refused(said(153, "payload format invalid"))),
        PubAckReason::QuotaExceeded => Err(SinkError::Unavailable(said(151, "quota exceeded"))),
        PubAckReason::PacketIdentifierInUse => {
            Err(SinkError::Unavailable(said(145, "packet identifier in use")))
        }
        PubAckReason::ImplementationSpecificError => {
            Err(SinkError::Unavailable(said(131, "implementation specific error")))
        }
        PubAckReason::UnspecifiedError => Err(SinkError::Unavailable(said(128, "unspecified error"))),
    }
}

/// The client's options from an `mqtt://` URL: MQTT 5, a clean start, keep-alive pings
/// every 30 s.
fn client_options(url: &str) -> Result<ClientOptions, RelayError> {
    let refuse = |reason: String| RelayError::Config { system: "mqtt", reason };
    if url.starts_with("mqtts://") {
        return Err(refuse(format!("{}: TLS (mqtts://) is not built in; use mqtt://", redact(url))));
    }
    let Some(rest) = url.strip_prefix("mqtt://") else {
        return Err(refuse(format!("{} is not an mqtt:// URL", redact(url))));
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') {
        return Err(refuse(format!("{}: an mqtt:// URL has no path", redact(url))));
    }
    let (user_info, host_port) = match rest.rsplit_once('@') {
        Some((user_info, host_port)) => (Some(user_info), host_port),
        None => (None, rest),
    };
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => {
            let port = port
                .parse::<u16>()
                .map_err(|_| refuse(format!("{}: the port {port:?} is not a number", redact(url))))?;
            (host, port)
        }
        _ => (host_port, 1883),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(refuse(format!("{}: no host", redact(url))));
    }
    let mut client_id = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("client_id", id)) if !id.is_empty() => client_id = Some(id.to_owned()),
            _ => return Err(refuse(format!("{}: unknown parameter {pair:?} (only client_id)", redact(url)))),
        }
    }
    let client_id = client_id.unwrap_or_else(unique_client_id);
    let mut options = ClientOptions::new(client_id, host, port);
    options.set_keep_alive(Duration::from_secs(30));
    options.set_clean_start(true);
    options.set_connection_timeout(MqttSink::CONNECT_TIMEOUT.as_secs());
    if let Some(user_info) = user_info {
        let (user, password) = user_info.split_once(':').unwrap_or((user_info, ""));
        options.set_credentials(user, password);
    }
    Ok(options)
}

/// A client id no other relay uses: two clients with one id take turns being
/// disconnected by the broker.
fn unique_client_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("rowbus-relay-{}-{}-{nanos:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template's own text is checked; what its placeholders stand for is not known yet.
    #[test]
    fn topics_no_broker_takes_are_refused() {
        for good in ["orders/{group}", "{group}/{key}", "orders"] {
            assert!(check_topic_template(&Template::parse(good).unwrap()).is_ok(), "{good:?}");
        }
        for bad in ["orders/#", "orders/+/{group}", "{key}#", "a\0b"] {
            match check_topic_template(&Template::parse(bad).unwrap()) {
                Err(RelayError::Config { system: "mqtt", reason }) => {
                    assert!(reason.contains(&format!("{bad:?}")), "{reason}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn urls_are_read() {
        let o = client_options("mqtt://127.0.0.1:1884").unwrap();
        assert_eq!(o.broker_address(), ("127.0.0.1".to_owned(), 1884));
        assert!(o.client_id().starts_with("rowbus-relay-"));
        let o = client_options("mqtt://localhost").unwrap();
        assert_eq!(o.broker_address(), ("localhost".to_owned(), 1883));
        let o = client_options("mqtt://user:pw@host:1/?client_id=me").unwrap();
        assert_eq!(o.broker_address(), ("host".to_owned(), 1));
        assert_eq!(o.client_id(), "me");
        let login = o.credentials().expect("credentials");
        assert_eq!((login.username.as_str(), login.password.as_str()), ("user", "pw"));
        let o = client_options("mqtt://[::1]:1883").unwrap();
        assert_eq!(o.broker_address(), ("::1".to_owned(), 1883));
    }

    #[test]
    fn bad_urls_are_refused() {
        for url in [
            "amqp://host",
            "mqtts://host",
            "mqtt://",
            "mqtt://host:x",
            "mqtt://host/path",
            "mqtt://host?qos=2",
        ] {
            assert!(matches!(client_options(url), Err(RelayError::Config { system: "mqtt", .. })), "{url}");
        }
    }

    #[test]
    fn two_sinks_have_two_client_ids() {
        assert_ne!(unique_client_id(), unique_client_id());
    }

    #[test]
    fn puback_reasons_are_judged() {
        assert!(judge(PubAckReason::Success, None).is_ok());
        assert!(judge(PubAckReason::NoMatchingSubscribers, None).is_ok());
        assert!(
            matches!(judge(PubAckReason::NotAuthorized, None), Err(SinkError::Refused(r)) if r.contains("135"))
        );
        assert!(matches!(judge(PubAckReason::QuotaExceeded, None), Err(SinkError::Unavailable(_))));
    }

    #[test]
    fn variable_byte_integers_have_their_mqtt_lengths() {
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(127), 1);
        assert_eq!(varint_len(128), 2);
        assert_eq!(varint_len(16_384), 3);
        assert_eq!(varint_len(MAX_REMAINING_LENGTH), 4);
    }
}
