//! The MQTT sink against the local Mosquitto (127.0.0.1:1883): what a subscriber receives
//! (each message once, its id, group, key and headers as user properties, the payload byte
//! for byte, in order), what is refused, and a broker that goes away and comes back; then
//! the shared scenarios of relays of a queue on each database to it (ten thousand messages
//! each once, each key's order with four relays at once, a relay killed mid-stream).
//!
//! Each test publishes under a topic prefix of its own; nothing is retained and every
//! session is clean, so nothing outlives a test.

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::sinks::{all_ok, batch, message};
use common::target::{Arrival, Target, scenarios};
use common::{MOSQUITTO, place_test as database_test, unique};
use rowbus_relay::sink::mqtt::{MqttOptions as SinkOptions, MqttSink};
use rowbus_relay::sink::{Outgoing, Sink, SinkError};
use rowbus_relay::{RelayError, Template};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;

const URL: &str = "mqtt://127.0.0.1:1883";

/// A subscriber of the test's own on `filter`, QoS 0: Mosquitto holds at most 1,000 QoS 1
/// messages for a subscriber that falls behind and drops the rest, which a relay of
/// 10,000 outruns; QoS 0 messages go out to a connected subscriber at once, on a TCP
/// connection that loses nothing. (The relay's own publishes are QoS 1 whatever this is.)
struct Subscriber {
    client: AsyncClient,
    received: mpsc::UnboundedReceiver<Publish>,
    task: tokio::task::JoinHandle<()>,
}

impl Subscriber {
    /// Subscribed once this returns (the broker acknowledged the subscription).
    async fn new(filter: &str) -> Subscriber {
        let mut options = MqttOptions::new(unique("rowbus-relay-test"), "127.0.0.1", 1883);
        options.set_keep_alive(Duration::from_secs(30));
        let (client, mut eventloop) = AsyncClient::new(options, 64);
        client.subscribe(filter, QoS::AtMostOnce).await.unwrap();
        let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
        let (tx, received) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut subscribed_tx = Some(subscribed_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(tx) = subscribed_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        let _ = tx.send(publish);
                    }
                    Ok(_) => {}
                    Err(e) => panic!("Mosquitto must be running on {MOSQUITTO}: {e}"),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(20), subscribed)
            .await
            .expect("a SUBACK within 20 s")
            .expect("the subscriber runs");
        Subscriber { client, received, task }
    }

    /// The next message, within 20 s.
    async fn next(&mut self) -> Publish {
        tokio::time::timeout(Duration::from_secs(20), self.received.recv())
            .await
            .expect("a message within 20 s")
            .expect("the subscriber runs")
    }

    /// Everything before the marker message (id `marker`), which the test sent last on the
    /// same connection: MQTT keeps one connection's order, so once the marker is in,
    /// everything sent before it is too, and any second copy would have come before it.
    async fn until(&mut self, marker: &str) -> Vec<Publish> {
        let mut out = Vec::new();
        loop {
            let publish = self.next().await;
            if property(&publish, "rowbus-id").as_deref() == Some(marker) {
                return out;
            }
            out.push(publish);
        }
    }

    async fn close(self) {
        self.client.disconnect().await.unwrap();
        self.task.abort();
    }
}

fn property(publish: &Publish, name: &str) -> Option<String> {
    let properties = publish.properties.as_ref()?;
    let found: Vec<_> = properties.user_properties.iter().filter(|(n, _)| n == name).collect();
    assert!(found.len() <= 1, "{name} once: {found:?}");
    found.first().map(|(_, v)| v.clone())
}

fn options(topic: &str) -> SinkOptions {
    SinkOptions::new(Template::parse(topic).unwrap(), "orders")
}

/// A last message whose arrival says everything before it arrived.
fn marker(id: i64) -> Outgoing {
    message(id, "", None, &[], b"marker")
}

#[tokio::test]
async fn a_batch_arrives_once_with_its_ids_properties_and_payloads_in_order() {
    let prefix = unique("rowbus_relay");
    let mut subscriber = Subscriber::new(&format!("{prefix}/#")).await;
    let sink = MqttSink::connect(URL, options(&format!("{prefix}/{{group}}/{{key}}"))).await.unwrap();
    assert_eq!(sink.system(), "mqtt");

    let mut sent = batch(1, 300, 7);
    sent.push(message(301, "", None, &[], b""));
    sent.push(message(302, "eu", Some("user 7"), &[("a", "1"), ("trace", "x\u{e9}y")], &[0, 0xff, b'\n', 0]));
    all_ok(&sink.send(&sent).await);
    all_ok(&sink.send(&[marker(999)]).await);

    let got = subscriber.until("orders:999").await;
    assert_eq!(got.len(), sent.len(), "each message once");
    for (publish, message) in got.iter().zip(&sent) {
        assert_eq!(property(publish, "rowbus-id"), Some(format!("orders:{}", message.id)));
        assert_eq!(publish.payload.as_ref(), message.payload.as_slice(), "message {}", message.id);
        assert_eq!(property(publish, "rowbus-group").as_deref(), Some(message.group.as_str()));
        assert_eq!(property(publish, "rowbus-key"), message.key);
        let names: Vec<_> =
            publish.properties.as_ref().unwrap().user_properties.iter().map(|(n, _)| n.as_str()).collect();
        let mut expected: Vec<_> = message.headers.iter().map(|(n, _)| n.as_str()).collect();
        expected.extend(["rowbus-id", "rowbus-group"]);
        expected.extend(message.key.as_ref().map(|_| "rowbus-key"));
        assert_eq!(names, expected, "the headers, then the id, group and key");
        for (name, value) in &message.headers {
            assert_eq!(property(publish, name).as_ref(), Some(value), "header {name} of {}", message.id);
        }
        let topic = format!(
            "{prefix}/{}/{}",
            if message.group.is_empty() { "_" } else { &message.group },
            message.key.as_deref().unwrap_or("_")
        );
        assert_eq!(publish.topic.as_ref(), topic.as_bytes());
        assert!(!publish.retain);
    }
    subscriber.close().await;
}

/// Batches sent at once share the connection: each is answered for its own messages (one
/// refused without being sent among them), and every message arrives once, each batch's
/// messages of one key in the batch's order. (600 in all: the broker drops what a
/// subscriber falls more than 1,000 messages behind on.)
#[tokio::test]
async fn batches_sent_at_once_are_each_answered_and_arrive_once() {
    let prefix = unique("rowbus_relay");
    let mut subscriber = Subscriber::new(&format!("{prefix}/#")).await;
    let sink = MqttSink::connect(URL, options(&format!("{prefix}/{{key}}"))).await.unwrap();
    let first = batch(1, 200, 5);
    let mut second = batch(201, 200, 5);
    second.insert(100, message(5000, "g", Some("a+b"), &[], b"no topic"));
    let third = batch(401, 200, 5);
    let (a, b, c) = tokio::join!(sink.send(&first), sink.send(&second), sink.send(&third));
    all_ok(&a);
    all_ok(&c);
    assert_eq!(b.len(), second.len());
    for (i, r) in b.iter().enumerate() {
        if i == 100 {
            assert!(matches!(r, Err(SinkError::Refused(_))), "{r:?}");
        } else {
            assert!(r.is_ok(), "message {i} of the second batch: {r:?}");
        }
    }
    all_ok(&sink.send(&[marker(9999)]).await);

    let got = subscriber.until("orders:9999").await;
    let ids: Vec<i64> = got
        .iter()
        .map(|p| property(p, "rowbus-id").unwrap().strip_prefix("orders:").unwrap().parse().unwrap())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=600).collect::<Vec<i64>>(), "each message once");
    // Each batch's messages of one key in the batch's order.
    for (id, publish) in ids.iter().zip(&got) {
        let later = ids.iter().zip(&got).skip_while(|(other, _)| *other != id).skip(1);
        for (other, other_publish) in later {
            let same_batch = (id - 1) / 200 == (other - 1) / 200;
            if same_batch && publish.topic == other_publish.topic {
                assert!(other > id, "{other} arrived after {id}");
            }
        }
    }
    subscriber.close().await;
}

#[tokio::test]
async fn a_topic_no_broker_accepts_is_refused_and_the_others_arrive() {
    let prefix = unique("rowbus_relay");
    let mut subscriber = Subscriber::new(&format!("{prefix}/#")).await;
    let sink = MqttSink::connect(URL, options(&format!("{prefix}/{{key}}"))).await.unwrap();
    let sent = vec![
        message(1, "", Some("a"), &[], b"one"),
        message(2, "", Some("a+b"), &[], b"wildcard"),
        message(3, "", Some("#"), &[], b"wildcard"),
        message(4, "", Some("a"), &[("bad", "nul\0")], b"nul"),
        message(5, "", Some("a"), &[], b"five"),
    ];
    let results = sink.send(&sent).await;
    assert!(results[0].is_ok(), "{:?}", results[0]);
    for r in &results[1..4] {
        assert!(matches!(r, Err(SinkError::Refused(_))), "{r:?}");
    }
    assert!(results[4].is_ok(), "{:?}", results[4]);
    all_ok(&sink.send(&[marker(999)]).await);
    let got: Vec<_> = subscriber.until("orders:999").await.into_iter().map(|p| p.payload.to_vec()).collect();
    assert_eq!(got, vec![b"one".to_vec(), b"five".to_vec()]);
    subscriber.close().await;
}

#[tokio::test]
async fn a_broker_that_is_not_there_is_refused_at_connect() {
    let proxy = Proxy::start(MOSQUITTO).await;
    proxy.stop().await;
    let url = format!("mqtt://user:secret@127.0.0.1:{}", proxy.port);
    match MqttSink::connect(&url, options("t")).await {
        Err(RelayError::Connect { system: "mqtt", url, .. }) => {
            assert!(!url.contains("secret"), "the password is not shown: {url}");
        }
        Err(other) => panic!("expected a connect error, got {other}"),
        Ok(_) => panic!("expected a connect error, got a sink"),
    }
    assert!(matches!(
        MqttSink::connect("http://127.0.0.1:1883", options("t")).await,
        Err(RelayError::Config { system: "mqtt", .. })
    ));
}

/// While the broker is gone every message is unavailable, and sends succeed once it is
/// back.
#[tokio::test]
async fn while_the_broker_is_gone_every_message_is_unavailable() {
    common::target::while_the_broker_is_gone_every_message_is_unavailable::<Mqtt>().await;
}

#[tokio::test]
async fn a_broker_that_stops_answering_is_given_up_after_the_ack_timeout_and_sent_to_again() {
    stops_answering(1).await;
}

/// When the broker stops answering while batches are at the sink together, each of them
/// is given up after the acknowledgement timeout, and the next sends go through a new
/// connection.
#[tokio::test]
async fn batches_at_once_on_a_broker_that_stops_answering_are_each_given_up() {
    stops_answering(2).await;
}

/// A batch larger than the client's queue (1,024 publishes) on a broker that stops
/// answering is given up too: the queue stays full, and the wait for room is bounded by
/// the acknowledgement timeout as the wait for acknowledgements is. (No subscriber: the
/// broker drops what a subscriber falls more than 1,000 messages behind on.)
#[tokio::test]
async fn a_batch_larger_than_the_clients_queue_is_given_up_when_the_broker_stops_answering() {
    let prefix = unique("rowbus_relay");
    let (proxy, sink) = through_proxy(&prefix).await;

    proxy.freeze();
    let answers = tokio::time::timeout(Duration::from_secs(20), sink.send(&batch(11, 3000, 2)))
        .await
        .expect("given up within the acknowledgement timeout, not the keep-alive's");
    for r in answers {
        assert!(
            matches!(&r, Err(SinkError::Unavailable(reason)) if reason.contains("acknowledged")),
            "{r:?}"
        );
    }
    proxy.thaw();
    all_ok(&sink.send(&batch(11, 10, 2)).await);
}

/// A sink to the broker through a proxy of the test's own, publishing under `prefix`
/// with a 500 ms acknowledgement timeout, once a first batch of ten (ids 1 to 10) went
/// through.
async fn through_proxy(prefix: &str) -> (Proxy, MqttSink) {
    let proxy = Proxy::start(MOSQUITTO).await;
    let url = format!("mqtt://127.0.0.1:{}", proxy.port);
    let mut options = options(&format!("{prefix}/{{key}}"));
    options.ack_timeout = Duration::from_millis(500);
    let sink = MqttSink::connect(&url, options).await.unwrap();
    all_ok(&sink.send(&batch(1, 10, 2)).await);
    (proxy, sink)
}

/// Sends a batch of ten, then `at_once` batches of ten together while the proxy passes
/// nothing, which must each come back unacknowledged, then those again once it passes
/// bytes again.
async fn stops_answering(at_once: i64) {
    let prefix = unique("rowbus_relay");
    let mut subscriber = Subscriber::new(&format!("{prefix}/#")).await;
    let (proxy, sink) = through_proxy(&prefix).await;

    proxy.freeze();
    let batches: Vec<_> = (0..at_once).map(|i| batch(11 + 10 * i, 10, 2)).collect();
    let answers = futures::future::join_all(batches.iter().map(|b| sink.send(b))).await;
    for r in answers.into_iter().flatten() {
        assert!(
            matches!(&r, Err(SinkError::Unavailable(reason)) if reason.contains("acknowledged")),
            "{r:?}"
        );
    }
    proxy.thaw();
    let last = 10 + 10 * at_once;
    all_ok(&sink.send(&batch(11, 10 * at_once as usize, 2)).await);
    all_ok(&sink.send(&[marker(999)]).await);

    // The first copies of 11..=last may reach the broker too once the proxy passes bytes
    // again (before or after the marker): sent again, with the same ids.
    let ids: Vec<_> =
        subscriber.until("orders:999").await.iter().map(|p| property(p, "rowbus-id").unwrap()).collect();
    for id in 1..=last {
        let copies = ids.iter().filter(|i| **i == format!("orders:{id}")).count();
        assert!(copies == 1 || (id > 10 && copies == 2), "id {id}: {copies} copies");
    }
    assert_eq!(
        ids.iter().filter(|i| !(1..=last).any(|id| **i == format!("orders:{id}"))).count(),
        0,
        "{ids:?}"
    );
    subscriber.close().await;
}

/// A topic prefix of the test's own and a subscriber of everything under it.
struct Mqtt {
    prefix: String,
    subscriber: Subscriber,
}

impl Target for Mqtt {
    const NAME: &'static str = "mqtt";
    const ADDR: &'static str = MOSQUITTO;
    const DEDUPLICATES: bool = false;
    type Sink = MqttSink;

    async fn new() -> Mqtt {
        let prefix = unique("rowbus_relay");
        let subscriber = Subscriber::new(&format!("{prefix}/#")).await;
        Mqtt { prefix, subscriber }
    }

    fn place(&self, group: &str, key: &str) -> String {
        format!("{}/{group}/{key}", self.prefix)
    }

    async fn sink(&self, addr: &str, prefix: &str) -> MqttSink {
        MqttSink::connect(&format!("mqtt://{addr}"), SinkOptions::new(self.template(), prefix)).await.unwrap()
    }

    async fn next(&mut self, within: Duration) -> Option<Arrival> {
        let publish = tokio::time::timeout(within, self.subscriber.received.recv()).await.ok()?;
        let publish = publish.expect("the subscriber runs");
        Some(Arrival {
            id: property(&publish, "rowbus-id").expect("an id"),
            n: property(&publish, "n").expect("the property n").parse().unwrap(),
            group: property(&publish, "rowbus-group"),
            key: property(&publish, "rowbus-key"),
            payload: publish.payload.to_vec(),
            place: String::from_utf8(publish.topic.to_vec()).unwrap(),
        })
    }

    async fn close(self) {
        self.subscriber.close().await;
    }
}

scenarios!(Mqtt:
    ten_thousand_arrive_once_each,
    four_relays_keep_each_keys_order,
    a_leased_relay_killed_mid_stream_loses_nothing,
    a_transactional_relay_killed_mid_stream_loses_nothing,
);
