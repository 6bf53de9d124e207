//! `rowbus bench`: measured figures on the chosen database.

pub mod broker;
pub(crate) mod claim_times;
pub mod horizon;
mod raw_claim;
mod raw_insert;
pub mod workflows;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rowbus::{DbPool, Event, Listener, ListenerOptions, Notifier, NotifyConfig};
use tokio::sync::Mutex;

/// Options of `rowbus bench notify`.
#[derive(Debug, Args)]
pub struct NotifyBench {
    /// Notifications timed one at a time for the latency figures
    #[arg(long, default_value_t = 100)]
    samples: u32,
    /// Notifying connections for the throughput figure
    #[arg(long, default_value_t = 4)]
    notifiers: u32,
    /// How long the notifiers send as fast as they can, e.g. 250ms, 2s, 1m
    #[arg(long, value_name = "DURATION", default_value = "5s",
          value_parser = crate::queue_cmd::positive_duration)]
    duration: Duration,
    /// Print the results as one JSON object
    #[arg(long)]
    json: bool,
    /// Durable notifications and listeners (on PostgreSQL: the notify table woken by
    /// LISTEN); the names are forgotten at the end
    #[arg(long)]
    durable: bool,
    /// How long the listener is watched idle at the end, for what it costs with nothing
    /// sent (its polls and data_version reads; on MySQL/MariaDB with performance_schema,
    /// the rows its connection reads)
    #[arg(long, value_name = "DURATION", default_value = "5s",
          value_parser = crate::queue_cmd::positive_duration)]
    idle: Duration,
    /// Listen without a push path (poll every poll interval, as a listener does where the
    /// server refuses one): the figures to compare with
    #[arg(long)]
    no_push: bool,
}

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

/// Nearest-rank percentiles of `samples`.
pub(crate) fn percentiles(mut samples: Vec<Duration>) -> Percentiles {
    if samples.is_empty() {
        return Percentiles::default();
    }
    samples.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        samples[rank - 1].as_secs_f64() * 1000.0
    };
    Percentiles { p50: at(0.50), p99: at(0.99), max: at(1.0) }
}

/// A small xorshift generator: spacing samples so they fall on every phase of the poll.
pub(crate) struct Jitter(pub(crate) u64);

impl Jitter {
    /// The next value, uniform in [0, 1).
    pub(crate) fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A progress bar of `len` steps labelled `what`.
pub(crate) fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_owned());
    bar
}

/// `rows` (the header first) as aligned lines: each column as wide as its widest cell, two
/// spaces apart, the columns `numeric` says right-aligned; the last cell is not padded.
pub(crate) fn table(rows: &[Vec<String>], numeric: &[usize]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|row| row.get(c)).map(|cell| cell.chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(c, cell)| match (numeric.contains(&c), c + 1 == row.len()) {
                    (true, _) => format!("{cell:>0$}", widths[c]),
                    (false, false) => format!("{cell:<0$}", widths[c]),
                    (false, true) => cell.clone(),
                })
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect()
}

/// A task's result; a panic inside it goes on unwinding here.
pub(crate) async fn joined<T>(task: tokio::task::JoinHandle<T>) -> T {
    match task.await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Runs `bench notify` on `config`'s notify table; `own` when it is the run's own, made for
/// it: dropped at the end, whatever happened, so that the run leaves no rows behind.
pub async fn notify(
    url: &str,
    config: NotifyConfig,
    own: bool,
    args: NotifyBench,
) -> Result<(), rowbus::Error> {
    let db = DbPool::connect_with_size(url, args.notifiers.max(1)).await?;
    let uses_table = args.durable || db.backend() != rowbus::Backend::Postgres;
    let measured = measure(&db, url, &config, own && uses_table, &args).await;
    let dropped = if own && uses_table { db.run(DropNotifyTable { config: &config }).await } else { Ok(()) };
    db.close().await;
    measured?;
    dropped
}

/// Drops the run's own notify table and its positions table.
struct DropNotifyTable<'a> {
    config: &'a NotifyConfig,
}

impl rowbus::OnPool for DropNotifyTable<'_> {
    type Output = Result<(), rowbus::Error>;
    async fn run<DB: rowbus::Db>(self, pool: rowbus::sqlx::Pool<DB>) -> Self::Output
    where
        for<'c> &'c mut DB::Connection: rowbus::sqlx::Executor<'c, Database = DB>,
    {
        let table = &self.config.table;
        for name in [format!("{table}_positions"), table.clone()] {
            let quoted = match DB::BACKEND {
                rowbus::Backend::MySql => format!("`{name}`"),
                _ => format!("\"{name}\""),
            };
            let mut conn = pool.acquire().await?;
            rowbus::sqlx::query(rowbus::sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {quoted}")))
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
}

/// The measurements of `bench notify`, on `db`.
async fn measure(
    db: &DbPool,
    url: &str,
    config: &NotifyConfig,
    own: bool,
    args: &NotifyBench,
) -> Result<(), rowbus::Error> {
    let config = config.clone();
    let notifier = if args.durable {
        db.deploy_durable_notify_table(&config).await?;
        Arc::new(Notifier::durable(config.clone())?)
    } else {
        db.deploy_notify_table(&config).await?;
        Arc::new(Notifier::new(config.clone())?)
    };
    let options =
        ListenerOptions { notify_table: config.clone(), push: !args.no_push, ..ListenerOptions::default() };
    let lease = options.durable_lease;
    let mut listener = Listener::connect_with(url, options).await?;
    let run = format!("bench_{}", std::process::id());
    let (latency_channel, load_channel) = (format!("{run}_latency"), format!("{run}_load"));
    for channel in [&latency_channel, &load_channel] {
        if args.durable {
            listener.listen_durable(channel, &run).await?;
        } else {
            listener.listen(channel).await?;
        }
    }

    // Latency: one notification at a time, spaced at random so they land on every phase
    // of the poll interval (PostgreSQL's LISTEN wakes at once, durable or not).
    let poll = if db.backend() == rowbus::Backend::Postgres { Duration::ZERO } else { config.poll_interval };
    let progress = bar(u64::from(args.samples), "latency");
    let sent_at: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let sender = {
        let (db, notifier, sent_at, channel) =
            (db.clone(), notifier.clone(), sent_at.clone(), latency_channel.clone());
        let samples = args.samples;
        tokio::spawn(async move {
            let mut jitter = Jitter(0x9E37_79B9_7F4A_7C15);
            for i in 0..u64::from(samples) {
                let spacing = Duration::from_millis(5) + poll.mul_f64(0.3 * jitter.next_unit());
                tokio::time::sleep(spacing).await;
                sent_at.lock().await.insert(i, Instant::now());
                db.notify_with(&notifier, &channel, &i.to_string()).await?;
            }
            Ok::<(), rowbus::Error>(())
        })
    };
    let mut latencies = Vec::with_capacity(args.samples as usize);
    let deadline = Duration::from_secs(10) + poll * 3;
    while latencies.len() < args.samples as usize {
        let event = tokio::time::timeout(deadline, listener.recv()).await;
        match event {
            Ok(Ok(Event::Notification(n))) if n.channel == latency_channel => {
                let received = Instant::now();
                let i: u64 = n.payload.parse().unwrap_or(u64::MAX);
                if let Some(sent) = sent_at.lock().await.remove(&i) {
                    latencies.push(received - sent);
                    progress.inc(1);
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => break,
        }
    }
    progress.finish_and_clear();
    joined(sender).await?;
    let lost_samples = u64::from(args.samples) - latencies.len() as u64;
    let latency = percentiles(latencies);

    // Throughput: `notifiers` connections commit one notification each, as fast as they can.
    let before_load = reads(db, &listener).await;
    let sent = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + args.duration;
    let mut senders = Vec::new();
    for _ in 0..args.notifiers {
        let (db, notifier, sent, channel) =
            (db.clone(), notifier.clone(), sent.clone(), load_channel.clone());
        senders.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                db.notify_with(&notifier, &channel, "x").await?;
                sent.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), rowbus::Error>(())
        }));
    }
    let progress = ProgressBar::new_spinner();
    progress.set_message("throughput");
    let started = Instant::now();
    let mut received = 0u64;
    let mut last_received_at = started;
    let mut senders_done = false;
    loop {
        if !senders_done && senders.iter().all(|s| s.is_finished()) {
            senders_done = true;
        }
        let total = sent.load(Ordering::Relaxed);
        if senders_done && received >= total {
            break;
        }
        match tokio::time::timeout(Duration::from_secs(5) + poll * 3, listener.recv()).await {
            Ok(Ok(Event::Notification(n))) if n.channel == load_channel => {
                received += 1;
                last_received_at = Instant::now();
                if received.is_multiple_of(256) {
                    progress.set_message(format!("throughput: {received} received"));
                    progress.tick();
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) if senders_done => break,
            Err(_) => {}
        }
    }
    progress.finish_and_clear();
    for s in senders {
        joined(s).await?;
    }
    let total = sent.load(Ordering::Relaxed);
    let window = args.duration.as_secs_f64();
    let receive_window = (last_received_at - started).as_secs_f64().max(window);
    let after_load = reads(db, &listener).await;
    let per_notification = per(after_load, before_load, received as f64);
    // Idle: nothing sent for a while; what the listener reads meanwhile, per minute.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_from = reads(db, &listener).await;
    tokio::time::sleep(args.idle).await;
    let idle_to = reads(db, &listener).await;
    let idle_per_minute = per(idle_to, idle_from, args.idle.as_secs_f64() / 60.0);
    let wake = listener.wake_stats();
    let wake_path = match &wake.path {
        rowbus::WakePath::Listen => "LISTEN".to_owned(),
        rowbus::WakePath::Pushed { via } => format!("pushed by {via}"),
        rowbus::WakePath::Polling { reason } => format!("polling: {reason}"),
        rowbus::WakePath::Connecting => "connecting".to_owned(),
        other => format!("{other:?}"),
    };
    if args.durable {
        for channel in [&latency_channel, &load_channel] {
            listener.unlisten(channel).await?;
            db.run(Forget { config: &config, channel, name: &run, lease }).await?;
        }
    }
    drop(listener);

    let notify_table =
        (db.backend() != rowbus::Backend::Postgres || args.durable).then_some(config.table.as_str());
    let results = serde_json::json!({
        "backend": db.backend().name(),
        "durable": args.durable,
        "notify_table": notify_table,
        "notify_table_dropped": own,
        "poll_interval_ms": poll.as_secs_f64() * 1000.0,
        "latency_samples": args.samples,
        "latency_lost": lost_samples,
        "latency_p50_ms": latency.p50,
        "latency_p99_ms": latency.p99,
        "latency_max_ms": latency.max,
        "notifiers": args.notifiers,
        "sent": total,
        "received": received,
        "sent_per_s": total as f64 / window,
        "received_per_s": received as f64 / receive_window,
        "all_received": received == total,
        "receive_window_s": receive_window,
        "wake_path": wake_path,
        "reads_per_notification": per_notification,
        "idle_reads_per_minute": idle_per_minute,
    });
    if args.json {
        println!("{results}");
    } else {
        let rows = vec![
            ["backend", "poll ms", "p50 ms", "p99 ms", "max ms", "sent/s", "recv/s", "all recv"]
                .map(str::to_owned)
                .to_vec(),
            vec![
                db.backend().name().to_owned(),
                format!("{:.0}", poll.as_secs_f64() * 1000.0),
                format!("{:.1}", latency.p50),
                format!("{:.1}", latency.p99),
                format!("{:.1}", latency.max),
                format!("{:.0}", total as f64 / window),
                format!("{:.0}", received as f64 / receive_window),
                (if received == total { "yes" } else { "NO" }).to_owned(),
            ],
        ];
        for line in table(&rows, &[1, 2, 3, 4, 5, 6]) {
            println!("{line}");
        }
        println!(
            "sent/s over the {:.1} s of sending; recv/s until the last arrived ({:.1} s); all recv: every \
             notification sent was received by the end",
            window, receive_window
        );
        println!("wake-ups: {wake_path}");
        println!("read per notification received: {per_notification}; idle, per minute: {idle_per_minute}");
        if poll > Duration::ZERO && matches!(wake.path, rowbus::WakePath::Polling { .. }) {
            println!(
                "the listener polls the notify table every {:.0} ms: a notification waits for the next poll, \
                 so the latency is about half of that at p50 and up to all of it (the broker polls every \
                 50 ms, the default here; --poll-interval sets it)",
                poll.as_secs_f64() * 1000.0
            );
        }
        match (notify_table, own) {
            (Some(table), true) => println!("notify table `{table}`: the run's own, dropped at the end"),
            (Some(table), false) => println!(
                "notify table `{table}` (--notify-table): the run's notifications stay in it until its cleanup"
            ),
            (None, _) => {}
        }
        if lost_samples > 0 {
            println!("{lost_samples} latency samples never arrived");
        }
    }
    Ok(())
}

/// `Handler_read%` of MySQL/MariaDB connection `id` (performance_schema's
/// `status_by_thread`): the rows and index entries it read. `None` elsewhere, or where
/// performance_schema is off.
async fn handler_reads(db: &DbPool, id: u64) -> Option<u64> {
    let DbPool::MySql(pool) = db else { return None };
    let on: i64 = rowbus::sqlx::query_scalar("SELECT @@performance_schema").fetch_one(pool).await.ok()?;
    if on == 0 {
        return None;
    }
    let sql = "SELECT CAST(COALESCE(SUM(s.VARIABLE_VALUE), 0) AS SIGNED) FROM performance_schema.status_by_thread s \
               JOIN performance_schema.threads t ON t.THREAD_ID = s.THREAD_ID \
               WHERE t.PROCESSLIST_ID = ? AND s.VARIABLE_NAME LIKE 'Handler_read%'";
    let reads: i64 =
        rowbus::sqlx::query_scalar(sql).bind(i64::try_from(id).ok()?).fetch_one(pool).await.ok()?;
    u64::try_from(reads).ok()
}

/// What a listener read between two looks: its polls, `data_version` reads and (MySQL
/// with performance_schema) its connection's `Handler_read%`.
#[derive(Debug, Clone, Copy)]
struct Reads {
    polls: u64,
    versions: u64,
    handler: Option<u64>,
}

async fn reads(db: &DbPool, listener: &Listener) -> Reads {
    let stats = listener.wake_stats();
    let handler = match listener.session_id() {
        Some(id) => handler_reads(db, id).await,
        None => None,
    };
    Reads { polls: stats.polls, versions: stats.version_checks, handler }
}

/// `after - before`, per `per`.
fn per(after: Reads, before: Reads, per: f64) -> serde_json::Value {
    let per = per.max(f64::MIN_POSITIVE);
    serde_json::json!({
        "polls": (after.polls - before.polls) as f64 / per,
        "data_version_reads": (after.versions - before.versions) as f64 / per,
        "handler_reads": after.handler.zip(before.handler).map(|(a, b)| a.saturating_sub(b) as f64 / per),
    })
}

/// Forgets a durable name of the run.
struct Forget<'a> {
    config: &'a NotifyConfig,
    channel: &'a str,
    name: &'a str,
    lease: Duration,
}

impl rowbus::OnPool for Forget<'_> {
    type Output = Result<bool, rowbus::Error>;
    async fn run<DB: rowbus::Db>(self, pool: rowbus::sqlx::Pool<DB>) -> Self::Output {
        rowbus::durable::forget_durable_listener(&pool, self.config, self.channel, self.name, self.lease)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_rank() {
        let ms = |v: u64| Duration::from_millis(v);
        let p = percentiles((1..=100).map(ms).collect());
        assert_eq!((p.p50, p.p99, p.max), (50.0, 99.0, 100.0));
        let p = percentiles(vec![ms(7)]);
        assert_eq!((p.p50, p.p99, p.max), (7.0, 7.0, 7.0));
    }

    #[test]
    fn table_columns_fit_their_widest_cells() {
        let rows: Vec<Vec<String>> = [["a", "n", "last"], ["a long label", "1,234", "x"], ["b", "5", ""]]
            .iter()
            .map(|row| row.map(str::to_owned).to_vec())
            .collect();
        assert_eq!(
            table(&rows, &[1]),
            ["a                 n  last", "a long label  1,234  x", "b                 5"]
        );
    }

    #[test]
    fn jitter_stays_in_the_unit_interval() {
        let mut j = Jitter(1);
        assert!((0..1000).map(|_| j.next_unit()).all(|u| (0.0..1.0).contains(&u)));
    }
}
