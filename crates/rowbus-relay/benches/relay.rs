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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt as _;
use rowbus::{Broker, BrokerOptions, Db, DbPool, Message, OnPool, Queue};
use rowbus_relay::sink::nats::{NatsOptions, NatsSink};
use rowbus_relay::sink::redis::{RedisOptions, RedisSink};
use rowbus_relay::sink::{Outgoing, Sink, SinkError};
use rowbus_relay::{Relay, Template};
use tokio::sync::oneshot;

const NATS: &str = "nats://127.0.0.1:4222";
const REDIS: &str = "redis://127.0.0.1:6379";
const PAYLOAD: usize = 100;

#[derive(Debug, Clone)]
struct Args {
    url: String,
    messages: usize,
    rounds: usize,
    batch: usize,
    in_flight: usize,
    only: Option<String>,
}

fn args() -> Args {
    let mut args = Args {
        url: "postgres://postgres@127.0.0.1:5432/test".to_owned(),
        messages: 20_000,
        rounds: 5,
        batch: rowbus_relay::DEFAULT_BATCH,
        in_flight: rowbus_relay::DEFAULT_IN_FLIGHT,
        only: None,
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
        let js = jetstream::new(async_nats::connect(NATS).await.unwrap());
        let mut redis = redis::Client::open(REDIS).unwrap().get_multiplexed_async_connection().await.unwrap();
        let brokers: Vec<&str> =
            ["nats", "redis"].into_iter().filter(|b| args.only.as_deref().is_none_or(|o| o == *b)).collect();
        let mut figures: Vec<(&str, Vec<f64>, Vec<f64>)> =
            brokers.iter().map(|b| (*b, vec![], vec![])).collect();
        for round in 0..args.rounds {
            for (b, (system, natives, relays)) in figures.iter_mut().enumerate() {
                let queue = broker.queue(&format!("relay_bench_{tag}_{round}_{b}")).unwrap();
                queue.deploy().await.unwrap();
                let stream = format!("relay_bench_{tag}_{round}_{b}");
                let relay_first = (round + b) % 2 == 1;
                let (native, relayed) = match *system {
                    "nats" => {
                        js.create_stream(jetstream::stream::Config {
                            name: stream.clone(),
                            subjects: vec![format!("{stream}.>")],
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                        let sink = NatsSink::connect(
                            NATS,
                            NatsOptions::new(
                                Template::parse(&format!("{stream}.relay")).unwrap(),
                                queue.table().to_string(),
                            ),
                        )
                        .await
                        .unwrap();
                        let (n, r) = if relay_first {
                            let r = relay(&args, &queue, sink).await;
                            (native_nats(&args, &format!("{stream}.native")).await, r)
                        } else {
                            let n = native_nats(&args, &format!("{stream}.native")).await;
                            (n, relay(&args, &queue, sink).await)
                        };
                        js.delete_stream(&stream).await.unwrap();
                        (n, r)
                    }
                    _ => {
                        let sink = RedisSink::connect(
                            REDIS,
                            RedisOptions::new(Template::parse(&format!("{stream}:relay")).unwrap()),
                        )
                        .await
                        .unwrap();
                        let (n, r) = if relay_first {
                            let r = relay(&args, &queue, sink).await;
                            (native_redis(&args, &format!("{stream}:native")).await, r)
                        } else {
                            let n = native_redis(&args, &format!("{stream}:native")).await;
                            (n, relay(&args, &queue, sink).await)
                        };
                        let _: () = redis::cmd("DEL")
                            .arg(format!("{stream}:relay"))
                            .arg(format!("{stream}:native"))
                            .query_async(&mut redis)
                            .await
                            .unwrap();
                        (n, r)
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
        broker.shutdown(Duration::from_secs(1)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let db = DbPool::connect_creating(&args.url, 8).await.expect("the database");
    db.run(Bench(args)).await;
}
