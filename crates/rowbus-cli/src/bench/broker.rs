//! `rowbus bench broker`: the table broker's publish and drain rates, raw sqlx INSERT and
//! claim loops as their baselines, and publish-to-handler latency in one process and across brokers.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use futures::future::try_join_all;
use rowbus::sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Pool, Type};
use rowbus::{Backend, Broker, BrokerOptions, DbPool, Delivery, Message, NotifyConfig, OnPool, Queue};
use tokio::sync::{Notify, mpsc};

use super::{Jitter, Percentiles, bar, percentiles};
use super::{raw_claim, raw_insert};

/// Options of `rowbus bench broker`.
#[derive(Debug, Args)]
pub struct BrokerBench {
    /// Messages each throughput scenario publishes or drains
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Rounds of the throughput scenarios, interleaved (each figure is the median)
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Concurrent publishers, and connections of the raw loops
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Workers of each batch subscription
    #[arg(long, default_value_t = 1)]
    batch_workers: usize,
    /// Batch subscriptions draining the queue at once: a subscription has one claim in
    /// flight at a time, so 8 of them match the raw loops' 8 connections
    #[arg(long, default_value_t = 8)]
    batch_subscriptions: usize,
    /// Messages timed one at a time for each latency figure
    #[arg(long, default_value_t = 200)]
    latency_samples: u32,
    /// Run only these scenarios (comma-separated): publish1, publish1-wake (publish1 with
    /// listen_notify on), rawinsert1, txpublish1 (one message per committed transaction),
    /// txpublish1-wake (with listen_notify on), publish100, rawinsert100, drain1, drain4, drain8, batch16, batch100, txbatch16, txbatch100, raw1, raw16, raw100, keepdrain1,
    /// keepdrain8, keepbatch100, keeptxbatch100 (the same drains on a queue keeping its
    /// history, each compared with its plain one), latency, latency-remote
    #[arg(long, value_delimiter = ',', value_name = "SCENARIOS")]
    only: Vec<Scenario>,
    /// Give the messages ordering keys, message i the key `i % N` (0: none). With N at
    /// least the messages, no key waits for another message: the figure is the cost of
    /// the claim's key check
    #[arg(long, value_name = "N", default_value_t = 0)]
    keys: u64,
    /// Limit each bench queue to N messages in flight at once (`rowbus limit
    /// --max-running N`; 0: no limit): the figures are the cost of a limited claim
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_running: u64,
    /// Print the results as one JSON object
    #[arg(long)]
    json: bool,
}

/// `--keys`, read by [`payload`] (set once, before any scenario runs).
static KEYS: AtomicU64 = AtomicU64::new(0);

/// `--max-running`, read by [`fresh_queue`] (set once, before any scenario runs).
static MAX_RUNNING: AtomicU64 = AtomicU64::new(0);

/// One measurement of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// Single-message publishes from concurrent publishers.
    Publish1,
    /// [`Publish1`](Self::Publish1) on a broker with `listen_notify` on: each statement
    /// wakes other processes too.
    Publish1Wake,
    /// One message per committed `BrokerTx`, as many transactions at a time as publishers.
    TxPublish1,
    /// [`TxPublish1`](Self::TxPublish1) on a broker with `listen_notify` on: each commit
    /// wakes other processes too.
    TxPublish1Wake,
    /// `publish_batch` of 100 from concurrent publishers.
    Publish100,
    /// `run` with this many workers draining a backlog.
    Drain(usize),
    /// `run_batch` with batches of this size draining a backlog.
    Batch(usize),
    /// `run_batch_tx` with batches of this size draining a backlog.
    BatchTx(usize),
    /// The raw sqlx loop claiming this many rows a turn.
    Raw(usize),
    /// The raw sqlx loop inserting this many rows a statement.
    RawInsert(u64),
    /// [`Drain`](Self::Drain) on a queue deployed with a keep duration.
    KeepDrain(usize),
    /// [`Batch`](Self::Batch) on a queue deployed with a keep duration.
    KeepBatch(usize),
    /// [`BatchTx`](Self::BatchTx) on a queue deployed with a keep duration.
    KeepBatchTx(usize),
    /// Publish-to-handler latency, one broker.
    Latency,
    /// Publish-to-handler latency, a second broker publishing, woken by notification.
    LatencyRemote,
}

/// Every throughput scenario, in the order one round runs them: each rowbus publish and
/// drain sits next to the raw loop it is compared with.
/// A kept-history drain runs right after its plain one.
const ROUND: [Scenario; 21] = [
    Scenario::Publish1,
    Scenario::Publish1Wake,
    Scenario::RawInsert(1),
    Scenario::TxPublish1,
    Scenario::TxPublish1Wake,
    Scenario::Publish100,
    Scenario::RawInsert(100),
    Scenario::Drain(1),
    Scenario::KeepDrain(1),
    Scenario::Drain(4),
    Scenario::Drain(8),
    Scenario::KeepDrain(8),
    Scenario::Raw(1),
    Scenario::Batch(16),
    Scenario::BatchTx(16),
    Scenario::Raw(16),
    Scenario::Batch(100),
    Scenario::KeepBatch(100),
    Scenario::BatchTx(100),
    Scenario::KeepBatchTx(100),
    Scenario::Raw(100),
];

/// How long the kept-history scenarios' queues keep (longer than any run).
const BENCH_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scenario::Publish1 => f.write_str("publish1"),
            Scenario::Publish1Wake => f.write_str("publish1-wake"),
            Scenario::TxPublish1 => f.write_str("txpublish1"),
            Scenario::TxPublish1Wake => f.write_str("txpublish1-wake"),
            Scenario::Publish100 => f.write_str("publish100"),
            Scenario::Drain(n) => write!(f, "drain{n}"),
            Scenario::Batch(n) => write!(f, "batch{n}"),
            Scenario::BatchTx(n) => write!(f, "txbatch{n}"),
            Scenario::Raw(n) => write!(f, "raw{n}"),
            Scenario::RawInsert(n) => write!(f, "rawinsert{n}"),
            Scenario::KeepDrain(n) => write!(f, "keepdrain{n}"),
            Scenario::KeepBatch(n) => write!(f, "keepbatch{n}"),
            Scenario::KeepBatchTx(n) => write!(f, "keeptxbatch{n}"),
            Scenario::Latency => f.write_str("latency"),
            Scenario::LatencyRemote => f.write_str("latency-remote"),
        }
    }
}

impl FromStr for Scenario {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let known = ROUND.iter().copied().chain([Scenario::Latency, Scenario::LatencyRemote]);
        for scenario in known {
            if scenario.to_string() == s.trim() {
                return Ok(scenario);
            }
        }
        Err(format!(
            "unknown scenario {s:?}: expected publish1, publish1-wake, rawinsert1, txpublish1, txpublish1-wake, publish100, rawinsert100, drain1, drain4, drain8, batch16, \
             batch100, txbatch16, txbatch100, raw1, raw16, raw100, keepdrain1, keepdrain8, keepbatch100, \
             keeptxbatch100, latency or latency-remote"
        ))
    }
}

impl Scenario {
    /// What the results table calls it.
    fn label(self, args: &BrokerBench) -> String {
        let (c, w, s) = (args.concurrency, args.batch_workers, args.batch_subscriptions);
        match self {
            Scenario::Publish1 => format!("publish 1 msg, {c} publishers"),
            Scenario::Publish1Wake => format!("publish 1 msg, {c} publishers, listen_notify"),
            Scenario::TxPublish1 => format!("BrokerTx of 1 msg, {c} at a time"),
            Scenario::TxPublish1Wake => format!("BrokerTx of 1 msg, {c} at a time, listen_notify"),
            Scenario::Publish100 => format!("publish_batch 100, {c} publishers"),
            Scenario::Drain(n) => format!("run, {n} worker{}", if n == 1 { "" } else { "s" }),
            Scenario::Batch(n) if s == 1 => format!("run_batch {n}, {w} workers"),
            Scenario::Batch(n) => format!("run_batch {n}, {s} subs x {w} workers"),
            Scenario::BatchTx(n) if s == 1 => format!("run_batch_tx {n}, {w} workers"),
            Scenario::BatchTx(n) => format!("run_batch_tx {n}, {s} subs x {w} workers"),
            Scenario::Raw(k) => format!("raw sqlx loop k={k}, {c} conns"),
            Scenario::RawInsert(1) => format!("raw sqlx INSERT 1 row, {c} conns"),
            Scenario::RawInsert(k) => format!("raw sqlx INSERT {k} rows, {c} conns"),
            Scenario::KeepDrain(n) => format!("{}, kept history", Scenario::Drain(n).label(args)),
            Scenario::KeepBatch(n) => format!("{}, kept", Scenario::Batch(n).label(args)),
            Scenario::KeepBatchTx(n) => format!("{}, kept", Scenario::BatchTx(n).label(args)),
            Scenario::Latency => "latency, in-process".to_owned(),
            Scenario::LatencyRemote => "latency, second broker".to_owned(),
        }
    }

    /// The raw loop a rowbus publish or drain is compared with; the plain drain a
    /// kept-history one is.
    fn baseline(self) -> Option<Scenario> {
        match self {
            Scenario::Publish1 | Scenario::TxPublish1 => Some(Scenario::RawInsert(1)),
            Scenario::Publish1Wake => Some(Scenario::Publish1),
            Scenario::TxPublish1Wake => Some(Scenario::TxPublish1),
            Scenario::Publish100 => Some(Scenario::RawInsert(100)),
            Scenario::KeepDrain(n) => Some(Scenario::Drain(n)),
            Scenario::KeepBatch(n) => Some(Scenario::Batch(n)),
            Scenario::KeepBatchTx(n) => Some(Scenario::BatchTx(n)),
            Scenario::Drain(_) => Some(Scenario::Raw(1)),
            Scenario::Batch(k) | Scenario::BatchTx(k) => Some(Scenario::Raw(k)),
            _ => None,
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count); 0 when empty.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `part` as a percentage of `whole`, when `whole` was measured.
fn percent_of(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0 && part.is_finite()).then(|| 100.0 * part / whole)
}

/// A rate with thousands separators: `12,345`.
fn thousands(value: f64) -> String {
    crate::queue_cmd::thousands(value.max(0.0).round() as u64)
}

/// One throughput run.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    per_s: f64,
    /// Raw loop: turns tried again after a deadlock. rowbus: claims that failed (after the
    /// broker's own deadlock retries).
    retries: u64,
}

/// One latency figure, and the floor under it.
#[derive(Debug, Clone, Copy, Default)]
struct Latency {
    percentiles: Percentiles,
    /// A one-row autocommitted INSERT with sqlx alone, timed between the samples on a
    /// plain table beside the queue: what the database's durable commit costs at that
    /// moment, the part of a publish-to-handler time rowbus cannot take away.
    insert: Percentiles,
    lost: u64,
}

/// Samples of a latency run made and thrown away before the timed ones: the first
/// publishes prepare their statements and fill the caches.
const WARM_UP: u32 = 20;

/// Unique queue table names of this run: `rbb_<pid>_<scenario>_<round>`.
fn table_name(scenario: Scenario, round: u32) -> String {
    let scenario = scenario.to_string().replace('-', "_");
    format!("rbb_{}_{scenario}_{round}", std::process::id())
}

/// The scenarios to run: `--only`'s, or all of them.
fn selected(only: &[Scenario]) -> (Vec<Scenario>, Vec<Scenario>) {
    let want = |s: &Scenario| only.is_empty() || only.contains(s);
    let throughput = ROUND.iter().copied().filter(want).collect();
    let latency = [Scenario::Latency, Scenario::LatencyRemote].into_iter().filter(want).collect();
    (throughput, latency)
}

/// Runs `rowbus bench broker` on `url`; `notify_table` is the notify table the cross-broker
/// latency wakes through on MySQL/MariaDB and SQLite.
pub async fn broker(url: &str, notify_table: NotifyConfig, args: BrokerBench) -> Result<(), rowbus::Error> {
    let db = DbPool::connect(url).await?;
    let (throughput, latency) = selected(&args.only);
    let bench = OnDatabase {
        url,
        notify_table: &notify_table,
        args: &args,
        throughput: &throughput,
        latency: &latency,
    };
    let results = db.run(bench).await;
    db.close().await;
    let results = results?;
    if args.json {
        println!("{}", results.json(&args));
    } else {
        results.print(&args);
    }
    Ok(())
}

/// Everything measured.
struct Results {
    backend: Backend,
    runs: BTreeMap<Scenario, Vec<Run>>,
    latency: BTreeMap<Scenario, Latency>,
    /// The notify table's poll interval (MySQL/MariaDB and SQLite's cross-broker wake-up).
    notify_poll: Duration,
    elapsed: Duration,
}

impl Results {
    fn median(&self, scenario: Scenario) -> Option<f64> {
        let runs = self.runs.get(&scenario)?;
        Some(median(&runs.iter().map(|r| r.per_s).collect::<Vec<_>>()))
    }

    /// A rowbus publish's or drain's median as a percentage of its raw baseline's.
    fn vs_raw(&self, scenario: Scenario) -> Option<(Scenario, f64)> {
        let raw = scenario.baseline()?;
        Some((raw, percent_of(self.median(scenario)?, self.median(raw)?)?))
    }

    /// What wakes the subscription in a latency scenario.
    fn wake_up(&self, scenario: Scenario) -> String {
        match (scenario, self.backend) {
            (Scenario::Latency, _) => "same broker".to_owned(),
            (_, Backend::Postgres) => "LISTEN/NOTIFY".to_owned(),
            _ => format!("notify table, {} ms poll", self.notify_poll.as_millis()),
        }
    }

    fn json(&self, args: &BrokerBench) -> serde_json::Value {
        let mut throughput = serde_json::Map::new();
        for (scenario, runs) in &self.runs {
            let mut entry = serde_json::json!({
                "label": scenario.label(args),
                "msgs_per_s": self.median(*scenario),
                "runs_msgs_per_s": runs.iter().map(|r| r.per_s).collect::<Vec<_>>(),
            });
            let key = match scenario {
                Scenario::Raw(_) => Some("deadlocks_retried"),
                Scenario::Publish1
                | Scenario::Publish1Wake
                | Scenario::TxPublish1
                | Scenario::TxPublish1Wake
                | Scenario::Publish100
                | Scenario::RawInsert(_) => None,
                _ => Some("claims_failed"),
            };
            if let Some(key) = key {
                entry[key] = runs.iter().map(|r| r.retries).sum::<u64>().into();
            }
            if let Some((raw, pct)) = self.vs_raw(*scenario) {
                entry["baseline"] = raw.to_string().into();
                entry["percent_of_baseline"] = pct.into();
            }
            throughput.insert(scenario.to_string(), entry);
        }
        let mut latency = serde_json::Map::new();
        for (scenario, l) in &self.latency {
            latency.insert(
                scenario.to_string(),
                serde_json::json!({
                    "p50_ms": l.percentiles.p50,
                    "p99_ms": l.percentiles.p99,
                    "max_ms": l.percentiles.max,
                    "insert_p50_ms": l.insert.p50,
                    "insert_p99_ms": l.insert.p99,
                    "samples": args.latency_samples,
                    "lost": l.lost,
                    "wake_up": self.wake_up(*scenario),
                }),
            );
        }
        serde_json::json!({
            "backend": self.backend.name(),
            "messages": args.messages,
            "rounds": args.rounds,
            "concurrency": args.concurrency,
            "batch_workers": args.batch_workers,
            "batch_subscriptions": args.batch_subscriptions,
            "keys": args.keys,
            "max_running": args.max_running,
            "throughput": throughput,
            "latency": latency,
            "elapsed_s": self.elapsed.as_secs_f64(),
        })
    }

    /// The two tables, throughput and latency, their columns as wide as their cells.
    fn lines(&self, args: &BrokerBench) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.runs.is_empty() {
            let mut rows =
                vec![["scenario", "what", "msgs/s", "vs baseline", "runs"].map(str::to_owned).to_vec()];
            for (scenario, runs) in &self.runs {
                let vs = match self.vs_raw(*scenario) {
                    Some((raw, pct)) => format!("{pct:.0}% of {raw}"),
                    None => String::new(),
                };
                let all: Vec<String> = runs.iter().map(|r| thousands(r.per_s)).collect();
                let retries: u64 = runs.iter().map(|r| r.retries).sum();
                let retries = match (retries, scenario) {
                    (0, _) => String::new(),
                    (n, Scenario::Raw(_)) => format!(" ({n} deadlocks retried)"),
                    (n, _) => format!(" ({n} claims failed)"),
                };
                rows.push(vec![
                    scenario.to_string(),
                    scenario.label(args),
                    thousands(self.median(*scenario).unwrap_or(0.0)),
                    vs,
                    format!("{}{retries}", all.join(" ")),
                ]);
            }
            lines.extend(super::table(&rows, &[2]));
        }
        if !self.latency.is_empty() {
            let mut rows = vec![
                ["latency", "wake-up", "p50 ms", "p99 ms", "max ms", "INSERT p50", "INSERT p99"]
                    .map(str::to_owned)
                    .to_vec(),
            ];
            let mut lost = Vec::new();
            for (scenario, l) in &self.latency {
                rows.push(vec![
                    scenario.to_string(),
                    self.wake_up(*scenario),
                    format!("{:.2}", l.percentiles.p50),
                    format!("{:.2}", l.percentiles.p99),
                    format!("{:.2}", l.percentiles.max),
                    format!("{:.2}", l.insert.p50),
                    format!("{:.2}", l.insert.p99),
                ]);
                if l.lost > 0 {
                    lost.push(format!("{scenario}: {} latency samples never reached the handler", l.lost));
                }
            }
            lines.extend(super::table(&rows, &[2, 3, 4, 5, 6]));
            lines.extend(lost);
            lines.push(
                "INSERT: a one-row autocommitted INSERT with sqlx alone, timed between the samples: the commit's floor"
                    .to_owned(),
            );
        }
        lines
    }

    fn print(&self, args: &BrokerBench) {
        println!(
            "{} — {} messages per run, median of {} interleaved round{}",
            self.backend.name(),
            args.messages,
            args.rounds,
            if args.rounds == 1 { "" } else { "s" }
        );
        for line in self.lines(args) {
            println!("{line}");
        }
        println!("({:.0} s in all)", self.elapsed.as_secs_f64());
    }
}

/// Runs the scenarios on one backend's pool (and a second pool for the remote latency).
async fn run_on<DB>(
    pool: &Pool<DB>,
    url: &str,
    notify_table: &NotifyConfig,
    args: &BrokerBench,
    throughput: &[Scenario],
    latency: &[Scenario],
) -> Result<Results, rowbus::Error>
where
    DB: rowbus::Db,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let started = Instant::now();
    let mut results = Results {
        backend: DB::BACKEND,
        runs: BTreeMap::new(),
        latency: BTreeMap::new(),
        notify_poll: notify_table.poll_interval,
        elapsed: Duration::ZERO,
    };
    // Latency first, on a server not yet busy purging the throughput runs' deleted rows.
    for &scenario in latency {
        let table = table_name(scenario, 0);
        let measured = match scenario {
            Scenario::LatencyRemote => {
                // The other broker has a pool of its own.
                let publisher = rowbus::connect::<DB>(url, 2).await?;
                let remote = (publisher.clone(), notify_table.clone());
                let measured = latency_run(pool, Some(remote), &table, args.latency_samples).await;
                publisher.close().await;
                measured
            }
            _ => latency_run(pool, None, &table, args.latency_samples).await,
        };
        drop_queue(pool, &table).await;
        results.latency.insert(scenario, measured?);
    }
    for round in 1..=args.rounds.max(1) {
        for &scenario in throughput {
            let table = table_name(scenario, round);
            let run = throughput_run(pool, &table, scenario, args, notify_table).await;
            drop_queue(pool, &table).await;
            results.runs.entry(scenario).or_default().push(run?);
        }
    }
    results.elapsed = started.elapsed();
    Ok(results)
}

/// What one `bench broker` measures, run on the URL's database.
struct OnDatabase<'a> {
    url: &'a str,
    notify_table: &'a NotifyConfig,
    args: &'a BrokerBench,
    throughput: &'a [Scenario],
    latency: &'a [Scenario],
}

impl OnPool for OnDatabase<'_> {
    type Output = Result<Results, rowbus::Error>;

    async fn run<DB: rowbus::Db>(self, pool: Pool<DB>) -> Self::Output
    where
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
        for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
        usize: ColumnIndex<DB::Row>,
    {
        KEYS.store(self.args.keys, Ordering::Relaxed);
        MAX_RUNNING.store(self.args.max_running, Ordering::Relaxed);
        run_on(&pool, self.url, self.notify_table, self.args, self.throughput, self.latency).await
    }
}

/// Drops a queue table and its dead-letter table (the raw loop's table too: it has no
/// dead-letter table, and dropping one is a no-op); a failure is only reported.
async fn drop_queue<DB: rowbus::Db>(pool: &Pool<DB>, table: &str) {
    let dropped = async {
        let broker = rowbus::Broker::new(pool.clone(), rowbus::BrokerOptions::default()).await?;
        broker.queue(table)?.undeploy().await
    };
    if let Err(error) = dropped.await {
        eprintln!("rowbus: dropping bench table {table}: {error}");
    }
}

/// A ~30-byte payload, keyed when `--keys` says so.
fn payload(i: u64) -> Message {
    let message = Message::text(format!("bench message {i:>16}"));
    match KEYS.load(Ordering::Relaxed) {
        0 => message,
        keys => message.key(format!("k{}", i % keys)),
    }
}

/// A fresh broker with its queue deployed (and limited, as `--max-running` says).
async fn fresh_queue<DB: rowbus::Db>(
    pool: &Pool<DB>,
    table: &str,
    options: BrokerOptions,
) -> Result<(Broker<DB>, Queue<DB>), rowbus::Error> {
    let broker = Broker::new(pool.clone(), options).await?;
    let queue = broker.queue(table)?;
    queue.deploy().await?;
    match MAX_RUNNING.load(Ordering::Relaxed) {
        0 => {}
        n => queue.set_limit(&rowbus::limit::LimitScope::Queue, rowbus::limit::Limit::MaxRunning(n)).await?,
    }
    Ok((broker, queue))
}

/// Fills the queue with `n` messages, 1,000 a statement.
async fn prefill<DB: rowbus::Db>(queue: &Queue<DB>, n: u64) -> Result<(), rowbus::Error> {
    let mut next = 0;
    while next < n {
        let end = (next + 1000).min(n);
        queue.publish_batch((next..end).map(payload)).await?;
        next = end;
    }
    Ok(())
}

/// Checks that the queue holds `expected` messages and none dead-lettered.
async fn expect_depth<DB: rowbus::Db>(
    queue: &Queue<DB>,
    scenario: Scenario,
    expected: u64,
) -> Result<(), rowbus::Error> {
    let (waiting, dead) = queue.depth("").await?;
    if waiting != expected as i64 || dead != 0 {
        eprintln!(
            "rowbus: {scenario}: {waiting} messages left and {dead} dead-lettered (expected {expected} and 0)"
        );
    }
    Ok(())
}

/// One throughput run of `scenario` on its own table; the `-wake` scenarios' broker wakes
/// through `notify_table` on MySQL/MariaDB and SQLite.
async fn throughput_run<DB>(
    pool: &Pool<DB>,
    table: &str,
    scenario: Scenario,
    args: &BrokerBench,
    notify_table: &NotifyConfig,
) -> Result<Run, rowbus::Error>
where
    DB: rowbus::Db,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let n = args.messages.max(1);
    let options = match scenario {
        Scenario::Publish1Wake | Scenario::TxPublish1Wake => BrokerOptions {
            listen_notify: true,
            notify_table: notify_table.clone(),
            ..BrokerOptions::default()
        },
        _ => BrokerOptions::default(),
    };
    let (broker, queue) = fresh_queue(pool, table, options).await?;
    let scenario = match scenario {
        // The same drain as the plain one, on a queue that keeps.
        Scenario::KeepDrain(_) | Scenario::KeepBatch(_) | Scenario::KeepBatchTx(_) => {
            queue.deploy_keeping(BENCH_KEEP).await?;
            scenario.baseline().expect("a kept scenario has a plain one")
        }
        other => other,
    };
    let progress = bar(n, &scenario.to_string());
    let run = match scenario {
        Scenario::Publish1 | Scenario::Publish1Wake | Scenario::Publish100 => {
            let per = if scenario == Scenario::Publish100 { 100 } else { 1 };
            let started = Instant::now();
            publish_all(&queue, n, per, args.concurrency, &progress).await?;
            let run = Run { per_s: n as f64 / started.elapsed().as_secs_f64(), retries: 0 };
            expect_depth(&queue, scenario, n).await?;
            run
        }
        Scenario::TxPublish1 | Scenario::TxPublish1Wake => {
            let started = Instant::now();
            publish_in_transactions(&broker, &queue, n, args.concurrency, &progress).await?;
            let run = Run { per_s: n as f64 / started.elapsed().as_secs_f64(), retries: 0 };
            expect_depth(&queue, scenario, n).await?;
            run
        }
        Scenario::Drain(workers) => {
            prefill(&queue, n).await?;
            let run = drain(&broker, &queue, n, (1, workers), Runner::Single, &progress).await?;
            expect_depth(&queue, scenario, 0).await?;
            run
        }
        Scenario::Batch(batch) | Scenario::BatchTx(batch) => {
            prefill(&queue, n).await?;
            let shape = (args.batch_subscriptions, args.batch_workers);
            let runner = match scenario {
                Scenario::Batch(_) => Runner::Batch(batch),
                _ => Runner::BatchTx(batch),
            };
            let run = drain(&broker, &queue, n, shape, runner, &progress).await?;
            expect_depth(&queue, scenario, 0).await?;
            run
        }
        Scenario::Raw(k) => {
            // The baseline's own plain table, beside the (empty) queue table.
            let raw = format!("{table}_raw");
            raw_claim::drop_table(pool, &raw).await;
            raw_claim::prefill(pool, DB::BACKEND, &raw, n).await?;
            let connections = args.concurrency;
            let started = Instant::now();
            let drained = raw_claim::drain(pool, DB::BACKEND, &raw, k, connections, &progress).await;
            let elapsed = started.elapsed();
            raw_claim::drop_table(pool, &raw).await;
            let drained = drained?;
            if drained.rows != n {
                eprintln!("rowbus: {scenario}: the raw loop deleted {} of {n} rows", drained.rows);
            }
            Run { per_s: drained.rows as f64 / elapsed.as_secs_f64(), retries: drained.retries }
        }
        Scenario::RawInsert(k) => {
            // The raw claim loop's plain table, beside the (empty) queue table.
            let raw = format!("{table}_raw");
            raw_claim::drop_table(pool, &raw).await;
            let create = raw_claim::create_sql(DB::BACKEND, &raw);
            let mut conn = pool.acquire().await?;
            rowbus::sqlx::query(rowbus::sqlx::AssertSqlSafe(create)).execute(&mut *conn).await?;
            drop(conn);
            let started = Instant::now();
            let inserted =
                raw_insert::publish(pool, DB::BACKEND, &raw, n, k, args.concurrency, &progress).await;
            let elapsed = started.elapsed();
            raw_claim::drop_table(pool, &raw).await;
            let inserted = inserted?;
            Run { per_s: inserted as f64 / elapsed.as_secs_f64(), retries: 0 }
        }
        Scenario::Latency
        | Scenario::LatencyRemote
        | Scenario::KeepDrain(_)
        | Scenario::KeepBatch(_)
        | Scenario::KeepBatchTx(_) => unreachable!("not a throughput scenario"),
    };
    progress.finish_and_clear();
    broker.shutdown(Duration::from_secs(5)).await;
    Ok(run)
}

/// Publishes `n` messages, `per` a call, from `publishers` concurrent publishers.
async fn publish_all<DB: rowbus::Db>(
    queue: &Queue<DB>,
    n: u64,
    per: u64,
    publishers: usize,
    progress: &indicatif::ProgressBar,
) -> Result<(), rowbus::Error> {
    let calls = n.div_ceil(per);
    let next = AtomicU64::new(0);
    let publisher = || async {
        loop {
            let call = next.fetch_add(1, Ordering::Relaxed);
            if call >= calls {
                return Ok::<(), rowbus::Error>(());
            }
            let (from, to) = (call * per, ((call + 1) * per).min(n));
            if per == 1 {
                queue.publish(payload(from)).await?;
            } else {
                queue.publish_batch((from..to).map(payload)).await?;
            }
            progress.inc(to - from);
        }
    };
    try_join_all((0..publishers.max(1)).map(|_| publisher())).await?;
    Ok(())
}

/// Publishes `n` messages, one per committed [`BrokerTx`](rowbus::BrokerTx), from
/// `publishers` concurrent transactions.
async fn publish_in_transactions<DB: rowbus::Db>(
    broker: &Broker<DB>,
    queue: &Queue<DB>,
    n: u64,
    publishers: usize,
    progress: &indicatif::ProgressBar,
) -> Result<(), rowbus::Error> {
    // Read once on a pooled connection: with every connection in a transaction, the
    // first publishes would wait for one until the pool's timeout.
    queue.max_message_bytes().await?;
    let next = AtomicU64::new(0);
    let publisher = || async {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return Ok::<(), rowbus::Error>(());
            }
            let mut tx = broker.begin().await?;
            tx.publish(queue, payload(i)).await?;
            tx.commit().await?;
            progress.inc(1);
        }
    };
    try_join_all((0..publishers.max(1)).map(|_| publisher())).await?;
    Ok(())
}

/// The runner a drain scenario uses.
#[derive(Debug, Clone, Copy)]
enum Runner {
    /// `run`: a message per handler call.
    Single,
    /// `run_batch` with batches of this size.
    Batch(usize),
    /// `run_batch_tx` with batches of this size.
    BatchTx(usize),
}

/// Drains the `n`-message backlog with `runner`, in `(subscriptions, workers each)`, from
/// the subscriptions' start until every message is handled and acknowledged (the broker's
/// shutdown waits for the acknowledgements and commits in flight).
async fn drain<DB: rowbus::Db>(
    broker: &Broker<DB>,
    queue: &Queue<DB>,
    n: u64,
    (subscriptions, workers): (usize, usize),
    runner: Runner,
    progress: &indicatif::ProgressBar,
) -> Result<Run, rowbus::Error> {
    let handled = Arc::new(AtomicU64::new(0));
    let all_handled = Arc::new(Notify::new());
    let count = {
        let (handled, all_handled) = (handled.clone(), all_handled.clone());
        move |k: u64| {
            if handled.fetch_add(k, Ordering::Relaxed) + k >= n {
                all_handled.notify_one();
            }
        }
    };
    let started = Instant::now();
    let subscription = |count: Arc<dyn Fn(u64) + Send + Sync>| async move {
        let builder = queue.subscribe().workers(workers).poll_interval(Duration::from_secs(1));
        match runner {
            Runner::Single => {
                builder
                    .run(move |_: Delivery<DB>| {
                        count(1);
                        async { Ok::<(), Infallible>(()) }
                    })
                    .await
            }
            Runner::Batch(batch) => {
                builder
                    .batch(batch)
                    .run_batch(move |deliveries: Vec<Delivery<DB>>| {
                        count(deliveries.len() as u64);
                        async { Ok::<(), Infallible>(()) }
                    })
                    .await
            }
            Runner::BatchTx(batch) => {
                builder
                    .batch(batch)
                    .run_batch_tx(move |_, messages| {
                        count(messages.len() as u64);
                        Box::pin(async { Ok::<(), Infallible>(()) })
                    })
                    .await
            }
        }
    };
    let watcher = async {
        let mut last = (0, Instant::now());
        loop {
            tokio::select! {
                _ = all_handled.notified() => break,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            let now = handled.load(Ordering::Relaxed);
            progress.set_position(now);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(30) {
                eprintln!("rowbus: drain stalled at {now} of {n} messages");
                break;
            }
        }
        broker.shutdown(Duration::from_secs(30)).await;
        started.elapsed()
    };
    let count: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(count);
    let subscriptions = try_join_all((0..subscriptions.max(1)).map(|_| subscription(count.clone())));
    let (ran, elapsed) = tokio::join!(subscriptions, watcher);
    ran?;
    let stats = broker.stats();
    Ok(Run {
        per_s: handled.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        retries: stats.claim_errors,
    })
}

/// Publish-to-handler latency of an idle subscription (10 s poll interval): `samples`
/// messages, one at a time, 10-20 ms apart. With `remote`, a second broker on that pool
/// publishes and the subscription's broker is woken by its notification (`listen_notify`,
/// through that notify table on MySQL/MariaDB and SQLite); there the spacing is 10 ms plus a
/// random part of the table's poll interval, so that samples fall on every phase of the
/// poll (each is published soon after the poll that delivered the one before).
async fn latency_run<DB>(
    pool: &Pool<DB>,
    remote: Option<(Pool<DB>, NotifyConfig)>,
    table: &str,
    samples: u32,
) -> Result<Latency, rowbus::Error>
where
    DB: rowbus::Db,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let listen_notify = remote.is_some();
    let mut options = BrokerOptions { listen_notify, ..BrokerOptions::default() };
    if let Some((_, notify_table)) = &remote {
        options.notify_table = notify_table.clone();
    }
    // The floor's plain table, beside the queue's, made before the
    // broker so that a refusal leaves nothing running.
    let floor = format!("{table}_floor");
    raw_claim::drop_table(pool, &floor).await;
    let create = raw_claim::create_sql(DB::BACKEND, &floor);
    rowbus::sqlx::query(rowbus::sqlx::AssertSqlSafe(create)).execute(pool).await?;
    let insert = raw_claim::insert_sql(DB::BACKEND, &floor, 1);
    let (broker, queue) = fresh_queue(pool, table, options.clone()).await?;
    let publisher = match remote {
        Some((remote, _)) => {
            let other = Broker::new(remote, options.clone()).await?;
            Some((other.queue(table)?, other))
        }
        None => None,
    };
    let publish_queue = publisher.as_ref().map_or(&queue, |(q, _)| q);
    let spread = match DB::BACKEND {
        Backend::MySql | Backend::Sqlite if listen_notify => options.notify_table.poll_interval,
        _ => Duration::from_millis(10),
    };
    let base = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel::<Duration>();
    let subscription =
        queue.subscribe().poll_interval(Duration::from_secs(10)).run(move |d: Delivery<DB>| {
            let at = base.elapsed();
            let sent = d.text().ok().and_then(|t| t.trim().parse::<u64>().ok()).map(Duration::from_nanos);
            if let Some(sent) = sent {
                let _ = tx.send(at.saturating_sub(sent));
            }
            async { Ok::<(), Infallible>(()) }
        });
    let label = if listen_notify { "latency-remote" } else { "latency" };
    let progress = bar(u64::from(samples), label);
    let timer = async {
        // Let the subscription make its first (empty) claim and go idle.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut jitter = Jitter(0x2545_F491_4F6C_DD1D);
        let mut latencies = Vec::with_capacity(samples as usize);
        let mut inserts = Vec::with_capacity(samples as usize);
        let mut lost = 0;
        for i in 0..samples + WARM_UP {
            let timed = i >= WARM_UP;
            tokio::time::sleep(Duration::from_millis(10) + spread.mul_f64(jitter.next_unit())).await;
            let sent = base.elapsed().as_nanos() as u64;
            if let Err(error) = publish_queue.publish(Message::text(sent.to_string())).await {
                broker.shutdown(Duration::from_secs(5)).await;
                return Err(error);
            }
            // The poll interval is 10 s: a sample lost to the wake-up still arrives by then.
            match tokio::time::timeout(Duration::from_secs(15), rx.recv()).await {
                Ok(Some(latency)) if timed => latencies.push(latency),
                Ok(Some(_)) => {}
                _ => lost += u64::from(timed),
            }
            // The floor, after the same kind of pause.
            tokio::time::sleep(Duration::from_millis(10) + spread.mul_f64(jitter.next_unit())).await;
            let started = Instant::now();
            let inserted = rowbus::sqlx::query(rowbus::sqlx::AssertSqlSafe(insert.as_str()))
                .bind(i64::from(i))
                .execute(pool)
                .await;
            if let Err(error) = inserted {
                broker.shutdown(Duration::from_secs(5)).await;
                return Err(error.into());
            }
            if timed {
                inserts.push(started.elapsed());
                progress.inc(1);
            }
        }
        broker.shutdown(Duration::from_secs(5)).await;
        Ok(Latency { percentiles: percentiles(latencies), insert: percentiles(inserts), lost })
    };
    let (ran, measured) = tokio::join!(subscription, timer);
    progress.finish_and_clear();
    raw_claim::drop_table(pool, &floor).await;
    if let Some((_, other)) = publisher {
        other.shutdown(Duration::from_secs(1)).await;
    }
    ran?;
    measured
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_parse_and_print_alike() {
        for scenario in ROUND.iter().copied().chain([Scenario::Latency, Scenario::LatencyRemote]) {
            assert_eq!(scenario.to_string().parse::<Scenario>(), Ok(scenario));
        }
        assert_eq!(" drain8".parse::<Scenario>(), Ok(Scenario::Drain(8)));
        assert!("drain2".parse::<Scenario>().is_err());
        assert!("".parse::<Scenario>().is_err());
    }

    #[test]
    fn only_selects_in_round_order() {
        let (throughput, latency) = selected(&[Scenario::Raw(16), Scenario::Latency, Scenario::Batch(16)]);
        assert_eq!(throughput, vec![Scenario::Batch(16), Scenario::Raw(16)]);
        assert_eq!(latency, vec![Scenario::Latency]);
        let (throughput, latency) = selected(&[]);
        assert_eq!(throughput.len(), ROUND.len());
        assert_eq!(latency.len(), 2);
    }

    #[test]
    fn drains_compare_with_their_raw_loop() {
        assert_eq!(Scenario::Drain(8).baseline(), Some(Scenario::Raw(1)));
        assert_eq!(Scenario::Batch(100).baseline(), Some(Scenario::Raw(100)));
        assert_eq!(Scenario::BatchTx(16).baseline(), Some(Scenario::Raw(16)));
        assert_eq!("txbatch100".parse::<Scenario>(), Ok(Scenario::BatchTx(100)));
        assert_eq!(Scenario::Publish1.baseline(), Some(Scenario::RawInsert(1)));
        assert_eq!(Scenario::Publish1Wake.baseline(), Some(Scenario::Publish1));
        assert_eq!(Scenario::TxPublish1.baseline(), Some(Scenario::RawInsert(1)));
        assert_eq!(Scenario::TxPublish1Wake.baseline(), Some(Scenario::TxPublish1));
        assert_eq!("publish1-wake".parse::<Scenario>(), Ok(Scenario::Publish1Wake));
        assert_eq!("txpublish1".parse::<Scenario>(), Ok(Scenario::TxPublish1));
        assert_eq!("txpublish1-wake".parse::<Scenario>(), Ok(Scenario::TxPublish1Wake));
        assert_eq!(Scenario::Publish100.baseline(), Some(Scenario::RawInsert(100)));
        assert_eq!("rawinsert100".parse::<Scenario>(), Ok(Scenario::RawInsert(100)));
        assert_eq!(Scenario::RawInsert(100).baseline(), None);
        assert_eq!(Scenario::Raw(16).baseline(), None);
    }

    #[test]
    fn medians_and_percentages() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(percent_of(60.0, 100.0), Some(60.0));
        assert_eq!(percent_of(1.0, 0.0), None);
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1234.0), "1,234");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }

    #[test]
    fn table_names_are_valid_and_distinct() {
        let a = table_name(Scenario::LatencyRemote, 0);
        assert!(a.parse::<rowbus::QueueTable>().is_ok(), "{a}");
        assert_ne!(table_name(Scenario::Raw(1), 1), table_name(Scenario::Raw(1), 2));
        assert_ne!(table_name(Scenario::Batch(16), 1), table_name(Scenario::Raw(16), 1));
    }
}
