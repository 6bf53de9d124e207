//! The RabbitMQ sink against the local broker (127.0.0.1:5672, guest/guest): what arrives
//! (each message once, its id, headers and payload byte for byte, in order), what is
//! refused (no route, too large), and a broker that goes away and comes back; then the
//! shared scenarios of relays of a queue on each database to it (ten thousand messages each
//! once, each key's order with four relays at once, a relay killed mid-stream).
//!
//! Each test declares its own exchange (auto-delete) and queues (exclusive to the test's
//! connection) under unique names, so that nothing outlives it even when it fails, and
//! deletes them when it passes.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::proxy::Proxy;
use common::sinks::{all_ok, batch, message};
use common::target::{Arrival, Target, scenarios};
use common::{RABBITMQ, place_test as database_test, unique};
use futures::StreamExt as _;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use rowbus_relay::sink::amqp::{AmqpOptions, AmqpSink};
use rowbus_relay::sink::{Outgoing, Sink, SinkError};
use rowbus_relay::{RelayError, Template};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The test's side of the broker: its own connection, exchange and queues.
struct Rabbit {
    connection: Connection,
    channel: Channel,
    exchange: String,
    queues: Vec<String>,
}

impl Rabbit {
    /// Connects, and declares a topic exchange of the test's own (auto-deleted once its
    /// last queue is gone).
    async fn new() -> Rabbit {
        let connection = Connection::connect(URL, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ must be running on {RABBITMQ} (guest/guest): {e}"));
        let channel = connection.create_channel().await.unwrap();
        let exchange = unique("rowbus_relay_x");
        let options = ExchangeDeclareOptions { auto_delete: true, ..ExchangeDeclareOptions::default() };
        channel
            .exchange_declare(exchange.as_str().into(), ExchangeKind::Topic, options, FieldTable::default())
            .await
            .unwrap();
        Rabbit { connection, channel, exchange, queues: Vec::new() }
    }

    /// A queue exclusive to this connection, bound to the exchange with `binding` (or to
    /// nothing but the default exchange).
    async fn queue(&mut self, binding: Option<&str>) -> String {
        let queue = unique("rowbus_relay_q");
        let options = QueueDeclareOptions { exclusive: true, ..QueueDeclareOptions::default() };
        self.channel.queue_declare(queue.as_str().into(), options, FieldTable::default()).await.unwrap();
        if let Some(binding) = binding {
            self.channel
                .queue_bind(
                    queue.as_str().into(),
                    self.exchange.as_str().into(),
                    binding.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        self.queues.push(queue.clone());
        queue
    }

    /// Everything in `queue`, in order. Called after the sink's confirms: a confirmed
    /// message is in its queue, so this reads each one that was sent.
    async fn drain(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        let mut out = Vec::new();
        while let Some(got) =
            self.channel.basic_get(queue.into(), BasicGetOptions { no_ack: true }).await.unwrap()
        {
            out.push(got.delivery);
        }
        out
    }

    async fn delete(self) {
        for queue in &self.queues {
            self.channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
        }
        self.channel
            .exchange_delete(self.exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
        self.connection.close(200, "OK".into()).await.unwrap();
    }
}

fn options(exchange: &str, routing_key: &str) -> AmqpOptions {
    AmqpOptions::new(exchange, Template::parse(routing_key).unwrap(), "orders")
}

async fn sink(exchange: &str, routing_key: &str) -> AmqpSink {
    AmqpSink::connect(URL, options(exchange, routing_key)).await.expect("connect the sink")
}

fn header(delivery: &lapin::message::Delivery, name: &str) -> Option<String> {
    let headers = delivery.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8(s.as_bytes().to_vec()).unwrap()),
        other => panic!("header {name} is {other:?}"),
    }
}

fn message_id(delivery: &lapin::message::Delivery) -> String {
    delivery.properties.message_id().as_ref().expect("a message id").to_string()
}

#[tokio::test]
async fn a_batch_arrives_once_with_its_ids_headers_and_payloads_in_order() {
    let mut rabbit = Rabbit::new().await;
    let queue = rabbit.queue(Some("orders.#")).await;
    let sink = sink(&rabbit.exchange, "orders.{group}.{key}").await;
    assert_eq!(sink.system(), "amqp");

    let mut sent = batch(1, 300, 7);
    sent.push(message(301, "", None, &[], b""));
    sent.push(message(302, "eu", Some("user 7"), &[("a", "1"), ("trace", "x\u{e9}y")], &[0, 0xff, b'\n', 0]));
    let results = sink.send(&sent).await;
    all_ok(&results);

    let got = rabbit.drain(&queue).await;
    assert_eq!(got.len(), sent.len(), "each confirmed message once");
    // One channel, one queue: the batch's order, so each key's order too.
    for (delivery, message) in got.iter().zip(&sent) {
        assert_eq!(message_id(delivery), format!("orders:{}", message.id));
        assert_eq!(delivery.data, message.payload, "message {}", message.id);
        assert_eq!(delivery.properties.delivery_mode(), &Some(2), "persistent");
        assert_eq!(header(delivery, "rowbus-group").as_deref(), Some(message.group.as_str()));
        assert_eq!(header(delivery, "rowbus-key"), message.key);
        for (name, value) in &message.headers {
            assert_eq!(header(delivery, name).as_ref(), Some(value), "header {name} of {}", message.id);
        }
        let expected = format!(
            "orders.{}.{}",
            if message.group.is_empty() { "_" } else { &message.group },
            message.key.as_deref().unwrap_or("_")
        );
        assert_eq!(delivery.routing_key.as_str(), expected);
    }
    let headers = got[sent.len() - 2].properties.headers().as_ref().unwrap().inner().len();
    assert_eq!(headers, 1, "no key, no headers: rowbus-group alone");
    rabbit.delete().await;
}

#[tokio::test]
async fn the_default_exchange_delivers_to_the_queue_the_routing_key_names() {
    let mut rabbit = Rabbit::new().await;
    let queue = rabbit.queue(None).await;
    let sink = sink("", &queue).await;
    let sent = batch(10, 20, 3);
    all_ok(&sink.send(&sent).await);
    let ids: Vec<_> = rabbit.drain(&queue).await.iter().map(message_id).collect();
    let expected: Vec<_> = sent.iter().map(|m| format!("orders:{}", m.id)).collect();
    assert_eq!(ids, expected);
    rabbit.delete().await;
}

#[tokio::test]
async fn a_message_no_queue_is_bound_for_is_refused_as_no_route_and_the_others_arrive() {
    let mut rabbit = Rabbit::new().await;
    let queue = rabbit.queue(None).await;
    // The default exchange, the key naming the queue: a key that names no queue has no route.
    let sink = sink("", "{key}").await;
    let nowhere = unique("rowbus_relay_nowhere");
    let sent = vec![
        message(1, "", Some(&queue), &[], b"one"),
        message(2, "", Some(&nowhere), &[], b"two"),
        message(3, "", Some(&queue), &[], b"three"),
    ];
    let results = sink.send(&sent).await;
    assert!(results[0].is_ok(), "{:?}", results[0]);
    match &results[1] {
        Err(SinkError::Refused(reason)) => {
            assert!(reason.contains("no route") && reason.contains("NO_ROUTE"), "{reason}");
            assert!(reason.contains(&nowhere), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(results[2].is_ok(), "{:?}", results[2]);
    let got: Vec<_> = rabbit.drain(&queue).await.into_iter().map(|d| d.data).collect();
    assert_eq!(got, vec![b"one".to_vec(), b"three".to_vec()]);

    // The channel is still good for the next batch.
    all_ok(&sink.send(&[message(4, "", Some(&queue), &[], b"four")]).await);
    assert_eq!(rabbit.drain(&queue).await.len(), 1);
    rabbit.delete().await;
}

#[tokio::test]
async fn a_message_over_the_brokers_size_limit_is_refused_and_the_rest_are_sent_again() {
    let mut rabbit = Rabbit::new().await;
    let queue = rabbit.queue(None).await;
    let sink = sink("", &queue).await;
    // RabbitMQ's max_message_size (128 MiB unless configured lower; read from the broker's
    // refusal, not assumed).
    let huge = vec![7u8; 128 * 1024 * 1024 + 1];
    let sent = vec![
        message(1, "", None, &[], b"before"),
        message(2, "", None, &[], &huge),
        message(3, "", None, &[], b"after"),
    ];
    let results = sink.send(&sent).await;
    match &results[1] {
        Err(SinkError::Refused(reason)) => assert!(reason.contains("max_message_size"), "{reason}"),
        other => panic!("expected a refusal of the large message, got {other:?}"),
    }
    // The broker closed the channel for it: what it had not confirmed is sent again.
    let mut resend: Vec<Outgoing> = Vec::new();
    for (message, result) in sent.iter().zip(&results) {
        match result {
            Ok(()) => {}
            Err(SinkError::Unavailable(_)) => resend.push(message.clone()),
            Err(SinkError::Refused(_)) => assert_eq!(message.id, 2),
        }
    }
    if !resend.is_empty() {
        all_ok(&sink.send(&resend).await);
    }
    // Later messages over the limit are refused without being sent.
    let again = sink.send(&[message(4, "", None, &[], &huge), message(5, "", None, &[], b"last")]).await;
    assert!(matches!(&again[0], Err(SinkError::Refused(_))), "{:?}", again[0]);
    assert!(again[1].is_ok(), "{:?}", again[1]);
    let got: BTreeMap<String, Vec<u8>> =
        rabbit.drain(&queue).await.into_iter().map(|d| (message_id(&d), d.data)).collect();
    let expected: BTreeMap<String, Vec<u8>> = [(1, "before"), (3, "after"), (5, "last")]
        .into_iter()
        .map(|(id, body)| (format!("orders:{id}"), body.as_bytes().to_vec()))
        .collect();
    assert_eq!(got, expected);
    rabbit.delete().await;
}

#[tokio::test]
async fn a_missing_exchange_and_a_broker_that_is_not_there_are_refused_at_connect() {
    let missing = unique("rowbus_relay_missing");
    match AmqpSink::connect(URL, options(&missing, "k")).await {
        Err(RelayError::Config { system: "amqp", reason }) => assert!(reason.contains(&missing), "{reason}"),
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("expected a config error, got a sink"),
    }
    // A port nothing listens on: a proxy started and stopped.
    let proxy = Proxy::start(RABBITMQ).await;
    proxy.stop().await;
    let url = format!("amqp://guest:secret@127.0.0.1:{}/%2f", proxy.port);
    match AmqpSink::connect(&url, options("", "k")).await {
        Err(RelayError::Connect { system: "amqp", url, .. }) => {
            assert!(!url.contains("secret"), "the password is not shown: {url}");
        }
        Err(other) => panic!("expected a connect error, got {other}"),
        Ok(_) => panic!("expected a connect error, got a sink"),
    }
}

/// While the broker is gone every message is unavailable, and sends succeed once it is
/// back.
#[tokio::test]
async fn while_the_broker_is_gone_every_message_is_unavailable() {
    common::target::while_the_broker_is_gone_every_message_is_unavailable::<Amqp>().await;
}

#[tokio::test]
async fn a_broker_that_stops_answering_is_given_up_after_the_confirm_timeout_and_sent_to_again() {
    let mut rabbit = Rabbit::new().await;
    let queue = rabbit.queue(Some("#")).await;
    let proxy = Proxy::start(RABBITMQ).await;
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port);
    let mut options = options(&rabbit.exchange, "k");
    options.confirm_timeout = Duration::from_millis(500);
    let sink = AmqpSink::connect(&url, options).await.unwrap();
    all_ok(&sink.send(&batch(1, 10, 2)).await);

    proxy.freeze();
    for r in sink.send(&batch(11, 10, 2)).await {
        assert!(matches!(&r, Err(SinkError::Unavailable(reason)) if reason.contains("confirm")), "{r:?}");
    }
    proxy.thaw();
    all_ok(&sink.send(&batch(11, 10, 2)).await);

    // The first copies of 11..=20 may reach the broker too once the proxy passes bytes
    // again: sent again, with the same ids.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for delivery in rabbit.drain(&queue).await {
        *seen.entry(message_id(&delivery)).or_default() += 1;
    }
    for id in 1..=20 {
        let copies = seen.remove(&format!("orders:{id}")).unwrap_or(0);
        assert!(copies == 1 || (id > 10 && copies == 2), "id {id}: {copies} copies");
    }
    assert!(seen.is_empty(), "nothing else: {seen:?}");
    rabbit.delete().await;
}

/// The test's exchange and a queue bound to `orders.#` on it, consumed as messages come.
struct Amqp {
    rabbit: Rabbit,
    consumer: lapin::Consumer,
}

impl Target for Amqp {
    const NAME: &'static str = "amqp";
    const ADDR: &'static str = RABBITMQ;
    const DEDUPLICATES: bool = false;
    type Sink = AmqpSink;

    async fn new() -> Amqp {
        let mut rabbit = Rabbit::new().await;
        let bound = rabbit.queue(Some("orders.#")).await;
        let options = BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() };
        let consumer = rabbit
            .channel
            .basic_consume(
                bound.as_str().into(),
                unique("rowbus_relay_c").as_str().into(),
                options,
                FieldTable::default(),
            )
            .await
            .unwrap();
        Amqp { rabbit, consumer }
    }

    fn place(&self, group: &str, key: &str) -> String {
        format!("orders.{group}.{key}")
    }

    async fn sink(&self, addr: &str, prefix: &str) -> AmqpSink {
        let options = AmqpOptions::new(&self.rabbit.exchange, self.template(), prefix);
        AmqpSink::connect(&format!("amqp://guest:guest@{addr}/%2f"), options).await.expect("connect the sink")
    }

    async fn next(&mut self, within: Duration) -> Option<Arrival> {
        let delivery = tokio::time::timeout(within, self.consumer.next()).await.ok()?;
        let delivery = delivery.expect("the consumer goes on").expect("a delivery");
        Some(Arrival {
            id: message_id(&delivery),
            n: header(&delivery, "n").expect("the header n").parse().unwrap(),
            group: header(&delivery, "rowbus-group"),
            key: header(&delivery, "rowbus-key"),
            place: delivery.routing_key.to_string(),
            payload: delivery.data,
        })
    }

    async fn close(self) {
        self.rabbit.delete().await;
    }
}

scenarios!(Amqp:
    ten_thousand_arrive_once_each,
    four_relays_keep_each_keys_order,
    a_leased_relay_killed_mid_stream_loses_nothing,
    a_transactional_relay_killed_mid_stream_loses_nothing,
);
