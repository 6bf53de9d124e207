//! `rowbus demo`: a queue at work in a few seconds, with nothing to set up. Deploys a table
//! of its own, consumes it with several workers woken by `listen_notify`, publishes a
//! steady stream from several publishers, makes 1% of the messages fail once, and checks
//! at the end that every published message was handled exactly once. The table is
//! dropped at the end.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use indicatif::MultiProgress;
use rowbus::sqlx::Pool;
use rowbus::{
    Broker, BrokerOptions, Db, Delivery, Message, NotifyConfig, Queue, QueueTable, RetryPolicy, redact,
};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::bench::{bar, percentiles};
use crate::cli_error::CliError;
use crate::queue_cmd::{self, human, outln, thousands};

/// One message in this many fails its first attempt on purpose.
const FAIL_ONE_IN: u64 = 100;
/// How often a publisher publishes what is due (as one batch).
const TICK: Duration = Duration::from_millis(20);
/// How long the demo waits for the last messages once nothing moves any more.
const STALL: Duration = Duration::from_secs(30);

/// Options of `rowbus demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Messages to publish, all publishers together
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    messages: u64,
    /// Messages per second, all publishers together
    #[arg(long, value_name = "R", default_value_t = 1000.0, value_parser = parse_rate)]
    rate: f64,
    /// Publishing tasks
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    publishers: u64,
    /// Handlers running at once
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,
}

/// A rate as clap parses it: a positive, finite number.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!("`{text}` is not a positive number of messages per second")),
    }
}

/// Microseconds since the Unix epoch, on this process's clock.
fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// What the handlers saw.
#[derive(Debug, Default)]
struct Seen {
    /// Sequence numbers handled (successfully) at least once.
    handled: HashSet<u64>,
    /// Successful handlings of a sequence number already handled.
    duplicates: u64,
    /// Publish-to-handler latencies of messages handled on their first attempt.
    first_attempt: Vec<Duration>,
    /// Publish-to-handler latencies of messages handled after a retry.
    retried: Vec<Duration>,
    /// Payloads that were not the demo's (never expected).
    garbled: u64,
}

/// What every handler and publisher shares.
#[derive(Debug, Default)]
struct State {
    /// The handlers' records.
    seen: Mutex<Seen>,
    /// Successful handlings.
    handled: AtomicU64,
    /// Messages published.
    published: AtomicU64,
    /// First attempts failed on purpose.
    failed_on_purpose: AtomicU64,
    /// Tells the publishers to stop.
    stop: AtomicBool,
    /// When the last message was handled, in µs since the Unix epoch.
    last_handled_us: AtomicU64,
}

impl State {
    /// The handlers' records, locked.
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The handler: checks the payload, fails 1% of first attempts on purpose, records the
/// rest.
async fn handle<DB: rowbus::Db>(state: Arc<State>, d: Delivery<DB>) -> Result<(), String> {
    let received = now_us();
    let payload: serde_json::Value = d.json().map_err(|e| e.to_string())?;
    let (Some(seq), Some(sent)) = (payload["seq"].as_u64(), payload["sent_at_us"].as_u64()) else {
        state.seen().garbled += 1;
        return Ok(());
    };
    if seq % FAIL_ONE_IN == FAIL_ONE_IN / 2 && d.attempt() == 1 {
        state.failed_on_purpose.fetch_add(1, Ordering::Relaxed);
        return Err("failing once on purpose (rowbus demo)".to_owned());
    }
    let latency = Duration::from_micros(received.saturating_sub(sent));
    {
        let mut seen = state.seen();
        if !seen.handled.insert(seq) {
            seen.duplicates += 1;
        }
        if d.attempt() == 1 { seen.first_attempt.push(latency) } else { seen.retried.push(latency) }
    }
    state.handled.fetch_add(1, Ordering::Relaxed);
    state.last_handled_us.store(now_us(), Ordering::Relaxed);
    Ok(())
}

/// Publisher `p` of `n`: sequence numbers `p, p + n, p + 2n, ...` below `total`, at
/// `rate` messages per second, a batch per tick.
async fn publisher<DB: Db>(
    queue: Queue<DB>,
    state: Arc<State>,
    (p, n, total): (u64, u64, u64),
    rate: f64,
    started: Instant,
) -> Result<(), rowbus::Error> {
    let mine = total / n + u64::from(p < total % n);
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(TICK);
    while sent < mine && !state.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(mine);
        if due <= sent {
            continue;
        }
        let count = (due - sent).min(1000);
        let at = now_us();
        let batch = (sent..sent + count).map(|i| {
            let seq = p + i * n;
            Message::text(json!({"seq": seq, "publisher": p, "sent_at_us": at}).to_string())
        });
        let published = queue.publish_batch(batch).await?;
        state.published.fetch_add(published.stored, Ordering::Relaxed);
        sent += count;
    }
    Ok(())
}

/// Runs the demo on `pool`.
pub(crate) async fn demo<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    args: DemoArgs,
) -> Result<(), CliError> {
    let table: QueueTable = format!("demo_{}", std::process::id()).parse()?;
    let options = BrokerOptions {
        listen_notify: true,
        notify_table: queue_cmd::broker_notify_config(config),
        listen_url: crate::listen_url(url),
        retry: RetryPolicy {
            max_attempts: 5,
            base: Duration::from_millis(100),
            factor: 2.0,
            max_delay: Duration::from_secs(2),
        },
        ..BrokerOptions::default()
    };
    let broker = Broker::new(pool, options).await?;
    let queue = broker.queue(table.channel())?;
    let backend = DB::BACKEND.name();
    let secs = args.messages as f64 / args.rate;
    outln!("rowbus demo on {backend} ({})", redact(url));
    outln!("  queue table `{table}` (dropped at the end), {} workers woken by listen_notify", args.workers);
    outln!(
        "  {} publishers: {} messages at {}/s (about {}); 1 in {FAIL_ONE_IN} fails once on purpose",
        args.publishers,
        thousands(args.messages),
        thousands(args.rate.round() as u64),
        human(Duration::from_secs_f64(secs))
    );
    let deployed = queue.deploy().await;
    let result = match deployed {
        Ok(()) => run(&broker, &queue, &args).await,
        Err(e) => Err(e.into()),
    };
    broker.shutdown(Duration::from_secs(5)).await;
    let dropped = queue.undeploy().await;
    let summary = result?;
    dropped?;
    summary.print()
}

/// The figures the demo ends with.
struct Summary {
    /// Messages the demo set out to publish.
    total: u64,
    /// Messages published (their INSERTs returned).
    published: u64,
    /// Successful handlings, duplicates included.
    handled: u64,
    /// Distinct messages handled successfully.
    distinct: u64,
    /// Successful handlings of a message already handled.
    duplicates: u64,
    /// Payloads that were not the demo's.
    garbled: u64,
    /// Messages still in the table at the end.
    waiting: i64,
    /// Messages in the dead-letter table at the end.
    dead: i64,
    /// First attempts failed on purpose.
    failed_on_purpose: u64,
    /// Retries the broker scheduled.
    retries: u64,
    /// Messages the broker dead-lettered.
    dead_lettered: u64,
    /// From the first publish to the last handling.
    elapsed: Duration,
    /// The publishers' pace, messages/s (`--rate`).
    rate: f64,
    /// Publish-to-handler latencies of first attempts.
    first_attempt: Vec<Duration>,
    /// Publish-to-handler latencies of messages handled after a retry.
    retried: Vec<Duration>,
    /// Whether Ctrl-C ended the run.
    interrupted: bool,
    /// Whether the run ended because nothing moved any more.
    stalled: bool,
}

/// Consumes, publishes and shows progress until every message is handled, the run
/// stalls or Ctrl-C; then stops everything and counts.
async fn run<DB: Db>(broker: &Broker<DB>, queue: &Queue<DB>, args: &DemoArgs) -> Result<Summary, CliError> {
    let mut interrupted = std::pin::pin!(crate::interrupted());
    if futures::poll!(interrupted.as_mut()).is_ready() {
        return Err(CliError::Message("interrupted".to_owned()));
    }
    let state = Arc::new(State::default());
    let runner = {
        let state = state.clone();
        tokio::spawn(
            queue
                .subscribe()
                .workers(args.workers as usize)
                .shutdown_timeout(Duration::from_secs(5))
                .run(move |d| handle(state.clone(), d)),
        )
    };
    let started = Instant::now();
    let started_us = now_us();
    let mut publishers: Vec<JoinHandle<Result<(), rowbus::Error>>> = (0..args.publishers)
        .map(|p| {
            let share = args.rate / args.publishers as f64;
            let spec = (p, args.publishers, args.messages);
            tokio::spawn(publisher(queue.clone(), state.clone(), spec, share, started))
        })
        .collect();

    let progress = MultiProgress::new();
    let published_bar = progress.add(bar(args.messages, "published"));
    let handled_bar = progress.add(bar(args.messages, "handled"));
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let (mut interrupted_now, mut stalled, mut failure) = (false, false, None);
    let mut last_moved = (0u64, Instant::now());
    loop {
        tokio::select! {
            _ = &mut interrupted => { interrupted_now = true; break }
            _ = tick.tick() => {}
        }
        let (published, handled) =
            (state.published.load(Ordering::Relaxed), state.handled.load(Ordering::Relaxed));
        let rate = |n: u64| n as f64 / started.elapsed().as_secs_f64().max(0.001);
        published_bar.set_position(published);
        published_bar.set_message(format!("{:.0} msgs/s", rate(published)));
        handled_bar.set_position(handled);
        handled_bar.set_message(format!("{:.0} msgs/s", rate(handled)));
        // A publisher that failed ends the demo.
        if let Some(i) = publishers.iter().position(JoinHandle::is_finished) {
            match publishers.swap_remove(i).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    failure = Some(CliError::from(e));
                    break;
                }
                Err(e) => {
                    failure = Some(CliError::Message(format!("a publisher stopped: {e}")));
                    break;
                }
            }
        }
        let distinct = state.seen().handled.len() as u64;
        if publishers.is_empty() && distinct >= published {
            break;
        }
        if handled != last_moved.0 || !publishers.is_empty() {
            last_moved = (handled, Instant::now());
        } else if last_moved.1.elapsed() > STALL {
            stalled = true;
            break;
        }
    }
    published_bar.finish_and_clear();
    handled_bar.finish_and_clear();
    state.stop.store(true, Ordering::Relaxed);
    for p in publishers {
        if let Ok(Err(e)) = p.await
            && failure.is_none()
        {
            failure = Some(e.into());
        }
    }
    broker.shutdown(Duration::from_secs(5)).await;
    let _ = runner.await;
    if let Some(failure) = failure {
        return Err(failure);
    }
    let (waiting, dead) = queue.depth("").await?;
    let stats = broker.stats();
    let mut seen = std::mem::take(&mut *state.seen());
    let last = state.last_handled_us.load(Ordering::Relaxed);
    Ok(Summary {
        total: args.messages,
        published: state.published.load(Ordering::Relaxed),
        handled: state.handled.load(Ordering::Relaxed),
        distinct: seen.handled.len() as u64,
        duplicates: seen.duplicates,
        garbled: seen.garbled,
        waiting,
        dead,
        failed_on_purpose: state.failed_on_purpose.load(Ordering::Relaxed),
        retries: stats.retried,
        dead_lettered: stats.dead_lettered,
        elapsed: Duration::from_micros(last.saturating_sub(started_us)),
        rate: args.rate,
        first_attempt: std::mem::take(&mut seen.first_attempt),
        retried: std::mem::take(&mut seen.retried),
        interrupted: interrupted_now,
        stalled,
    })
}

impl Summary {
    /// Prints the summary table and the verdict.
    fn print(self) -> Result<(), CliError> {
        let row = |label: &str, value: String, note: &str| {
            let note = if note.is_empty() { String::new() } else { format!("   {note}") };
            queue_cmd::out(&format!("  {label:<20} {value:>12}{note}"))
        };
        outln!();
        if self.interrupted {
            outln!("interrupted: the summary so far");
        }
        let not_all =
            if self.published < self.total { format!("of {}", thousands(self.total)) } else { String::new() };
        row("messages published", thousands(self.published), &not_all)?;
        row("messages handled", thousands(self.distinct), "")?;
        let secs = self.elapsed.as_secs_f64();
        let throughput = if secs > 0.0 { self.handled as f64 / secs } else { 0.0 };
        row(
            "handled rate",
            format!("{throughput:.0} msgs/s"),
            &format!(
                "over {}, paced by --rate {:.0}/s: not a ceiling (`rowbus bench broker` measures that)",
                human(self.elapsed),
                self.rate
            ),
        )?;
        let first = percentiles(self.first_attempt);
        let ms = |v: f64| format!("{v:.1} ms");
        row("latency p50", ms(first.p50), "publish -> handler, first attempts")?;
        row("latency p99", ms(first.p99), "")?;
        row("latency max", ms(first.max), "")?;
        let retried_note = if self.retried.is_empty() {
            format!("{} failed once on purpose", thousands(self.failed_on_purpose))
        } else {
            let r = percentiles(self.retried);
            format!(
                "{} failed once on purpose; handled on a later attempt after {} (p50)",
                thousands(self.failed_on_purpose),
                ms(r.p50)
            )
        };
        row("retries", thousands(self.retries), &retried_note)?;
        row("dead letters", thousands(self.dead_lettered), "")?;
        outln!();

        let missing = self.published.saturating_sub(self.distinct);
        let verified = self.distinct == self.published
            && self.duplicates == 0
            && self.garbled == 0
            && self.waiting == 0
            && self.dead == 0;
        let waiting = u64::try_from(self.waiting).unwrap_or(0);
        let accounted = self.distinct + waiting == self.published
            && self.duplicates == 0
            && self.garbled == 0
            && self.dead == 0;
        if verified {
            outln!("nothing lost: every published message was handled exactly once");
        } else if accounted && self.interrupted {
            outln!(
                "nothing lost so far: {} published messages handled exactly once, the other {} still \
                 waiting when interrupted (dropped with the demo table)",
                thousands(self.distinct),
                thousands(waiting)
            );
        } else {
            if missing > 0 {
                let why = if self.interrupted {
                    "interrupted before they were handled"
                } else if self.stalled {
                    "nothing was handled for 30 s"
                } else {
                    "unexplained"
                };
                outln!(
                    "NOT VERIFIED: {} published messages were not handled ({why}); {} were still in the \
                     table and {} dead-lettered when it was dropped",
                    thousands(missing),
                    thousands(waiting),
                    self.dead
                );
            }
            if self.duplicates > 0 {
                outln!("NOT VERIFIED: {} messages were handled more than once", thousands(self.duplicates));
            }
            if self.garbled > 0 {
                outln!("NOT VERIFIED: {} payloads were not the demo's", thousands(self.garbled));
            }
            if missing == 0 && self.duplicates == 0 && self.garbled == 0 {
                outln!(
                    "NOT VERIFIED: every published message was handled once, but the table still held {} \
                     and its dead-letter table {}",
                    self.waiting,
                    self.dead
                );
            }
        }
        Ok(())
    }
}
