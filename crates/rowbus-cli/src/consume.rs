//! `rowbus consume TABLE`: print (or run a command on) each message, until Ctrl-C.

use std::collections::HashSet;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use rowbus::sqlx::Pool;
use rowbus::{Broker, BrokerOptions, Db, Delivery, NotifyConfig, RetryPolicy};
use tokio::sync::watch;

use crate::cli_error::CliError;
use crate::exec::{Ran, SNOOZE_STATUS, execute};
use crate::group::{KILL_WAIT, Reaper};
use crate::queue_cmd::{self, duration, positive_duration};

/// What `rowbus consume --help` adds about the global flags.
pub(crate) const AFTER_HELP: &str = "\
For consume, --poll-interval DURATION is the longest wait between two claims when nothing wakes \
the consumer [default: 1s]. Publishes of `rowbus publish` wake a consumer started with \
--listen-notify at once (the notify table, when used, is then polled every 50ms). Durations \
are 250ms, 2s, 1m, 1h, 7d or plain seconds.

An --exec command that exits with status 75 (EX_TEMPFAIL, \"try again later\") snoozes its message: \
it runs again after --snooze [default: 60s] as the same attempt (not counted against \
--max-attempts, its last error unchanged), and `rowbus stats` counts it as snoozed.

An --exec command the shell cannot run (exit status 127, command not found; 126, not \
executable) is a mistake in --exec rather than in the message: the consumer gives the message \
back (its attempt not counted) and stops with one line saying so, instead of retrying and \
dead-lettering every message. A script that may itself exit 127 or 126 should exit with \
another status (1) for a failure of its own.

A paused queue or group (`rowbus pause`) is said once on stderr, and again when it is resumed. \
A closed stdout (`rowbus consume Q | head -1`) ends the consumer quietly with status 0, as it \
does `rowbus listen`: the message that could not be written is given back.";

/// Options of `rowbus consume`.
#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// The queue table (create it with `rowbus deploy --queue TABLE`)
    pub(crate) table: String,
    /// Consume this group's messages [default: the default group]
    #[arg(long, value_name = "G", default_value = "", hide_default_value = true)]
    group: String,
    /// Messages handled at once
    #[arg(long, value_name = "N", default_value_t = 1, conflicts_with = "batch",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    workers: u32,
    /// Most messages held claimed ahead of the workers, as many as they are expected to
    /// finish in 10-100 ms [default: 1000; 0: one per free worker]
    #[arg(long, value_name = "N", conflicts_with = "batch",
          value_parser = clap::value_parser!(u32).range(0..=10_000))]
    claim_ahead: Option<u32>,
    /// Claim up to N messages at a time, handle them in order and acknowledge them in one
    /// statement
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch: Option<u32>,
    /// Run `sh -c CMD` per message with the payload on stdin (and ROWBUS_TABLE,
    /// ROWBUS_GROUP, ROWBUS_ID, ROWBUS_ATTEMPT set, and TRACEPARENT and TRACESTATE when its
    /// publisher was traced): exit status 0 acknowledges it, 75 (EX_TEMPFAIL) snoozes it
    /// (back after --snooze, the attempt not counted), 127 or 126 (no such command, not
    /// executable) stops the consumer with the message given back, any other fails the
    /// attempt (retried with backoff, then dead-lettered; when the dead-letter table cannot
    /// take it, it is said so and the message runs again). It runs in a process group of its own: the
    /// attempt ends when the command exits, and what it left running in its group is then
    /// stopped (SIGTERM, SIGKILL after --grace); should rowbus die, its commands are
    /// stopped likewise. The command's output is rowbus's; messages are not printed
    #[arg(long, value_name = "CMD", conflicts_with = "json")]
    exec: Option<String>,
    /// Print JSON lines {"id", "group", "payload", "attempt", "priority", "key", "headers"}
    /// (a payload that is not UTF-8 is null, with its bytes in "payload_hex"; the default
    /// group is "") instead of `ID GROUP PAYLOAD`: the default group shows as -, the payload
    /// as published but for line feeds, carriage returns and other control characters
    /// (tabs aside), written \n, \r, \u{1b}, and bytes that are not UTF-8, written \xff
    #[arg(long)]
    json: bool,
    /// Be woken by publishers in other processes at once rather than at the next poll
    /// (PostgreSQL LISTEN/NOTIFY, or the notify table `rowbus deploy` creates)
    #[arg(long)]
    listen_notify: bool,
    /// Attempts before a failing message goes to the dead-letter table
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: u32,
    /// Wait before a failed message runs again, e.g. 250ms, 2s, 1m; doubles with each
    /// further failure
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = duration)]
    retry_delay: Duration,
    /// How long a message an --exec command snoozes (exit status 75) waits before it runs
    /// again, e.g. 30s, 5m: its attempt is not counted, so --max-attempts is not used up
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration, requires = "exec")]
    snooze: Duration,
    /// How long a claimed message stays with this consumer, e.g. 30s, 5m (a running
    /// --exec command's lease is extended as it goes)
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = positive_duration)]
    lease: Duration,
    /// How long handlers in flight get to finish after Ctrl-C (or SIGTERM), e.g. 250ms, 2s,
    /// 1m; past it they are stopped (an --exec command's process group killed) and their
    /// messages given back. A second Ctrl-C stops them at once
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    shutdown_timeout: Duration,
    /// How long a handler may run on a message without a timeout of its own (`publish
    /// --timeout`), e.g. 30s, 5m: past it, it is stopped as a cancel stops it (--exec:
    /// SIGTERM, then SIGKILL after --grace) and the attempt fails with "timed out after
    /// ..." (retried, then dead-lettered) [default: none]
    #[arg(long, value_name = "DURATION", value_parser = positive_duration, conflicts_with = "batch")]
    timeout: Option<Duration>,
    /// How long a handler told to stop (its message cancelled with `rowbus cancel`, or its
    /// timeout reached) gets before it is dropped: an --exec command's process group gets
    /// SIGTERM at once and SIGKILL after this, and the attempt ends once none of it is left
    /// (as for what a command that exited left running)
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    grace: Duration,
    /// Extend the leases of the messages being handled every third of --lease, in one
    /// statement for all of them: a handler may run longer than its lease, and a consumer
    /// that dies loses its messages within one lease
    #[arg(long)]
    heartbeat: bool,
    /// Do not publish the queue's scheduled ticks (`rowbus schedule`) from this consumer;
    /// by default every consumer does, and each tick goes out once whatever their number
    #[arg(long)]
    no_schedules: bool,
}

impl ConsumeArgs {
    /// Connections for the pool: one per worker (settling takes one), plus the claims'.
    pub(crate) fn pool_size(&self) -> u32 {
        (self.workers + 2).min(32)
    }
}

/// Why the consumer stops before being interrupted.
#[derive(Debug, Clone)]
enum Stop {
    /// Whatever read stdout went away (`| head`): a quiet end, as for `listen`.
    OutputClosed,
    /// An error that stops it.
    Error(String),
}

/// Why the consumer stops before being interrupted: the first reason.
#[derive(Debug, Clone)]
struct Fatal(
    /// The first reason, once there is one.
    watch::Sender<Option<Stop>>,
);

impl Fatal {
    /// No reason yet.
    fn new() -> Self {
        Fatal(watch::Sender::new(None))
    }

    /// Records a failed write to stdout: a closed pipe ends quietly, anything else is an
    /// error.
    fn write_failed(&self, error: &std::io::Error) {
        self.stop(match error.kind() {
            std::io::ErrorKind::BrokenPipe => Stop::OutputClosed,
            _ => Stop::Error(format!("cannot write to stdout: {error}")),
        });
    }

    /// Records `reason` unless an earlier one is recorded.
    fn stop(&self, reason: Stop) {
        self.0.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(reason);
                true
            } else {
                false
            }
        });
    }

    /// Whether a reason is recorded.
    fn is_set(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Resolves with the first reason.
    async fn wait(&self) -> Stop {
        let mut rx = self.0.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(slot) => slot.clone().unwrap_or(Stop::Error(String::new())),
            Err(_) => Stop::Error(String::new()),
        }
    }
}

/// What every handler shares.
pub(crate) struct Shared {
    /// `--json`.
    json: bool,
    /// `--exec CMD`.
    pub(crate) exec: Option<String>,
    /// Where a handler reports an error that stops the consumer.
    fatal: Fatal,
    /// Set when the consumer is stopping: a command killed meanwhile gives its message back.
    pub(crate) stopping: AtomicBool,
    /// The lease a running command's message is extended by (none with `--heartbeat`: the
    /// runner extends it).
    pub(crate) lease: Option<Duration>,
    /// The broker's retry policy, to say what comes after a failure.
    retry: RetryPolicy,
    /// `--snooze`: how long a message the command snoozes waits.
    snooze: Duration,
    /// `--grace`: between SIGTERM and SIGKILL to a command's process group.
    pub(crate) grace: Duration,
    /// Stops the commands' process groups should this process die without doing so.
    pub(crate) reaper: Option<Reaper>,
}

/// One delivery as a line: `ID GROUP PAYLOAD` (the payload as published, but for line
/// breaks and control characters: [`queue_cmd::bytes_on_one_line`]), or JSON.
fn render<DB: Db>(d: &Delivery<DB>, json: bool) -> String {
    if json {
        let mut value = serde_json::json!({
            "id": d.id(),
            "group": d.group(),
            "attempt": d.attempt(),
            "priority": d.priority(),
            "key": d.key(),
            "headers": d.headers(),
        });
        queue_cmd::json_payload(&mut value, d.payload());
        value.to_string()
    } else {
        let group = queue_cmd::group_text(d.group());
        format!("{} {group} {}", d.id(), queue_cmd::bytes_on_one_line(d.payload()))
    }
}

/// Writes `text` to stdout at once.
fn write_out(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Runs until Ctrl-C/SIGTERM, then shuts the broker down gracefully.
pub(crate) async fn consume<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    args: ConsumeArgs,
) -> Result<(), CliError> {
    // The name first, so that a bad one is reported before connecting the listener.
    queue_cmd::parse_tables(std::slice::from_ref(&args.table))?;
    rowbus::limits::check_group(&args.group)?;
    let retry =
        RetryPolicy { max_attempts: args.max_attempts, base: args.retry_delay, ..RetryPolicy::default() };
    // `--poll-interval` is the subscription's here; the notify table that wakes it is
    // polled at the broker's fast default.
    let poll = config.poll_interval;
    let notify_table =
        NotifyConfig { poll_interval: BrokerOptions::default().notify_table.poll_interval, ..config.clone() };
    let options = BrokerOptions {
        poll_interval: poll,
        lease: args.lease,
        retry: retry.clone(),
        listen_notify: args.listen_notify,
        notify_table,
        listen_url: crate::listen_url(url),
        run_schedules: !args.no_schedules,
        ..BrokerOptions::default()
    };
    let broker = Broker::new(pool, options).await?;
    let result = run(&broker, url, retry, args).await;
    // (Already shut down on the normal path; this closes the listener on an early error.)
    broker.shutdown(Duration::ZERO).await;
    result
}

/// Consumes until interrupted (or a fatal error), then shuts the broker down.
async fn run<DB: Db>(
    broker: &Broker<DB>,
    url: &str,
    retry: RetryPolicy,
    args: ConsumeArgs,
) -> Result<(), CliError> {
    let queue = queue_cmd::existing_queue(broker, &args.table, url).await?;
    let notify_table = &broker.options().notify_table;
    if args.listen_notify && !broker.notify_ready(notify_table).await? {
        return Err(rowbus::Error::MissingNotifyTable { table: notify_table.table.clone() }.into());
    }
    let mut interrupted = std::pin::pin!(crate::interrupted());
    // Install the signal handlers (on first poll) before announcing anything.
    if futures::poll!(interrupted.as_mut()).is_ready() {
        return Ok(());
    }
    let shared = Arc::new(Shared {
        json: args.json,
        exec: args.exec.clone(),
        fatal: Fatal::new(),
        stopping: AtomicBool::new(false),
        lease: (!args.heartbeat).then_some(args.lease),
        retry,
        snooze: args.snooze,
        grace: args.grace,
        reaper: args.exec.as_ref().and_then(|_| Reaper::start(args.grace)),
    });
    let builder = queue
        .subscribe()
        .group(args.group.clone())
        .poll_interval(broker.options().poll_interval)
        .lease(args.lease)
        .shutdown_timeout(args.shutdown_timeout)
        .grace(runner_grace(&args))
        .heartbeat(args.heartbeat);
    let builder = match args.timeout {
        Some(timeout) => builder.timeout(timeout),
        None => builder,
    };
    let (mut runner, mode) = match args.batch {
        Some(n) => {
            let shared = shared.clone();
            let runner = tokio::spawn(
                builder.batch(n as usize).run_batch(move |batch| handle_batch(shared.clone(), batch)),
            );
            (runner, format!("batches of up to {n}"))
        }
        None => {
            let shared = shared.clone();
            let mut builder = builder.workers(args.workers as usize);
            if let Some(most) = args.claim_ahead {
                builder = builder.claim_ahead(most as usize);
            }
            let runner = tokio::spawn(builder.run(move |d| handle_one(shared.clone(), d)));
            (runner, format!("{} worker{}", args.workers, if args.workers == 1 { "" } else { "s" }))
        }
    };
    let group = if args.group.is_empty() {
        "the default group".to_owned()
    } else {
        format!("group {:?}", args.group)
    };
    eprintln!("rowbus: consuming `{}` ({group}, {mode}); Ctrl-C stops", queue.table());

    // The runner ends by itself only when it cannot start (an invalid group, say). Failing
    // claims are retried by the broker: say why (each reason once) and how often, rather
    // than stall silently; one that retrying cannot mend (a missing table, a refused
    // privilege) stops the consumer.
    let mut check = tokio::time::interval(Duration::from_secs(5));
    let mut claim_errors = 0;
    let mut failures = broker.claim_failures();
    let mut reasons = HashSet::new();
    let mut pause = PauseNotice::default();
    let mut pause_check = tokio::time::interval(PAUSE_CHECK);
    let outcome = loop {
        tokio::select! {
            _ = pause_check.tick() => pause.check(&queue, &args.group).await,
            _ = &mut interrupted => break Ok(()),
            stop = shared.fatal.wait() => break Err(match stop {
                Stop::OutputClosed => CliError::OutputClosed,
                Stop::Error(message) => CliError::Message(message),
            }),
            ended = &mut runner => break match ended {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => return Err(e.into()),
                Err(e) => Err(CliError::Message(format!("the consumer stopped unexpectedly: {e}"))),
            },
            Ok(()) = failures.changed() => {
                let Some(failure) = failures.borrow_and_update().clone() else { continue };
                if failure.permanent {
                    break Err(CliError::Message(format!(
                        "cannot claim from `{}`: {} (retrying cannot mend this)",
                        failure.table, failure.error
                    )));
                }
                if reasons.insert(failure.error.clone()) {
                    eprintln!("rowbus: warning: a claim failed: {}; retrying", failure.error);
                }
            }
            _ = check.tick() => {
                let now = broker.stats().claim_errors;
                if now > claim_errors {
                    eprintln!("rowbus: warning: {} claims failed in the last 5 s; retrying", now - claim_errors);
                    claim_errors = now;
                }
            }
        }
    };
    shared.stopping.store(true, Ordering::Release);
    // A second Ctrl-C (or SIGTERM) stops waiting for the handlers in flight: they are
    // aborted below (an --exec command's process group killed) and their messages given
    // back when their leases run out.
    let mut again = std::pin::pin!(crate::interrupted());
    let _ = futures::poll!(again.as_mut());
    tokio::select! {
        () = broker.shutdown(args.shutdown_timeout) => {}
        () = &mut again => eprintln!("rowbus: interrupted again: not waiting for the handlers in flight"),
    }
    if !runner.is_finished() {
        runner.abort();
    }
    let stats = broker.stats();
    eprintln!(
        "rowbus: stopped: {} acknowledged, {} retried, {} snoozed, {} dead-lettered, {} failed to dead-letter, \
         {} given back, {} abandoned, released",
        stats.acked,
        stats.retried,
        stats.snoozed,
        stats.dead_lettered,
        stats.dead_letter_failures,
        stats.released,
        stats.abandoned
    );
    if stats.dead_letter_failures > 0 {
        eprintln!(
            "rowbus: warning: {} dead-letter move{} failed; the messages stay in `{}` and run again: check its \
             dead-letter table (`rowbus deploy --queue {}` recreates a missing one)",
            stats.dead_letter_failures,
            if stats.dead_letter_failures == 1 { "" } else { "s" },
            queue.table(),
            queue.table()
        );
    }
    if stats.conflicts > 0 {
        // Not failures: each was tried again at once (on Galera, mostly claims that lost
        // certification to another node's); how often says how much consumers collide.
        eprintln!(
            "rowbus: {} statement{} tried again after a deadlock or certification conflict",
            stats.conflicts,
            if stats.conflicts == 1 { "" } else { "s" }
        );
    }
    if stats.abandoned > 0 {
        eprintln!(
            "rowbus: warning: {} message{} still being handled at the shutdown timeout ({}) {} stopped and given \
             back at once, the attempt not counted",
            stats.abandoned,
            if stats.abandoned == 1 { "" } else { "s" },
            queue_cmd::human(args.shutdown_timeout),
            if stats.abandoned == 1 { "was" } else { "were" },
        );
    }
    outcome
}

/// The grace the runner gives a handler asked to stop before it drops it. An --exec
/// handler stops its command itself (SIGKILL to its process group after --grace) and
/// returns once none of the group is left: the runner waits for that rather than drop it
/// halfway, so that no attempt outlives the settling of its message.
fn runner_grace(args: &ConsumeArgs) -> Duration {
    match args.exec {
        Some(_) => args.grace + KILL_WAIT + Duration::from_secs(1),
        None => args.grace,
    }
}

/// How often a consumer looks whether its queue (or group) is paused, to say so.
const PAUSE_CHECK: Duration = Duration::from_secs(1);

/// Says on stderr, once each time, that the consumer's queue or group was found paused
/// and that it was resumed.
#[derive(Default)]
struct PauseNotice {
    /// Whether the last look found it paused.
    paused: bool,
}

impl PauseNotice {
    async fn check<DB: Db>(&mut self, queue: &rowbus::Queue<DB>, group: &str) {
        // A failed look says nothing: the claims report what is wrong.
        let Ok(paused) = queue.paused().await else { return };
        let table = queue.table();
        let held = paused.covers(group);
        if held && !self.paused {
            let (what, resume) = match group {
                _ if paused.queue => {
                    (format!("the queue `{table}` is paused"), format!("rowbus resume {table}"))
                }
                "" => (
                    format!("the default group of `{table}` is paused"),
                    format!("rowbus resume {table} --group ''"),
                ),
                _ => (
                    format!("group {group:?} of `{table}` is paused"),
                    format!("rowbus resume {table} --group {group}"),
                ),
            };
            eprintln!("rowbus: {what}: waiting, taking nothing until `{resume}`");
        } else if !held && self.paused {
            eprintln!("rowbus: `{table}` was resumed: consuming again");
        }
        self.paused = held;
    }
}

/// One message (the workers' runner): printed, or given to the command.
async fn handle_one<DB: Db>(shared: Arc<Shared>, d: Delivery<DB>) -> Result<(), String> {
    if shared.exec.is_some() {
        return match execute(&shared, &d).await {
            // Cancelled or timed out: the runner settles it (or, cancelled, nothing is left).
            _ if d.is_cancelled() => Ok(()),
            Ran::Ok => Ok(()),
            Ran::Failed(reason) => {
                fail(&shared, d, &reason).await;
                Ok(())
            }
            Ran::Stopped => {
                give_back(d).await;
                Ok(())
            }
            Ran::Snoozed => {
                snooze(&shared, d).await;
                Ok(())
            }
            Ran::CannotRun(reason) => {
                cannot_run(&shared, d, reason).await;
                Ok(())
            }
        };
    }
    let line = render(&d, shared.json) + "\n";
    if let Err(e) = write_out(&line) {
        shared.fatal.write_failed(&e);
        give_back(d).await;
    }
    Ok(())
}

/// One claim's batch: printed and acknowledged together, or each given to the command and
/// settled on its own.
async fn handle_batch<DB: Db>(shared: Arc<Shared>, batch: Vec<Delivery<DB>>) -> Result<(), String> {
    if shared.exec.is_some() {
        for d in batch {
            if shared.stopping.load(Ordering::Acquire) || shared.fatal.is_set() {
                give_back(d).await;
                continue;
            }
            let settled = match execute(&shared, &d).await {
                // Cancelled: gone from the queue, nothing to settle.
                _ if d.is_cancelled() => Ok(()),
                Ran::Ok => d.ack().await,
                Ran::Failed(reason) => {
                    fail(&shared, d, &reason).await;
                    Ok(())
                }
                Ran::Stopped => d.release().await,
                Ran::Snoozed => {
                    snooze(&shared, d).await;
                    Ok(())
                }
                Ran::CannotRun(reason) => {
                    cannot_run(&shared, d, reason).await;
                    Ok(())
                }
            };
            if let Err(e) = settled {
                eprintln!("rowbus: warning: {}", crate::one_line(&e));
            }
        }
        return Ok(());
    }
    let text: String = batch.iter().map(|d| render(d, shared.json) + "\n").collect();
    if let Err(e) = write_out(&text) {
        shared.fatal.write_failed(&e);
        for d in batch {
            give_back(d).await;
        }
    }
    Ok(())
}

/// Gives a message back unstarted (claimable again at once, the attempt not counted).
async fn give_back<DB: Db>(d: Delivery<DB>) {
    if let Err(e) = d.release().await {
        eprintln!("rowbus: warning: {}", crate::one_line(&e));
    }
}

/// A command the shell cannot run (exit status 127 or 126) is a mistake in --exec, not in
/// the message: the message is given back (its attempt not counted) and the consumer stops
/// saying why, rather than burn every message's attempts into the dead-letter table.
async fn cannot_run<DB: Db>(shared: &Shared, d: Delivery<DB>, reason: String) {
    let id = d.id();
    give_back(d).await;
    shared.fatal.stop(Stop::Error(format!("{reason}; message {id} was given back, its attempt not counted")));
}

/// Snoozes a message for `--snooze` (its attempt not counted) and says so on stderr.
async fn snooze<DB: Db>(shared: &Shared, d: Delivery<DB>) {
    let (id, attempt, after) = (d.id(), d.attempt(), shared.snooze);
    match d.snooze(after).await {
        Ok(()) => eprintln!(
            "rowbus: message {id} (attempt {attempt}) snoozed by the command (exit status {SNOOZE_STATUS}): \
             back in {}, the attempt not counted",
            queue_cmd::human(after)
        ),
        Err(e) => eprintln!("rowbus: warning: {}", crate::one_line(&e)),
    }
}

/// Settles a failed attempt (retried, or dead-lettered once it used its attempts) and
/// says so in one stderr line: what happened and what came of it.
async fn fail<DB: Db>(shared: &Shared, d: Delivery<DB>, reason: &str) {
    let (id, attempt, max) = (d.id(), d.attempt(), shared.retry.max_attempts);
    // A message that ran more often than this consumer allows (under a larger
    // --max-attempts elsewhere) is past it, not "attempt 4 of 1".
    let which = match attempt <= max {
        true => format!("attempt {attempt} of {max}"),
        false => format!("attempt {attempt}, past --max-attempts {max}"),
    };
    let what = format!("rowbus: message {id} ({which}): {reason}");
    if !shared.retry.exhausted(attempt) {
        eprintln!("{what}; retrying in {}", queue_cmd::human(shared.retry.delay(attempt)));
        if let Err(e) = d.fail(reason).await {
            eprintln!("rowbus: warning: {}", crate::one_line(&e));
        }
        return;
    }
    match d.fail(reason).await {
        Ok(()) => eprintln!("{what}; dead-lettered"),
        Err(rowbus::Error::DeadLetterFailed { dead, after, source, .. }) => eprintln!(
            "{what}; it could not be dead-lettered into `{dead}` ({}): it stays in the queue and runs \
             again in {}",
            crate::one_line(&source),
            queue_cmd::human(after)
        ),
        Err(e) => eprintln!("{what}; dead-lettering it failed: {}", crate::one_line(&e)),
    }
}
