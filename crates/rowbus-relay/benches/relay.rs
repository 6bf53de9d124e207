//! The relay's throughput beside each broker's own client publishing with confirmations
//! from the same number of connections (one), in interleaved rounds; medians.
//!
//! ```sh
//! CARGO_TARGET_DIR=/work/rel-relay cargo bench -p rowbus-relay --all-features --bench relay -- \
//!     --database-url postgres://postgres@127.0.0.1:5432/test --messages 20000 --rounds 5
//! ```
//!
//! Each round, for each broker in turn (the order alternating between rounds):
//! - native: the broker's client publishes `--messages` messages of 100 bytes on one
//!   connection with confirmations, keeping up to `--batch` × `--in-flight` unconfirmed
//!   (NATS: JetStream publishes with Nats-Msg-Id, each PubAck awaited; Redis: pipelines of
//!   `--batch` XADDs, `--in-flight` of them at once on one multiplexed connection);
//! - relay: a queue holding as many messages (published before the clock starts) is
//!   relayed by one relay (`--batch`, `--in-flight`) until the broker confirmed every
//!   message and the relay settled them (removed them from the queue).
//!
//! The queues and streams are the run's own and are dropped at the end.

mod common;

use std::time::Instant;

use async_nats::jetstream;
use common::{Args, Bench, Round, in_turn, payload, relay};
use futures::StreamExt as _;
use rowbus::Db;
use rowbus_relay::Template;
use rowbus_relay::sink::nats::{NatsOptions, NatsSink};
use rowbus_relay::sink::redis::{RedisOptions, RedisSink};

const NATS: &str = "nats://127.0.0.1:4222";
const REDIS: &str = "redis://127.0.0.1:6379";

/// NATS's own client: messages/s.
async fn native_nats(args: &Args, subject: &str) -> f64 {
    let client = async_nats::connect(NATS).await.unwrap();
    let window = args.batch * args.in_flight;
    // The client holds a permit per unawaited PubAck (5,000 by default) and waits for one
    // before each publish: a window over that would wait forever.
    let js = jetstream::ContextBuilder::new().max_ack_inflight(window.max(1)).build(client);
    let started = Instant::now();
    let mut pending = futures::stream::FuturesOrdered::new();
    for i in 0..args.messages {
        if pending.len() >= window {
            pending.next().await.unwrap();
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("native:{i}").as_str());
        let ack = js.publish_with_headers(subject.to_owned(), headers, payload(i).into()).await.unwrap();
        pending.push_back(async move { ack.await.expect("a PubAck") });
    }
    while pending.next().await.is_some() {}
    args.messages as f64 / started.elapsed().as_secs_f64()
}

/// Redis's own client: messages/s.
async fn native_redis(args: &Args, stream: &str) -> f64 {
    let client = redis::Client::open(REDIS).unwrap();
    let connection = client.get_multiplexed_async_connection().await.unwrap();
    let started = Instant::now();
    let chunks: Vec<Vec<usize>> =
        (0..args.messages).collect::<Vec<_>>().chunks(args.batch).map(<[usize]>::to_vec).collect();
    futures::stream::iter(chunks)
        .map(|chunk| {
            let mut connection = connection.clone();
            async move {
                let mut pipe = redis::pipe();
                for i in chunk {
                    pipe.cmd("XADD").arg(stream).arg("*").arg("payload").arg(payload(i)).arg("id").arg(i);
                }
                let _: Vec<redis::Value> = pipe.query_async(&mut connection).await.unwrap();
            }
        })
        .buffer_unordered(args.in_flight)
        .collect::<Vec<()>>()
        .await;
    args.messages as f64 / started.elapsed().as_secs_f64()
}

/// NATS's and Redis's clients, and the relay's sinks to them.
struct Clients {
    js: jetstream::Context,
    redis: redis::aio::MultiplexedConnection,
}

impl Bench for Clients {
    const SYSTEMS: [&'static str; 2] = ["nats", "redis"];

    async fn round<DB: Db>(&self, round: Round<'_, DB>) -> (f64, f64) {
        let Round { args, system, queue, name, relay_first } = round;
        if system == "nats" {
            self.js
                .create_stream(jetstream::stream::Config {
                    name: name.to_owned(),
                    subjects: vec![format!("{name}.>")],
                    ..Default::default()
                })
                .await
                .unwrap();
            let template = Template::parse(&format!("{name}.relay")).unwrap();
            let sink =
                NatsSink::connect(NATS, NatsOptions::new(template, queue.table().to_string())).await.unwrap();
            let target = format!("{name}.native");
            let native = native_nats(args, &target);
            let figures = in_turn(relay_first, native, relay(args, queue, sink)).await;
            self.js.delete_stream(name).await.unwrap();
            figures
        } else {
            let template = Template::parse(&format!("{name}:relay")).unwrap();
            let sink = RedisSink::connect(REDIS, RedisOptions::new(template)).await.unwrap();
            let target = format!("{name}:native");
            let native = native_redis(args, &target);
            let figures = in_turn(relay_first, native, relay(args, queue, sink)).await;
            let _: () = redis::cmd("DEL")
                .arg(format!("{name}:relay"))
                .arg(format!("{name}:native"))
                .query_async(&mut self.redis.clone())
                .await
                .unwrap();
            figures
        }
    }

    async fn close(self) {}
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    common::main(async |_: &Args| Clients {
        js: jetstream::new(async_nats::connect(NATS).await.unwrap()),
        redis: redis::Client::open(REDIS).unwrap().get_multiplexed_async_connection().await.unwrap(),
    })
    .await;
}
