//! `rowbus bench horizon`: a queue at a steady rate, first with nothing in the way, then
//! while another connection holds the database's horizon open (PostgreSQL: a REPEATABLE
//! READ transaction, as a report or `pg_dump` holds one; MySQL/MariaDB: a consistent
//! snapshot), then after it ended. One line per window: messages handled a second, the
//! claims' p50 and p99, publish-to-handler p50 and p99, dead rows and size on disk; then the
//! figures of each phase's first and last five minutes. With `--drain N`, once the churn
//! is done and while the horizon is still held, N messages published at once are drained
//! from the queue that churned and from a fresh one, twice each, alternating.
//!
//! The consumer (a runner of `--workers`, woken by LISTEN or the notify table) and the
//! publisher (single messages a hundredth of a second's share at a time, from a broker of
//! its own, as another process publishes) run in this process; benches/horizon/run.sh runs it on a throwaway server
//! with production settings, beside a plain `SKIP LOCKED` table under pgbench.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use rowbus::sqlx::{self, Connection as _};
use rowbus::{Backend, Broker, BrokerOptions, DbPool, Delivery, Message, NotifyConfig, OnPool, Queue};

use super::{claim_times, percentiles};
use crate::queue_cmd::{duration, positive_duration};

/// Options of `rowbus bench horizon`.
#[derive(Debug, Args)]
pub struct HorizonBench {
    /// Messages published a second, single messages a hundredth of this at a time
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rate: u32,
    /// How long the queue runs before the horizon is held
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = duration)]
    clean: Duration,
    /// How long the horizon is held (0: not at all)
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration)]
    held: Duration,
    /// How long the queue runs after the horizon was let go
    #[arg(long, value_name = "DURATION", default_value = "3m", value_parser = duration)]
    after: Duration,
    /// The window of each line
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = positive_duration)]
    every: Duration,
    /// The consumer's workers
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,
    /// After the churn, with the horizon still held, drain N messages published at once
    /// from the queue that churned and from a fresh queue, alternating, twice each (0: none)
    #[arg(long, value_name = "N", default_value_t = 0)]
    drain: u64,
}

/// The phase a window belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Clean,
    Held,
    After,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Clean => "clean",
            Phase::Held => "held",
            Phase::After => "after",
        }
    }
}

/// What one window measured.
#[derive(Debug, Clone)]
struct Window {
    phase: Phase,
    /// Seconds since the start, at the window's end.
    at: f64,
    handled: u64,
    /// Samples in microseconds, kept while a summary part may need them ([`forget_middle`]):
    /// at 1,000 messages a second, `Duration`s kept for the whole run grew the process by
    /// about 1.5 MB a minute, which the resident memory column then showed as the
    /// consumer's.
    claims: Vec<u32>,
    latencies: Vec<u32>,
    dead: Option<i64>,
    size: Option<i64>,
    rss_kb: Option<u64>,
}

/// Runs `bench horizon` on `url`.
pub async fn horizon(url: &str, notify_table: NotifyConfig, args: HorizonBench) -> Result<(), rowbus::Error> {
    let db = DbPool::connect_with_size(url, args.workers + 4).await?;
    let measured = db.run(OnDatabase { url, notify_table: &notify_table, args: &args }).await;
    db.close().await;
    measured
}

struct OnDatabase<'a> {
    url: &'a str,
    notify_table: &'a NotifyConfig,
    args: &'a HorizonBench,
}

impl OnPool for OnDatabase<'_> {
    type Output = Result<(), rowbus::Error>;
    async fn run<DB: rowbus::Db>(self, pool: sqlx::Pool<DB>) -> Self::Output {
        let args = self.args;
        if DB::BACKEND != Backend::Postgres {
            DbPool::connect(self.url).await?.deploy_notify_table(self.notify_table).await?;
        }
        let options = BrokerOptions {
            listen_notify: true,
            notify_table: self.notify_table.clone(),
            ..BrokerOptions::default()
        };
        let consumer = Broker::new(pool, options.clone()).await?;
        let publisher = Broker::new(rowbus::connect::<DB>(self.url, 4).await?, options.clone()).await?;
        let table = format!("rowbus_bench_horizon_{}", std::process::id());
        let queue = consumer.queue(&table)?;
        queue.deploy().await?;
        let figures = Figures::connect(self.url, &table).await?;
        let ran = churn(&consumer, &queue, &publisher.queue(&table)?, &figures, args).await;
        let drained = match (&ran, args.drain) {
            (Ok(holder), n) if n > 0 => {
                drains(&consumer, &queue, n, matches!(holder, Some(Holder::Postgres(_) | Holder::MySql(_))))
                    .await
            }
            _ => Ok(()),
        };
        publisher.shutdown(Duration::from_secs(5)).await;
        consumer.shutdown(Duration::from_secs(5)).await;
        let _ = queue.undeploy().await;
        ran?;
        drained
    }
}

/// The steady publisher and consumer through the three phases; the horizon's holder, still
/// holding when `--after` is 0 (for the drains), else `None`.
async fn churn<DB: rowbus::Db>(
    consumer: &Broker<DB>,
    queue: &Queue<DB>,
    publish_to: &Queue<DB>,
    figures: &Figures,
    args: &HorizonBench,
) -> Result<Option<Holder>, rowbus::Error> {
    claim_times::record();
    let base = Instant::now();
    let handled = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let (count, times) = (handled.clone(), latencies.clone());
    let runner =
        tokio::spawn(queue.subscribe().workers(args.workers as usize).run(move |d: Delivery<DB>| {
            let at = base.elapsed();
            if let Some(sent) = d.text().ok().and_then(|t| t.parse::<u64>().ok()) {
                times
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(at.saturating_sub(Duration::from_nanos(sent)));
            }
            count.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), Infallible>(()) }
        }));
    let publish_to = publish_to.clone();
    let rate = args.rate;
    let publishing = tokio::spawn(async move {
        // A hundred ticks a second and the rate's share at each, published at once (as
        // many publishers would; the broker may carry several in one statement).
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        loop {
            tick.tick().await;
            let share = (0..rate.div_ceil(100)).map(|_| {
                let sent = base.elapsed().as_nanos() as u64;
                publish_to.publish(Message::text(sent.to_string()))
            });
            futures::future::try_join_all(share).await?;
        }
        #[allow(unreachable_code)]
        Ok::<(), rowbus::Error>(())
    });
    let phases = [(Phase::Clean, args.clean), (Phase::Held, args.held), (Phase::After, args.after)];
    let mut windows = Vec::new();
    let mut holder = None;
    let mut last = handled.load(Ordering::Relaxed);
    print_header();
    for (phase, length) in phases {
        if length.is_zero() {
            continue;
        }
        match phase {
            Phase::Held => holder = Some(Holder::hold(figures).await?),
            Phase::After => holder = None,
            Phase::Clean => {}
        }
        let end = Instant::now() + length;
        while Instant::now() < end {
            tokio::time::sleep(args.every.min(end - Instant::now())).await;
            if publishing.is_finished() {
                break;
            }
            let now = handled.load(Ordering::Relaxed);
            let (dead, size) = figures.read().await;
            let window = Window {
                phase,
                at: base.elapsed().as_secs_f64(),
                handled: now - last,
                claims: claim_times::take().into_iter().map(micros).collect(),
                latencies: std::mem::take(&mut *latencies.lock().unwrap_or_else(|e| e.into_inner()))
                    .into_iter()
                    .map(micros)
                    .collect(),
                dead,
                size,
                rss_kb: rss_kb(),
            };
            last = now;
            print_window(&window, args.every);
            windows.push(window);
            forget_middle(&mut windows, args.every);
        }
    }
    publishing.abort();
    if let Ok(Err(error)) = publishing.await {
        runner.abort();
        return Err(error);
    }
    runner.abort();
    print_summary(&windows, args.every);
    let _ = consumer;
    Ok(if args.after.is_zero() { holder } else { None })
}

/// Drains `n` messages published at once, from the queue that churned and from a fresh
/// one, alternating, twice each; prints each rate and their ratio.
async fn drains<DB: rowbus::Db>(
    broker: &Broker<DB>,
    churned: &Queue<DB>,
    n: u64,
    held: bool,
) -> Result<(), rowbus::Error> {
    let fresh_name = format!("{}_fresh", churned.table());
    let fresh = broker.queue(&fresh_name)?;
    fresh.deploy().await?;
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let result = async {
        for _ in 0..2 {
            for (name, queue) in [("churned", churned), ("fresh", &fresh)] {
                rates.entry(name).or_default().push(drain(queue, n).await?);
            }
        }
        Ok::<(), rowbus::Error>(())
    }
    .await;
    let _ = fresh.undeploy().await;
    result?;
    let median = |v: &Vec<f64>| (v[0] + v[1]) / 2.0;
    let (churned_rate, fresh_rate) = (median(&rates["churned"]), median(&rates["fresh"]));
    println!(
        "drain of {n}{}: churned queue {:.0} and {:.0} msgs/s, fresh queue {:.0} and {:.0} msgs/s: {:.2}x",
        if held { " with the horizon held" } else { "" },
        rates["churned"][0],
        rates["churned"][1],
        rates["fresh"][0],
        rates["fresh"][1],
        churned_rate / fresh_rate
    );
    Ok(())
}

/// Publishes `n` messages (1,000 a statement), then drains them with 8 workers: messages a
/// second of the drain.
async fn drain<DB: rowbus::Db>(queue: &Queue<DB>, n: u64) -> Result<f64, rowbus::Error> {
    let mut next = 0;
    while next < n {
        let end = (next + 1000).min(n);
        queue.publish_batch((next..end).map(|i| Message::text(format!("drain {i}")))).await?;
        next = end;
    }
    let handled = Arc::new(AtomicU64::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (count, all) = (handled.clone(), done.clone());
    let started = Instant::now();
    queue
        .subscribe()
        .workers(8)
        .until(async move { all.notified().await })
        .run(move |_d: Delivery<DB>| {
            if count.fetch_add(1, Ordering::Relaxed) + 1 == n {
                done.notify_one();
            }
            async { Ok::<(), Infallible>(()) }
        })
        .await?;
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The consumer's resident memory, in kB (Linux).
fn rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn print_header() {
    println!(
        "{:>7}  {:<5}  {:>9}  {:>8}  {:>8}  {:>8}  {:>8}  {:>10}  {:>10}  {:>8}",
        "t (s)",
        "phase",
        "handled/s",
        "claim50",
        "claim99",
        "e2e50",
        "e2e99",
        "dead",
        "size (kB)",
        "rss (kB)"
    );
}

fn opt(value: Option<i64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// A duration in whole microseconds (at most about 71 minutes).
fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Percentiles of samples in microseconds.
fn percentiles_us(samples: impl Iterator<Item = u32>) -> super::Percentiles {
    percentiles(samples.map(|us| Duration::from_micros(u64::from(us))).collect())
}

/// Drops the samples of the windows no summary part reads: those of a phase after its
/// first five minutes and before its last five (see [`print_summary`]). What is kept
/// then stays at ten minutes' samples, however long the run.
fn forget_middle(windows: &mut [Window], every: Duration) {
    let five = parts_of(every);
    let Some(phase) = windows.last().map(|w| w.phase) else { return };
    let of: Vec<usize> = (0..windows.len()).filter(|&i| windows[i].phase == phase).collect();
    if of.len() > 2 * five {
        let w = &mut windows[of[of.len() - five - 1]];
        w.claims = Vec::new();
        w.latencies = Vec::new();
    }
}

/// Windows in five minutes.
fn parts_of(every: Duration) -> usize {
    (300.0 / every.as_secs_f64()).ceil() as usize
}

fn print_window(w: &Window, every: Duration) {
    let (claims, e2e) =
        (percentiles_us(w.claims.iter().copied()), percentiles_us(w.latencies.iter().copied()));
    println!(
        "{:>7.0}  {:<5}  {:>9.0}  {:>8.2}  {:>8.2}  {:>8.2}  {:>8.2}  {:>10}  {:>10}  {:>8}",
        w.at,
        w.phase.name(),
        w.handled as f64 / every.as_secs_f64(),
        claims.p50,
        claims.p99,
        e2e.p50,
        e2e.p99,
        opt(w.dead),
        opt(w.size.map(|s| s / 1024)),
        w.rss_kb.map_or_else(|| "-".to_owned(), |r| r.to_string()),
    );
}

/// Each phase's first and last five minutes (or its whole when shorter): handled a
/// second, claim and publish-to-handler percentiles over all their samples, the largest
/// dead rows and size, the resident memory at their end.
fn print_summary(windows: &[Window], every: Duration) {
    let five = parts_of(every);
    println!(
        "phase  part   handled/s  claim50  claim99  e2e50  e2e99  dead (max)  size kB (max)  rss kB (end)"
    );
    for phase in [Phase::Clean, Phase::Held, Phase::After] {
        let of: Vec<&Window> = windows.iter().filter(|w| w.phase == phase).collect();
        if of.is_empty() {
            continue;
        }
        let parts: Vec<(&str, &[&Window])> = if of.len() > five {
            vec![("first", &of[..five]), ("last", &of[of.len() - five..])]
        } else {
            vec![("all", &of[..])]
        };
        for (part, ws) in parts {
            let handled: u64 = ws.iter().map(|w| w.handled).sum();
            let claims = percentiles_us(ws.iter().flat_map(|w| w.claims.iter().copied()));
            let e2e = percentiles_us(ws.iter().flat_map(|w| w.latencies.iter().copied()));
            let dead = ws.iter().filter_map(|w| w.dead).max();
            let size = ws.iter().filter_map(|w| w.size).max();
            println!(
                "{:<5}  {:<5}  {:>9.0}  {:>7.2}  {:>7.2}  {:>5.2}  {:>5.2}  {:>10}  {:>13}  {:>12}",
                phase.name(),
                part,
                handled as f64 / (ws.len() as f64 * every.as_secs_f64()),
                claims.p50,
                claims.p99,
                e2e.p50,
                e2e.p99,
                opt(dead),
                opt(size.map(|s| s / 1024)),
                ws.last().and_then(|w| w.rss_kb).map_or_else(|| "-".to_owned(), |r| r.to_string()),
            );
        }
    }
}

/// Where the dead rows and the size are read: the queue's own relations on PostgreSQL
/// (all its partitions), the server's history list and the table's size on MySQL/MariaDB.
enum Figures {
    Postgres { pool: sqlx::PgPool, table: String, url: String },
    MySql { pool: sqlx::MySqlPool, table: String, url: String },
    Sqlite,
}

impl Figures {
    async fn connect(url: &str, table: &str) -> Result<Figures, rowbus::Error> {
        Ok(match Backend::from_url(url)? {
            Backend::Postgres => Figures::Postgres {
                pool: rowbus::connect::<sqlx::Postgres>(url, 1).await?,
                table: table.to_owned(),
                url: url.to_owned(),
            },
            Backend::MySql => Figures::MySql {
                pool: rowbus::connect::<sqlx::MySql>(url, 1).await?,
                table: table.to_owned(),
                url: url.to_owned(),
            },
            Backend::Sqlite => Figures::Sqlite,
        })
    }

    /// Dead rows and size in bytes, where the database says.
    async fn read(&self) -> (Option<i64>, Option<i64>) {
        match self {
            Figures::Postgres { pool, table, .. } => sqlx::query_as::<_, (i64, i64)>(
                "SELECT COALESCE(sum(s.n_dead_tup), 0)::BIGINT, COALESCE(sum(pg_total_relation_size(s.relid)), 0)::BIGINT \
                 FROM pg_stat_user_tables s WHERE s.relid IN (SELECT relid FROM pg_partition_tree($1::regclass))",
            )
            .bind(table)
            .fetch_one(pool)
            .await
            .map(|(dead, size)| (Some(dead), Some(size)))
            .unwrap_or((None, None)),
            Figures::MySql { pool, table, .. } => {
                let history: Option<i64> = sqlx::query_scalar(
                    "SELECT CAST(`count` AS SIGNED) FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'",
                )
                .fetch_one(pool)
                .await
                .ok();
                let size: Option<i64> = sqlx::query_scalar(
                    "SELECT CAST(data_length + index_length AS SIGNED) FROM information_schema.tables \
                     WHERE table_schema = DATABASE() AND table_name = ?",
                )
                .bind(table)
                .fetch_one(pool)
                .await
                .ok();
                (history, size)
            }
            Figures::Sqlite => (None, None),
        }
    }
}

/// A connection holding the horizon open until dropped (SQLite has no horizon: nothing).
enum Holder {
    Postgres(#[allow(dead_code)] sqlx::PgConnection),
    MySql(#[allow(dead_code)] sqlx::MySqlConnection),
    Nothing,
}

impl Holder {
    async fn hold(figures: &Figures) -> Result<Holder, rowbus::Error> {
        Ok(match figures {
            Figures::Postgres { url, .. } => {
                let mut conn = sqlx::PgConnection::connect(url).await?;
                sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class")
                    .execute(&mut conn)
                    .await?;
                Holder::Postgres(conn)
            }
            Figures::MySql { url, .. } => {
                let mut conn = sqlx::MySqlConnection::connect(url).await?;
                sqlx::raw_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT").execute(&mut conn).await?;
                Holder::MySql(conn)
            }
            Figures::Sqlite => Holder::Nothing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(phase: Phase, n: u32) -> Window {
        Window {
            phase,
            at: 0.0,
            handled: 0,
            claims: vec![n],
            latencies: vec![n],
            dead: None,
            size: None,
            rss_kb: None,
        }
    }

    #[test]
    fn only_the_first_and_last_five_minutes_keep_their_samples() {
        let every = Duration::from_secs(60);
        let mut windows = Vec::new();
        for n in 0..4 {
            windows.push(window(Phase::Clean, n));
            forget_middle(&mut windows, every);
        }
        for n in 0..14 {
            windows.push(window(Phase::Held, n));
            forget_middle(&mut windows, every);
        }
        let kept: Vec<bool> =
            windows.iter().map(|w| !w.claims.is_empty() && !w.latencies.is_empty()).collect();
        // Clean: shorter than ten minutes, all kept. Held: minutes 0-4 and 9-13.
        let mut expected = vec![true; 4];
        expected.extend((0..14).map(|n| !(5..9).contains(&n)));
        assert_eq!(kept, expected);
        assert_eq!(micros(Duration::from_micros(1_500)), 1_500);
        assert_eq!(micros(Duration::from_secs(1 << 40)), u32::MAX);
    }
}
