//! The model and the library agree: random steps of the kinds the model has (publishes
//! with ordering keys, delayed or not; claims; acknowledgements, failures, snoozes and
//! extensions; crashes; cancels; a pause; a limit; the clock passing every lease) run
//! against the real library on PostgreSQL, MariaDB and SQLite, and every step, with its
//! outcome, is replayed through the model ([`Replay`]): each must be a step the model
//! allows, and every state it can lead to must keep the safety properties.
//!
//! Seeds are fixed so that a failure repeats; `ROWBUS_MODEL_SEED` runs another one.
//! A failure prints the history and the model states it was taken from.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use rowbus::limit::{Limit, LimitScope};
use rowbus::{Broker, BrokerOptions, Db, Delivery, Error, Message, Queue, RetryPolicy};
use rowbus_model::Spec;
use rowbus_model::replay::{Replay, Step, Timing};

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const MARIADB: &str = "mysql://root@127.0.0.1:3306/test";

const TIMING: Timing = Timing {
    lease: Duration::from_millis(500),
    delay: Duration::from_millis(150),
    snooze: Duration::from_millis(150),
    backoff: Duration::from_millis(150),
    slack: Duration::from_millis(100),
};
/// The timing of the limit gap's path: a longer lease, so that no claim outlasts it on a
/// loaded machine (such a claim hands out nothing, and the path would not be taken).
const GAP: Timing = Timing { lease: Duration::from_millis(1500), ..TIMING };
const MESSAGES: usize = 8;
const CONSUMERS: usize = 2;
const MAX_ATTEMPTS: u8 = 2;
const STEPS: usize = 70;

/// A small seeded generator (xorshift64*): the same seed, the same steps.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// A table name of this run's own.
fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("model_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

fn options() -> BrokerOptions {
    BrokerOptions {
        lease: TIMING.lease,
        retry: RetryPolicy {
            max_attempts: u32::from(MAX_ATTEMPTS),
            base: TIMING.backoff,
            factor: 1.0,
            max_delay: TIMING.backoff,
        },
        run_schedules: false,
        ..BrokerOptions::default()
    }
}

/// A consumer: a broker of its own (its own pool, as another process would have) and the
/// deliveries it holds, by model message.
struct Consumer<DB: Db> {
    broker: Broker<DB>,
    queue: Queue<DB>,
    held: Vec<(u8, Delivery<DB>)>,
}

/// One claim of at most one message: a subscription's stream's first claim, awaited until
/// it brought a message or the broker's counters say it came back empty (the stream then
/// waits an hour, and is dropped).
async fn claim<DB: Db>(consumer: &Consumer<DB>, lease: Duration) -> Option<Delivery<DB>> {
    let before = consumer.broker.stats();
    let builder = consumer.queue.subscribe().lease(lease).poll_interval(Duration::from_secs(3600));
    let mut stream = builder.schedules(false).stream().await.expect("subscribe");
    loop {
        tokio::select! {
            item = stream.next() => return Some(item.expect("the stream ended").expect("the claim failed")),
            _ = tokio::time::sleep(Duration::from_millis(1)) => {
                // A claim counts its messages, then itself: once it is counted, a second
                // look sees its messages (one look reads them before the claim).
                if consumer.broker.stats().claims > before.claims && consumer.broker.stats().claimed == before.claimed {
                    return None;
                }
            }
        }
    }
}

/// Whether a settle succeeded (`false`: refused as a lost lease).
fn settled(result: Result<(), Error>) -> bool {
    match result {
        Ok(()) => true,
        Err(Error::LeaseLost { .. }) => false,
        Err(other) => panic!("a settle failed: {other}"),
    }
}

/// A queue of a new name deployed on `url`, with the broker that deployed it.
async fn deployed<DB: Db>(url: &str) -> (String, Broker<DB>, rowbus::Queue<DB>) {
    let name = unique();
    let admin = Broker::<DB>::new(rowbus::connect_creating::<DB>(url, 4).await.expect("connect"), options())
        .await
        .expect("broker");
    let queue = admin.queue(&name).expect("queue");
    queue.deploy().await.expect("deploy");
    (name, admin, queue)
}

/// Runs `STEPS` random steps against `url` with `seed`, replaying each through the model.
async fn agree<DB: Db>(url: &str, seed: u64) {
    let (name, admin, queue) = deployed::<DB>(url).await;
    let mut consumers = Vec::new();
    for _ in 0..CONSUMERS {
        let pool = rowbus::connect::<DB>(url, 4).await.expect("connect");
        let broker = Broker::<DB>::new(pool, options()).await.expect("broker");
        let queue = broker.queue(&name).expect("queue");
        consumers.push(Consumer { broker, queue, held: Vec::new() });
    }
    let mut rng = Rng(seed | 1);
    let specs: Vec<Spec> =
        (0..MESSAGES).map(|_| Spec { key: [None, Some(0), Some(1)][rng.below(3)] }).collect();
    let mut replay = Replay::new(specs.clone(), CONSUMERS as u8, MAX_ATTEMPTS, 1, TIMING);
    let (mut ids, mut paused, mut limited) = (Vec::<i64>::new(), false, false);
    let started = Instant::now();
    for _ in 0..STEPS {
        let began = Instant::now();
        // A pause or a limit lasts a few steps, not most of the run.
        let roll = match rng.below(100) {
            _ if paused && rng.chance(35) => 90,
            _ if limited && rng.chance(25) => 93,
            roll => roll,
        };
        let step = if roll < 20 && ids.len() < MESSAGES {
            let msg = ids.len() as u8;
            let delayed = rng.chance(25);
            let mut message = Message::text(format!("m{msg}"));
            if let Some(key) = specs[ids.len()].key {
                message = message.key(format!("k{key}"));
            }
            if delayed {
                message = message.delay(TIMING.delay);
            }
            ids.push(queue.publish_with_id(message).await.expect("publish").expect("an id"));
            Step::Publish { msg, delayed }
        } else if roll < 50 {
            let c = rng.below(CONSUMERS);
            if consumers[c].held.len() >= 2 {
                continue;
            }
            let got = claim(&consumers[c], TIMING.lease).await;
            let got = got.map(|d| {
                let msg = ids.iter().position(|&id| id == d.id()).expect("a message of ours") as u8;
                let attempt = u8::try_from(d.attempt()).expect("a small attempt");
                consumers[c].held.push((msg, d));
                (msg, attempt)
            });
            Step::Claim { consumer: c as u8, got }
        } else if roll < 80 {
            let c = rng.below(CONSUMERS);
            if consumers[c].held.is_empty() {
                continue;
            }
            let slot = rng.below(consumers[c].held.len());
            let (msg, consumer) = (consumers[c].held[slot].0, c as u8);
            match rng.below(10) {
                0..=3 => {
                    let (_, d) = consumers[c].held.remove(slot);
                    Step::Ack { consumer, msg, ok: settled(d.ack().await) }
                }
                4..=5 => {
                    let (_, d) = consumers[c].held.remove(slot);
                    Step::Fail { consumer, msg, ok: settled(d.fail("model").await) }
                }
                6..=7 => {
                    let (_, d) = consumers[c].held.remove(slot);
                    Step::Snooze { consumer, msg, ok: settled(d.snooze(TIMING.snooze).await) }
                }
                _ => {
                    let ok = settled(consumers[c].held[slot].1.extend_lease(TIMING.lease).await);
                    Step::Extend { consumer, msg, ok }
                }
            }
        } else if roll < 84 {
            let c = rng.below(CONSUMERS);
            consumers[c].held.clear();
            Step::Crash(c as u8)
        } else if roll < 88 && !ids.is_empty() {
            let msg = rng.below(ids.len());
            let cancelled = queue.cancel(&[ids[msg]]).await.expect("cancel");
            let (removed, running) =
                (cancelled.ids.contains(&ids[msg]), cancelled.running.contains(&ids[msg]));
            Step::Cancel { msg: msg as u8, removed, running }
        } else if roll < 92 {
            paused = !paused;
            if paused {
                queue.pause(Some("")).await.expect("pause");
                Step::Pause
            } else {
                queue.resume(Some("")).await.expect("resume");
                Step::Resume
            }
        } else if roll < 95 {
            limited = !limited;
            let scope = LimitScope::Group(String::new());
            if limited {
                queue.set_limit(&scope, Limit::MaxRunning(1)).await.expect("limit");
                Step::SetLimit
            } else {
                queue.clear_limit(&scope).await.expect("clear the limit");
                Step::ClearLimit
            }
        } else {
            // The clock passes every lease and delay.
            tokio::time::sleep(TIMING.lease + TIMING.slack * 2).await;
            continue;
        };
        let ended = Instant::now();
        if let Err(mismatch) = replay.step(step, began, ended) {
            panic!("{url} (seed {seed}): {mismatch}");
        }
        assert!(replay.possible() < 100_000, "the replay keeps too many states: {}", replay.possible());
    }
    let kinds = |f: fn(&Step) -> bool| replay.history().iter().filter(|s| f(s)).count();
    println!(
        "{url} (seed {seed}): {} steps in {:.1?}, {} claims that got a message, {} refused settles, {} model states possible at the end",
        replay.history().len(),
        started.elapsed(),
        kinds(|s| matches!(s, Step::Claim { got: Some(_), .. })),
        kinds(|s| matches!(
            s,
            Step::Ack { ok: false, .. }
                | Step::Fail { ok: false, .. }
                | Step::Snooze { ok: false, .. }
                | Step::Extend { ok: false, .. }
        )),
        replay.possible(),
    );
    for consumer in consumers {
        drop(consumer.held);
        consumer.broker.shutdown(Duration::from_secs(1)).await;
    }
    queue.undeploy().await.expect("undeploy");
    admin.shutdown(Duration::from_secs(1)).await;
}

/// The path of the limit gap rowbus had (tests/broken.rs finds it with
/// `Rules::extend_ignores_lease_end`), taken on the real database, where the limit now
/// holds: a consumer claims a message, stalls past its lease, a limit of one is set (its
/// seed passes over the run-out lease), and the consumer's extension is refused as a lost
/// lease instead of renewing the lease. Another consumer's limited claim then takes the
/// run-out message again, the limit counts it, and a further claim finds the group full.
/// Each step is replayed through the model, which allows them all. Before `extend` refused
/// run-out leases, the extension succeeded and the database ran two messages under live
/// leases with a limit of one, the limit counting one.
async fn limit_holds_after_a_stall<DB: Db>(url: &str) {
    let (name, admin, queue) = deployed::<DB>(url).await;
    let mut consumers = Vec::new();
    for _ in 0..2 {
        let broker = Broker::<DB>::new(rowbus::connect::<DB>(url, 4).await.expect("connect"), options())
            .await
            .expect("broker");
        let queue = broker.queue(&name).expect("queue");
        consumers.push(Consumer { broker, queue, held: Vec::new() });
    }
    let mut replay = Replay::new(vec![Spec { key: None }; 2], 2, MAX_ATTEMPTS, 1, GAP);
    let mut ids = Vec::new();
    let mut step = |step: Step, began: Instant| {
        if let Err(mismatch) = replay.step(step, began, Instant::now()) {
            panic!("{url}: {mismatch}");
        }
    };
    for msg in 0..2u8 {
        let began = Instant::now();
        ids.push(queue.publish_with_id(Message::text("m")).await.expect("publish").expect("an id"));
        step(Step::Publish { msg, delayed: false }, began);
    }
    let began = Instant::now();
    let first = claim(&consumers[1], GAP.lease).await.expect("the first message");
    assert_eq!(first.id(), ids[0], "claims go in id order");
    step(Step::Claim { consumer: 1, got: Some((0, 1)) }, began);
    tokio::time::sleep(GAP.lease + GAP.slack * 2).await;
    let scope = LimitScope::Group(String::new());
    let began = Instant::now();
    queue.set_limit(&scope, Limit::MaxRunning(1)).await.expect("limit");
    step(Step::SetLimit, began);
    let began = Instant::now();
    let extended = first.extend_lease(GAP.lease).await;
    assert!(
        matches!(extended, Err(Error::LeaseLost { id, .. }) if id == ids[0]),
        "{url}: an extension of a lease that ran out is refused, not renewed: {extended:?}"
    );
    step(Step::Extend { consumer: 1, msg: 0, ok: false }, began);
    let began = Instant::now();
    let second = claim(&consumers[0], GAP.lease).await.expect("the limit counts nothing running: a claim");
    let msg = ids.iter().position(|&id| id == second.id()).expect("a message of ours") as u8;
    let attempt = u8::try_from(second.attempt()).expect("a small attempt");
    step(Step::Claim { consumer: 0, got: Some((msg, attempt)) }, began);
    let began = Instant::now();
    let third = claim(&consumers[1], GAP.lease).await;
    assert!(third.is_none(), "{url}: a second message claimed under max_running 1");
    step(Step::Claim { consumer: 1, got: None }, began);
    let status = queue.limits().await.expect("limits");
    println!("{url}: the stalled holder's extension refused; the limit counts {} running", status[0].running);
    assert_eq!(status[0].running, 1, "the one message under a live lease is counted");
    let began = Instant::now();
    let ok = settled(first.ack().await);
    assert_eq!(ok, msg != 0, "the stalled holder's ack is refused once its message was claimed again");
    step(Step::Ack { consumer: 1, msg: 0, ok }, began);
    second.ack().await.expect("ack");
    for consumer in consumers {
        consumer.broker.shutdown(Duration::from_secs(1)).await;
    }
    queue.undeploy().await.expect("undeploy");
    admin.shutdown(Duration::from_secs(1)).await;
}

fn seeds(fixed: &[u64]) -> Vec<u64> {
    match std::env::var("ROWBUS_MODEL_SEED") {
        Ok(seed) => vec![seed.parse().expect("ROWBUS_MODEL_SEED is a number")],
        Err(_) => fixed.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_agrees_with_the_model() {
    for seed in seeds(&[1, 2]) {
        agree::<rowbus::sqlx::Postgres>(PG, seed).await;
    }
    limit_holds_after_a_stall::<rowbus::sqlx::Postgres>(PG).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_agrees_with_the_model() {
    for seed in seeds(&[1, 2]) {
        agree::<rowbus::sqlx::MySql>(MARIADB, seed).await;
    }
    limit_holds_after_a_stall::<rowbus::sqlx::MySql>(MARIADB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_agrees_with_the_model() {
    let dir = std::env::temp_dir();
    for seed in seeds(&[1, 2]) {
        let path = dir.join(format!("{}.sqlite", unique()));
        agree::<rowbus::sqlx::Sqlite>(&format!("sqlite://{}", path.display()), seed).await;
        remove_sqlite(&path);
    }
    let path = dir.join(format!("{}.sqlite", unique()));
    limit_holds_after_a_stall::<rowbus::sqlx::Sqlite>(&format!("sqlite://{}", path.display())).await;
    remove_sqlite(&path);
}

fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
