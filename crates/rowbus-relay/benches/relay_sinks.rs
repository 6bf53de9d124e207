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

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use rowbus::{Broker, BrokerOptions, Db, DbPool, Message, OnPool, Queue};
use rowbus_relay::sink::amqp::{AmqpOptions, AmqpSink};
use rowbus_relay::sink::mqtt::{MqttOptions, MqttSink};
use rowbus_relay::sink::{Outgoing, Sink, SinkError};
use rowbus_relay::{Relay, Template};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event};
use tokio::sync::oneshot;

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const PAYLOAD: usize = 100;

#[derive(Debug, Clone)]
struct Args {
    url: String,
    messages: usize,
    rounds: usize,
    batch: usize,
    in_flight: usize,
    only: Option<String>,
    mqtt_port: u16,
}

fn args() -> Args {
    let mut args = Args {
        url: "postgres://postgres@127.0.0.1:5432/test".to_owned(),
        messages: 20_000,
        rounds: 5,
        batch: rowbus_relay::DEFAULT_BATCH,
        in_flight: rowbus_relay::DEFAULT_IN_FLIGHT,
        only: None,
        mqtt_port: 1883,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || given.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--database-url" => args.url = value(),
            "--messages" => args.messages = value().parse().expect("--messages N"),
            "--rounds" => args.rounds = value().parse().expect("--rounds N"),
            "--batch" => args.batch = value().parse().expect("--batch N"),
            "--in-flight" => args.in_flight = value().parse().expect("--in-flight N"),
            "--only" => args.only = Some(value()),
            "--mqtt-port" => args.mqtt_port = value().parse().expect("--mqtt-port N"),
            // What cargo bench passes on.
            "--bench" => {}
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// A sink that counts what the broker confirmed and says when all was.
struct Counting<S> {
    inner: S,
    confirmed: Arc<AtomicU64>,
    all: u64,
    done: std::sync::Mutex<Option<oneshot::Sender<()>>>,
}

impl<S: Sink> Sink for Counting<S> {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        let results = self.inner.send(batch).await;
        let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
        if self.confirmed.fetch_add(ok, Ordering::Relaxed) + ok >= self.all
            && let Some(done) = self.done.lock().expect("never poisoned").take()
        {
            let _ = done.send(());
        }
        results
    }

    fn system(&self) -> &'static str {
        self.inner.system()
    }
}

fn payload(i: usize) -> Vec<u8> {
    let mut p = format!("{i:>10}").into_bytes();
    p.resize(PAYLOAD, b'x');
    p
}

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

/// The relay of a full queue to `sink`: messages/s.
async fn relay<DB: Db, S: Sink>(args: &Args, queue: &Queue<DB>, sink: S) -> f64 {
    let messages: Vec<Message> = (0..args.messages).map(|i| Message::new(payload(i))).collect();
    for chunk in messages.chunks(1000) {
        queue.publish_batch(chunk.to_vec()).await.unwrap();
    }
    let (done, all_confirmed) = oneshot::channel();
    let sink = Counting {
        inner: sink,
        confirmed: Arc::default(),
        all: args.messages as u64,
        done: Some(done).into(),
    };
    let started = Instant::now();
    let report = Relay::new(queue.clone(), sink)
        .batch(args.batch)
        .in_flight(args.in_flight)
        .until(async move {
            let _ = all_confirmed.await;
        })
        .run()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(report.confirmed, args.messages as u64, "{report:?}");
    args.messages as f64 / took.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Bench(Args);

impl OnPool for Bench {
    type Output = ();

    async fn run<DB: Db>(self, pool: rowbus::sqlx::Pool<DB>) {
        let args = self.0;
        let broker = Broker::new(
            pool,
            BrokerOptions { poll_interval: Duration::from_millis(50), ..Default::default() },
        )
        .await
        .unwrap();
        let tag = std::process::id();
        let rabbit = Connection::connect(AMQP, ConnectionProperties::default()).await.unwrap();
        let admin = rabbit.create_channel().await.unwrap();
        let brokers: Vec<&str> =
            ["amqp", "mqtt"].into_iter().filter(|b| args.only.as_deref().is_none_or(|o| o == *b)).collect();
        let mut figures: Vec<(&str, Vec<f64>, Vec<f64>)> =
            brokers.iter().map(|b| (*b, vec![], vec![])).collect();
        for round in 0..args.rounds {
            for (b, (system, natives, relays)) in figures.iter_mut().enumerate() {
                let name = format!("relay_bench_{tag}_{round}_{b}");
                let queue = broker.queue(&name).unwrap();
                queue.deploy().await.unwrap();
                let relay_first = (round + b) % 2 == 1;
                let (native, relayed) = match *system {
                    "amqp" => {
                        for q in [format!("{name}_native"), format!("{name}_relay")] {
                            admin
                                .queue_declare(
                                    q.as_str().into(),
                                    QueueDeclareOptions::default(),
                                    FieldTable::default(),
                                )
                                .await
                                .unwrap();
                        }
                        let options = AmqpOptions::new(
                            "",
                            Template::parse(&format!("{name}_relay")).unwrap(),
                            queue.table().to_string(),
                        );
                        let sink = AmqpSink::connect(AMQP, options).await.unwrap();
                        let (n, r) = if relay_first {
                            let r = relay(&args, &queue, sink).await;
                            (native_amqp(&args, &format!("{name}_native")).await, r)
                        } else {
                            let n = native_amqp(&args, &format!("{name}_native")).await;
                            (n, relay(&args, &queue, sink).await)
                        };
                        for q in [format!("{name}_native"), format!("{name}_relay")] {
                            admin
                                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                                .await
                                .unwrap();
                        }
                        (n, r)
                    }
                    _ => {
                        let options = MqttOptions::new(
                            Template::parse(&format!("{name}/relay")).unwrap(),
                            queue.table().to_string(),
                        );
                        let url = format!("mqtt://127.0.0.1:{}", args.mqtt_port);
                        let sink = MqttSink::connect(&url, options).await.unwrap();
                        if relay_first {
                            let r = relay(&args, &queue, sink).await;
                            (native_mqtt(&args, &format!("{name}/native")).await, r)
                        } else {
                            let n = native_mqtt(&args, &format!("{name}/native")).await;
                            (n, relay(&args, &queue, sink).await)
                        }
                    }
                };
                queue.undeploy().await.unwrap();
                eprintln!("round {}: {system}: native {native:.0}/s, relay {relayed:.0}/s", round + 1);
                natives.push(native);
                relays.push(relayed);
            }
        }
        println!(
            "{} messages of {PAYLOAD} bytes, batch {}, {} in flight, {} rounds, medians on {}:",
            args.messages,
            args.batch,
            args.in_flight,
            args.rounds,
            rowbus::redact(&args.url)
        );
        println!("| broker | native client, msgs/s | relay, msgs/s | relay / native |");
        println!("|---|---:|---:|---:|");
        for (system, natives, relays) in figures {
            let (n, r) = (median(natives), median(relays));
            println!("| {system} | {n:.0} | {r:.0} | {:.0}% |", 100.0 * r / n);
        }
        rabbit.close(200, "OK".into()).await.unwrap();
        broker.shutdown(Duration::from_secs(1)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let db = DbPool::connect_creating(&args.url, 8).await.expect("the database");
    db.run(Bench(args)).await;
}
