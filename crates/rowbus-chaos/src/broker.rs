//! Broker chaos: publishers in this process, consumer processes beside it, sessions
//! killed and consumers SIGKILLed while they work; then a drain and the total-queue check.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rowbus::{Backend, Broker, DbPool, Message, Queue};
use sqlx::{MySql, Postgres, Sqlite};
use tokio::time::{Instant, MissedTickBehavior, interval_at};

use super::children::{Consumers, Spawner, parse_journal_name};
use super::consumer::{Settled, broker_options};
use super::faults::kill_user_sessions;
use super::history::{self, Delivered, Journal, Publish};
use super::random::Rng;
use super::report::{Progress, Report};
use super::roles::Role;
use super::sql::{self, Exec};
use super::{BoxError, Ctx};

/// Runs the broker scenario: at-least-once handlers, or transactional ones (`run_tx`).
pub(crate) async fn run(ctx: &Ctx, transactional: bool) -> Result<Report, BoxError> {
    match ctx.backend {
        Backend::Postgres => run_on::<Postgres>(ctx, transactional).await,
        Backend::MySql => run_on::<MySql>(ctx, transactional).await,
        Backend::Sqlite => run_on::<Sqlite>(ctx, transactional).await,
    }
}

/// What the fault loop did.
#[derive(Debug, Default)]
struct Faults {
    kill_rounds: u64,
    sessions_killed: u64,
    sigkills: u64,
    sigkills_mid_handler: u64,
    kill_errors: u64,
}

async fn run_on<DB: Exec>(ctx: &Ctx, transactional: bool) -> Result<Report, BoxError> {
    let name = if transactional { "broker-tx" } else { "broker" };
    let settings = &ctx.settings;
    let tables = &ctx.tables;
    let dir = ctx.dir.join(name);
    std::fs::create_dir_all(&dir)?;
    sql::batch(&ctx.admin, &tables.truncate(ctx.backend)).await?;

    let publisher_db =
        DbPool::connect_with_size(&ctx.url(Role::Publisher)?, settings.publishers as u32).await?;
    let pool = DB::typed(&publisher_db).ok_or("the publisher pool is of another database")?;
    let broker = Broker::new(pool, broker_options(tables, settings.lease)).await?;
    let queue = broker.queue(&tables.queue)?;

    let spawner = Spawner {
        url: ctx.url(Role::Consumer)?,
        prefix: settings.prefix.clone(),
        run_id: ctx.run_id,
        workers: settings.workers,
        lease: settings.lease,
        transactional,
        dir: dir.clone(),
        max_life: settings.duration + Duration::from_secs(600),
    };
    let mut consumers = Consumers::start(spawner, settings.consumers)?;

    let started = Instant::now();
    let deadline = started + settings.duration;
    let history = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(AtomicU64::new(0));
    let rate = settings.rate.unwrap_or(if ctx.backend == Backend::Sqlite { 100 } else { 200 });
    let period = Duration::from_secs_f64(settings.publishers as f64 / f64::from(rate.max(1)));
    let mut publishers = Vec::new();
    for i in 0..settings.publishers {
        let task = publisher(
            broker.clone(),
            queue.clone(),
            next.clone(),
            history.clone(),
            deadline,
            period,
            i as u64,
        );
        publishers.push(tokio::spawn(task));
    }

    // Sessions are killed on PostgreSQL and MariaDB; on SQLite, which has none, the
    // consumer processes are SIGKILLed twice as often instead.
    let sessions = ctx.backend != Backend::Sqlite;
    let kill_every = settings.kill_every;
    let sigkill_every = if sessions { settings.sigkill_every } else { kill_every * 2 };
    let first_sigkill = (settings.duration / 2).min(sigkill_every / 2);
    let mut session_tick = interval_at(started + kill_every / 2, kill_every);
    let mut sigkill_tick = interval_at(started + first_sigkill, sigkill_every);
    let mut status_tick = interval_at(started, Duration::from_millis(500));
    let (first_crash, crash_every) = ctx.crash_schedule();
    let mut crash_tick = interval_at(started + first_crash, crash_every);
    let mut crashes = Vec::new();
    for tick in [&mut session_tick, &mut sigkill_tick, &mut status_tick, &mut crash_tick] {
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    }
    let mut progress = Progress::new(format!("{name} on {}", ctx.database), settings.duration);
    let mut faults = Faults::default();
    let depth = format!("SELECT COUNT(*) FROM {}", tables.queue);
    let consumer_user = Role::Consumer.user();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break,
            _ = session_tick.tick(), if sessions => {
                faults.kill_rounds += 1;
                match kill_user_sessions(&ctx.admin, &consumer_user).await {
                    Ok(n) => faults.sessions_killed += n,
                    Err(_) => faults.kill_errors += 1,
                }
            }
            _ = sigkill_tick.tick() => {
                let victim = (faults.sigkills as usize) % consumers.len();
                let (proc, incarnation) = consumers.current(victim);
                if wait_mid_handler(&dir, proc, incarnation).await {
                    faults.sigkills_mid_handler += 1;
                }
                consumers.sigkill_and_restart(victim).await?;
                faults.sigkills += 1;
            }
            _ = crash_tick.tick(), if ctx.crashes_servers() => {
                progress.phase("server crashed; starting it again");
                crashes.extend(ctx.crash_server().await?);
            }
            _ = status_tick.tick() => {
                consumers.restart_exited()?;
                let queued = sql::count(&ctx.admin, &depth, &[]).await;
                let status = format!(
                    "published {} · queued {} · sessions killed {} · SIGKILLs {}",
                    next.load(Ordering::Relaxed),
                    queued.map_or_else(|_| "?".to_owned(), |n| n.to_string()),
                    faults.sessions_killed,
                    faults.sigkills
                );
                progress.update(&status);
            }
        }
    }
    for task in publishers {
        task.await?;
    }

    // Drain: no more faults; wait until the queue is empty (a SIGKILLed consumer's
    // messages come back when their leases run out).
    progress.phase("draining");
    let drain_started = Instant::now();
    let drain_limit = settings.lease * 3 + Duration::from_secs(60);
    let mut problems = Vec::new();
    loop {
        consumers.restart_exited()?;
        let queued = sql::count(&ctx.admin, &depth, &[]).await?;
        if queued == 0 {
            break;
        }
        if drain_started.elapsed() > drain_limit {
            problems.push(format!("{queued} messages still queued after draining for {drain_limit:?}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained = drain_started.elapsed();
    consumers.stop(Duration::from_secs(20)).await?;
    progress.finish();
    broker.shutdown(Duration::from_secs(1)).await;
    publisher_db.close().await;

    // The histories.
    let publishes = history.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let rows = sql::rows(
        &ctx.admin,
        &format!("SELECT msg, proc, incarnation, attempt, at_us FROM {} WHERE run_id = ?", tables.handled),
        &[ctx.run_id],
    )
    .await?;
    let deliveries: Vec<Delivered> = rows
        .iter()
        .map(|r| Delivered { msg: r[0], proc: r[1], incarnation: r[2], attempt: r[3], at: r[4] })
        .collect();
    let journal = read_journals(&dir)?;
    let killed: HashSet<(i64, i64)> = consumers.killed.iter().map(|&(p, i, _)| (p, i)).collect();
    let c = history::check(&publishes, &deliveries, &journal, &killed);
    let dups = format!("SELECT COUNT(DISTINCT msg) FROM {} WHERE run_id = ?", tables.dups);
    let dup_effects = sql::count(&ctx.admin, &dups, &[ctx.run_id]).await?;
    let dead = sql::count(&ctx.admin, &format!("SELECT COUNT(*) FROM {}_dead", tables.queue), &[]).await?;
    let left = sql::count(&ctx.admin, &depth, &[]).await?;

    let mut counts = vec![
        ("attempted", c.attempted, "publishes tried"),
        ("acknowledged", c.acknowledged, "publish returned Ok and was not rolled back"),
        ("rolled_back", c.rolled_back, "published in a transaction that rolled back: never to be delivered"),
        ("indeterminate", c.indeterminate, "publish returned an error: either way is right"),
        ("delivered", c.delivered, "distinct messages handled"),
        ("deliveries", c.deliveries, "handler records in all"),
        ("lost", c.lost, "acknowledged, never delivered (must be 0)"),
        ("unexpected", c.unexpected, "delivered, never acknowledged: rolled back or unknown (must be 0)"),
        ("recovered", c.recovered, "indeterminate publishes that were delivered"),
        ("duplicated", c.duplicated, "messages delivered more than once"),
    ];
    if transactional {
        counts.push(("duplicated_effects", dup_effects as u64, "effects written twice (must be 0)"));
    } else {
        counts.extend([
            (
                "redelivered_after_session_kill",
                c.redelivered_after_session_kill,
                "its record or ack lost the connection",
            ),
            (
                "redelivered_after_sigkill",
                c.redelivered_after_sigkill,
                "its consumer was SIGKILLed before acking",
            ),
            (
                "redelivered_after_error",
                c.redelivered_after_error,
                "its ack failed otherwise (lease ran out, busy)",
            ),
            ("redelivered_unexplained", c.redelivered_unexplained, "no fault explains it (must be 0)"),
        ]);
    }
    let recoveries = super::recoveries(&crashes, &deliveries.iter().map(|d| d.at).collect::<Vec<_>>());
    if ctx.crashes_servers() {
        counts.extend(server_counts(&crashes, &recoveries));
    }
    counts.extend([
        ("dead_lettered", dead as u64, "in the dead-letter table (must be 0)"),
        ("left_in_queue", left as u64, "still queued after draining (must be 0)"),
        ("kill_rounds", faults.kill_rounds, "times every consumer session was killed"),
        ("sessions_killed", faults.sessions_killed, "consumer and listening sessions killed"),
        ("kill_errors", faults.kill_errors, "kill rounds that failed"),
        ("sigkills", faults.sigkills, "consumer processes SIGKILLed and restarted"),
        ("sigkills_mid_handler", faults.sigkills_mid_handler, "of which right after a handler started"),
        (
            "consumer_crashes",
            consumers.crashed.len() as u64,
            "consumers that exited by themselves (must be 0)",
        ),
    ]);
    let mut report = Report {
        scenario: name,
        database: ctx.database,
        faulted: settings.duration,
        drained,
        counts: super::report::rows(counts),
        problems,
    };
    for must_be_zero in ["lost", "unexpected", "dead_lettered", "left_in_queue", "consumer_crashes"] {
        report.require_zero(must_be_zero);
    }
    if transactional {
        report.require_zero("duplicated_effects");
        report.require_zero("duplicated");
    } else {
        report.require_zero("redelivered_unexplained");
    }
    for (proc, incarnation, status) in &consumers.crashed {
        report.problems.push(format!(
            "consumer {proc} (incarnation {incarnation}) exited by itself: {status}; see {}",
            dir.join(format!("consumer-{proc}-{incarnation}.log")).display()
        ));
    }
    // On a Galera cluster the other nodes work on while one restarts, so a restart that
    // came back after the last message was handled (the queue already drained) has no
    // work to recover; a single server has handled nothing meanwhile.
    let last_handled = deliveries.iter().map(|d| d.at).max().unwrap_or(i64::MIN);
    let unrecovered = recoveries
        .iter()
        .zip(&crashes)
        .filter(|&(recovery, &(_, up))| recovery.is_none() && !(ctx.galera.is_some() && up > last_handled))
        .count();
    if unrecovered > 0 {
        report
            .problems
            .push("no message was handled after a server restart: the consumers did not recover".into());
    }
    if ctx.crashes_servers() && crashes.is_empty() {
        report.problems.push("the server was never crashed: run longer or crash more often".into());
    }
    if c.acknowledged == 0 {
        report.problems.push("nothing was published: is the database too slow, or the run too short?".into());
    }
    // A server crash is a fault too: on a loaded machine its restart can fill a short run
    // and leave no time for a consumer's SIGKILL.
    if (faults.sigkills == 0 && crashes.is_empty()) || (sessions && faults.sessions_killed == 0) {
        report.problems.push("no fault was injected: run longer".into());
    }
    if faults.kill_errors > 0 {
        report.problems.push(format!("{} kill rounds failed", faults.kill_errors));
    }
    Ok(report)
}

/// The server-fault rows: crashes, the longest outage and the longest recovery.
pub(crate) fn server_counts(
    crashes: &[(i64, i64)],
    recoveries: &[Option<i64>],
) -> Vec<(&'static str, u64, &'static str)> {
    let ms = |us: i64| u64::try_from(us / 1000).unwrap_or(0);
    let outage = crashes.iter().map(|(down, up)| ms(up - down)).max().unwrap_or(0);
    let recovery = recoveries.iter().flatten().map(|&us| ms(us)).max().unwrap_or(0);
    vec![
        ("server_crashes", crashes.len() as u64, "throwaway server crashed hard and started again"),
        ("outage_ms_max", outage, "longest crash-to-accepting-connections"),
        ("recovery_ms_max", recovery, "longest from accepting connections to work done again"),
    ]
}

/// One publisher: message numbers from the shared counter, 10% inside transactions that
/// roll back, 15% inside transactions that commit, the rest plain, at `period` apart.
async fn publisher<DB: Exec>(
    broker: Broker<DB>,
    queue: Queue<DB>,
    next: Arc<AtomicU64>,
    history: Arc<Mutex<Vec<Publish>>>,
    deadline: Instant,
    period: Duration,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let mut tick = interval_at(Instant::now() + rng.below(period), period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if Instant::now() >= deadline {
            return;
        }
        let n = next.fetch_add(1, Ordering::Relaxed) as usize;
        {
            let mut h = history.lock().unwrap_or_else(|e| e.into_inner());
            if h.len() <= n {
                h.resize(n + 1, Publish::Pending);
            }
        }
        let message = Message::text(n.to_string());
        let roll = rng.unit();
        let outcome = if roll < 0.25 {
            // Anything not committed is never to be seen: a failed begin or publish too.
            match broker.begin().await {
                Err(_) => Publish::RolledBack,
                Ok(mut tx) => match tx.publish(&queue, message).await {
                    Ok(_) if roll >= 0.10 => match tx.commit().await {
                        Ok(()) => Publish::Acked,
                        Err(_) => Publish::Indeterminate,
                    },
                    _ => {
                        let _ = tx.rollback().await;
                        Publish::RolledBack
                    }
                },
            }
        } else {
            match queue.publish(message).await {
                Ok(_) => Publish::Acked,
                Err(_) => Publish::Indeterminate,
            }
        };
        history.lock().unwrap_or_else(|e| e.into_inner())[n] = outcome;
    }
}

/// Waits (up to a second) until consumer (proc, incarnation) starts a handler, as its
/// journal's growth shows; `true` when it did.
async fn wait_mid_handler(dir: &Path, proc: i64, incarnation: i64) -> bool {
    let path = super::children::journal_path(dir, proc, incarnation);
    let size = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let before = size();
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(1)).await;
        if size() != before {
            // A handler has just started: it records, sleeps up to 5 ms, then acks.
            tokio::time::sleep(Duration::from_millis(2)).await;
            return true;
        }
    }
    false
}

/// Every consumer journal of a scenario: (proc, incarnation, msg, attempt) -> outcome.
fn read_journals(dir: &Path) -> Result<Journal, BoxError> {
    let mut journal = Journal::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Some((proc, incarnation)) = entry.file_name().to_str().and_then(parse_journal_name) else {
            continue;
        };
        for line in std::fs::read_to_string(entry.path())?.lines() {
            let mut words = line.split(' ');
            let (Some(msg), Some(attempt), Some(word)) = (words.next(), words.next(), words.next()) else {
                continue; // a line cut by SIGKILL
            };
            let (Ok(msg), Ok(attempt), Some(settled)) = (msg.parse(), attempt.parse(), Settled::parse(word))
            else {
                continue; // `start`, or a cut line
            };
            journal.insert((proc, incarnation, msg, attempt), settled);
        }
    }
    Ok(journal)
}
