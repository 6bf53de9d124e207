//! Shared by the relay's benches: their flags, the payloads, the relay of a full queue
//! timed until the broker confirmed every message, and the interleaved rounds with their
//! table of medians. A bench says what is its own: each broker's native client and the
//! relay's sink to it ([`Bench::round`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rowbus::{Broker, BrokerOptions, Db, DbPool, Message, OnPool, Queue};
use rowbus_relay::Relay;
use rowbus_relay::sink::{Outgoing, Sink, SinkError};
use tokio::sync::oneshot;

/// The bytes of each message.
pub const PAYLOAD: usize = 100;

/// The flags of a bench.
#[derive(Debug, Clone)]
pub struct Args {
    pub url: String,
    pub messages: usize,
    pub rounds: usize,
    pub batch: usize,
    pub in_flight: usize,
    pub only: Option<String>,
    /// The MQTT broker's port on 127.0.0.1.
    pub mqtt_port: u16,
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

/// The payload of message `i`: its number, padded to [`PAYLOAD`] bytes.
pub fn payload(i: usize) -> Vec<u8> {
    let mut p = format!("{i:>10}").into_bytes();
    p.resize(PAYLOAD, b'x');
    p
}

/// The relay of a full queue to `sink`: messages/s.
pub async fn relay<DB: Db, S: Sink>(args: &Args, queue: &Queue<DB>, sink: S) -> f64 {
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

/// (native, relay): the two measured one after the other, the relay first when
/// `relay_first`.
pub async fn in_turn(
    relay_first: bool,
    native: impl Future<Output = f64>,
    relay: impl Future<Output = f64>,
) -> (f64, f64) {
    if relay_first {
        let r = relay.await;
        (native.await, r)
    } else {
        let n = native.await;
        (n, relay.await)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What a bench measures, broker by broker.
pub trait Bench {
    /// The brokers, by the names `--only` takes.
    const SYSTEMS: [&'static str; 2];

    /// One round of a broker: (native, relay) in messages/s, from [`in_turn`].
    async fn round<DB: Db>(&self, round: Round<'_, DB>) -> (f64, f64);

    /// Closes what the bench opened.
    async fn close(self);
}

/// One round of one broker.
pub struct Round<'a, DB: Db> {
    pub args: &'a Args,
    /// Which of [`Bench::SYSTEMS`].
    pub system: &'a str,
    /// Deployed, empty.
    pub queue: &'a Queue<DB>,
    /// The round's own, for what it makes at the broker (and drops).
    pub name: &'a str,
    /// Whether the relay is measured before the native client.
    pub relay_first: bool,
}

struct Rounds<B>(Args, B);

impl<B: Bench> OnPool for Rounds<B> {
    type Output = ();

    async fn run<DB: Db>(self, pool: rowbus::sqlx::Pool<DB>) {
        let Rounds(args, bench) = self;
        let broker = Broker::new(
            pool,
            BrokerOptions { poll_interval: Duration::from_millis(50), ..Default::default() },
        )
        .await
        .unwrap();
        let tag = std::process::id();
        let systems = B::SYSTEMS.into_iter().filter(|b| args.only.as_deref().is_none_or(|o| o == *b));
        let mut figures: Vec<(&str, Vec<f64>, Vec<f64>)> = systems.map(|b| (b, vec![], vec![])).collect();
        for round in 0..args.rounds {
            for (b, (system, natives, relays)) in figures.iter_mut().enumerate() {
                let name = format!("relay_bench_{tag}_{round}_{b}");
                let queue = broker.queue(&name).unwrap();
                queue.deploy().await.unwrap();
                let relay_first = (round + b) % 2 == 1;
                let this = Round { args: &args, system, queue: &queue, name: &name, relay_first };
                let (native, relayed) = bench.round(this).await;
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
        bench.close().await;
        broker.shutdown(Duration::from_secs(1)).await;
    }
}

/// Runs the bench `make` makes of the flags, on the database `--database-url` names.
pub async fn main<B: Bench>(make: impl AsyncFnOnce(&Args) -> B) {
    let args = args();
    let bench = make(&args).await;
    let db = DbPool::connect_creating(&args.url, 8).await.expect("the database");
    db.run(Rounds(args, bench)).await;
}
