//! The relay's throughput to RabbitMQ and MQTT beside each broker's own client publishing
//! with confirmations from the same number of connections (one), in interleaved rounds;
//! medians. The NATS and Redis figures are `benches/relay.rs`'s; this one is built the same
//! way.
//!
//! ```sh
//! CARGO_TARGET_DIR=/work/rel-sinks cargo bench -p rowbus-relay --all-features --bench relay_sinks -- \
//!     --database-url postgres://postgres@127.0.0.1:5432/test --messages 20000 --rounds 5
//! ```
//!
//! Each round, for each broker in turn (the order alternating between rounds):
//! - native: the broker's client publishes `--messages` messages of 100 bytes on one
//!   connection with confirmations (RabbitMQ: lapin on a channel in confirm mode, persistent
//!   and mandatory as the relay publishes, up to `--batch` × `--in-flight` unconfirmed;
//!   MQTT: rumqttc's v5 client at QoS 1, every PUBACK awaited, as many in flight as the
//!   broker's receive maximum allows);
//! - relay: a queue holding as many messages (published before the clock starts) is
//!   relayed by one relay (`--batch`, `--in-flight`) until the broker confirmed every
//!   message and the relay settled them (removed them from the queue).
//!
//! RabbitMQ's messages go to a queue of the run's own through the default exchange, MQTT's
//! to a topic nobody subscribes to; the queues are dropped at the end. `--mqtt-port N`
//! points both MQTT clients at another broker on 127.0.0.1 (1883 by default), e.g. a
//! Mosquitto started with `set_tcp_nodelay true` (docs/relay.md says why).

mod common;

use std::collections::VecDeque;
use std::time::Instant;

use common::{Args, Bench, Round, in_turn, payload, relay};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use rowbus::Db;
use rowbus_relay::Template;
use rowbus_relay::sink::amqp::{AmqpOptions, AmqpSink};
use rowbus_relay::sink::mqtt::{MqttOptions, MqttSink};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event};

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// lapin on one channel in confirm mode: messages/s.
async fn native_amqp(args: &Args, queue: &str) -> f64 {
    let connection = Connection::connect(AMQP, ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let window = args.batch * args.in_flight;
    let options = BasicPublishOptions { mandatory: true, immediate: false };
    let started = Instant::now();
    let mut pending = VecDeque::with_capacity(window);
    for i in 0..args.messages {
        if pending.len() >= window {
            let confirm: lapin::PublisherConfirm = pending.pop_front().unwrap();
            assert!(confirm.await.unwrap().is_ack());
        }
        let properties =
            BasicProperties::default().with_message_id(format!("native:{i}").into()).with_delivery_mode(2);
        let confirm =
            channel.basic_publish("".into(), queue.into(), options, &payload(i), properties).await.unwrap();
        pending.push_back(confirm);
    }
    for confirm in pending {
        assert!(confirm.await.unwrap().is_ack());
    }
    let took = started.elapsed();
    connection.close(200, "OK".into()).await.unwrap();
    args.messages as f64 / took.as_secs_f64()
}

/// rumqttc's v5 client at QoS 1, every PUBACK awaited: messages/s.
async fn native_mqtt(args: &Args, topic: &str) -> f64 {
    let options = rumqttc::v5::MqttOptions::new(
        format!("rowbus-bench-{}", std::process::id()),
        "127.0.0.1",
        args.mqtt_port,
    );
    let (client, mut eventloop) = AsyncClient::new(options, 1024);
    let all = args.messages;
    let acks = tokio::spawn(async move {
        let mut acked = 0;
        while acked < all {
            if let Event::Incoming(Packet::PubAck(_)) = eventloop.poll().await.expect("the broker") {
                acked += 1;
            }
        }
    });
    let started = Instant::now();
    for i in 0..args.messages {
        client.publish(topic, QoS::AtLeastOnce, false, payload(i)).await.unwrap();
    }
    acks.await.unwrap();
    let took = started.elapsed();
    let _ = client.try_disconnect();
    args.messages as f64 / took.as_secs_f64()
}

/// A RabbitMQ connection of the bench's own, whose channel declares and deletes the
/// rounds' queues.
struct Rabbit {
    connection: Connection,
    admin: Channel,
}

impl Bench for Rabbit {
    const SYSTEMS: [&'static str; 2] = ["amqp", "mqtt"];

    async fn round<DB: Db>(&self, round: Round<'_, DB>) -> (f64, f64) {
        let Round { args, system, queue, name, relay_first } = round;
        if system == "amqp" {
            for q in [format!("{name}_native"), format!("{name}_relay")] {
                let options = QueueDeclareOptions::default();
                self.admin.queue_declare(q.as_str().into(), options, FieldTable::default()).await.unwrap();
            }
            let template = Template::parse(&format!("{name}_relay")).unwrap();
            let sink = AmqpSink::connect(AMQP, AmqpOptions::new("", template, queue.table().to_string()))
                .await
                .unwrap();
            let target = format!("{name}_native");
            let native = native_amqp(args, &target);
            let figures = in_turn(relay_first, native, relay(args, queue, sink)).await;
            for q in [format!("{name}_native"), format!("{name}_relay")] {
                self.admin.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
            }
            figures
        } else {
            let template = Template::parse(&format!("{name}/relay")).unwrap();
            let url = format!("mqtt://127.0.0.1:{}", args.mqtt_port);
            let sink =
                MqttSink::connect(&url, MqttOptions::new(template, queue.table().to_string())).await.unwrap();
            let target = format!("{name}/native");
            let native = native_mqtt(args, &target);
            in_turn(relay_first, native, relay(args, queue, sink)).await
        }
    }

    async fn close(self) {
        self.connection.close(200, "OK".into()).await.unwrap();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    common::main(async |_: &Args| {
        let connection = Connection::connect(AMQP, ConnectionProperties::default()).await.unwrap();
        let admin = connection.create_channel().await.unwrap();
        Rabbit { connection, admin }
    })
    .await;
}
