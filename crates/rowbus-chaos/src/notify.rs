//! Notify chaos: notifiers committing after random delays (10% roll back) while listeners
//! lose their connections (killed sessions; on SQLite, restarted listeners); then every
//! committed notification must have reached every listener, except those committed while
//! that listener was between a reported disconnect and its reconnect.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use rowbus::{Backend, DbPool, Event, Listener, ListenerHandle, ListenerOptions, Notifier, NotifyConfig};
use sqlx::{MySql, Pool, Postgres, Sqlite};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior, interval_at};

use super::faults::kill_session;
use super::random::Rng;
use super::report::{Progress, Report};
use super::roles::Role;
use super::sql::{self, Exec, Tables};
use super::time::{now_us, us};
use super::{BoxError, Ctx};

/// The notify table's polling in this scenario: commit delays stay below its lookback.
pub(crate) fn config(tables: &Tables) -> NotifyConfig {
    NotifyConfig {
        table: tables.notify.clone(),
        poll_interval: Duration::from_millis(100),
        lookback: Duration::from_secs(3),
        ..NotifyConfig::default()
    }
}

/// How much earlier than the reported disconnect a listener may have stopped receiving:
/// its last successful poll began up to a poll interval and a poll's duration before the
/// kill. Generous on purpose: the gap is the excuse, and the excuse must not be short.
const GAP_SLACK: Duration = Duration::from_secs(1);

/// What became of one notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    Committed,
    /// Rolled back, or failed before its commit: never to be delivered.
    RolledBack,
    /// The commit returned an error: either way is right.
    Indeterminate,
}

/// One notification sent: its payload `key`, fate and times (µs since the epoch).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    pub key: u64,
    pub fate: Fate,
    /// Before the transaction began.
    pub begun: i64,
    /// Before COMMIT was sent.
    pub committing: i64,
    /// After COMMIT returned.
    pub done: i64,
}

/// A notification in a transaction held open for `delay`, then committed or rolled back.
pub(crate) trait Notifying: Exec {
    fn notify_tx<'a>(
        pool: &'a Pool<Self>,
        notifier: &'a Notifier,
        channel: &'a str,
        key: u64,
        delay: Duration,
        rollback: bool,
    ) -> BoxFuture<'a, Sent>;
}

macro_rules! notifying {
    ($db:ty) => {
        impl Notifying for $db {
            fn notify_tx<'a>(
                pool: &'a Pool<Self>,
                notifier: &'a Notifier,
                channel: &'a str,
                key: u64,
                delay: Duration,
                rollback: bool,
            ) -> BoxFuture<'a, Sent> {
                Box::pin(async move {
                    let begun = now_us();
                    let failed = |fate| Sent { key, fate, begun, committing: now_us(), done: now_us() };
                    let Ok(mut tx) = pool.begin().await else { return failed(Fate::RolledBack) };
                    let payload = key.to_string();
                    if notifier.notify(&mut *tx, channel, &payload).await.is_err() {
                        let _ = tx.rollback().await;
                        return failed(Fate::RolledBack);
                    }
                    tokio::time::sleep(delay).await;
                    let committing = now_us();
                    let fate = if rollback {
                        let _ = tx.rollback().await;
                        Fate::RolledBack
                    } else if tx.commit().await.is_ok() {
                        Fate::Committed
                    } else {
                        Fate::Indeterminate
                    };
                    Sent { key, fate, begun, committing, done: now_us() }
                })
            }
        }
    };
}
notifying!(Postgres);
notifying!(MySql);
notifying!(Sqlite);

/// What one listener saw, with the harness's own faults on it.
#[derive(Debug, Default, Clone)]
pub(crate) struct ListenLog {
    /// Payload keys in arrival order.
    pub got: Vec<u64>,
    /// Payloads that are no key of this run.
    pub foreign: u64,
    /// When `Event::Disconnected` arrived.
    pub disconnected: Vec<i64>,
    /// When `Event::Reconnected` arrived.
    pub reconnected: Vec<i64>,
    /// When the harness killed this listener's session.
    pub kills: Vec<i64>,
    /// SQLite: [dropped, listening again] of each restart.
    pub restarts: Vec<(i64, i64)>,
}

/// A listener's gaps: [start, end] in µs, during which a commit may go unseen.
pub(crate) fn gaps(log: &ListenLog, before: i64, end_of_run: i64) -> (Vec<(i64, i64)>, bool) {
    let mut gaps = Vec::new();
    let mut reconnected = true;
    for &d in &log.disconnected {
        // Counted from the harness's kill when there was one just before.
        let kill = log.kills.iter().copied().filter(|&k| k <= d && d - k <= 10_000_000).max();
        let start = kill.unwrap_or(d);
        let end = match log.reconnected.iter().copied().find(|&r| r >= d) {
            Some(r) => r,
            None => {
                reconnected = false;
                end_of_run
            }
        };
        gaps.push((start - before, end));
    }
    for &(dropped, back) in &log.restarts {
        gaps.push((dropped - before, back));
    }
    (gaps, reconnected)
}

/// The counts of a notify run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NotifyCounts {
    pub committed: u64,
    pub rolled_back: u64,
    pub indeterminate: u64,
    /// Committed notifications times listeners.
    pub expected: u64,
    /// Deliveries of committed notifications, per listener.
    pub delivered: Vec<u64>,
    /// Committed while the listener was in a gap, and not delivered: allowed.
    pub lost_in_gaps: u64,
    /// Open longer than the lookback allows (the one documented loss case), not delivered.
    pub lost_late: u64,
    /// Committed outside any gap, never delivered (must be 0).
    pub lost: u64,
    /// Deliveries beyond the first of a notification to one listener (must be 0).
    pub duplicated: u64,
    /// Rolled-back notifications delivered (must be 0).
    pub rolled_back_delivered: u64,
    /// Deliveries of notifications never sent (must be 0).
    pub unexpected: u64,
    /// Listeners that never came back after a disconnect (must be 0).
    pub not_reconnected: u64,
}

/// Checks every listener's deliveries against what was sent.
pub(crate) fn check(
    sent: &[Sent],
    logs: &[ListenLog],
    poll: Duration,
    lookback: Duration,
    end: i64,
) -> NotifyCounts {
    let mut c = NotifyCounts::default();
    for s in sent {
        match s.fate {
            Fate::Committed => c.committed += 1,
            Fate::RolledBack => c.rolled_back += 1,
            Fate::Indeterminate => c.indeterminate += 1,
        }
    }
    let known: HashMap<u64, &Sent> = sent.iter().map(|s| (s.key, s)).collect();
    let before = us(poll + GAP_SLACK);
    for log in logs {
        let (gaps, reconnected) = gaps(log, before, end);
        if !reconnected {
            c.not_reconnected += 1;
        }
        let mut times: HashMap<u64, u64> = HashMap::new();
        for key in &log.got {
            *times.entry(*key).or_default() += 1;
        }
        let mut delivered = 0;
        for (key, &n) in &times {
            match known.get(key).map(|s| s.fate) {
                None => c.unexpected += n,
                Some(Fate::RolledBack) => c.rolled_back_delivered += 1,
                Some(Fate::Committed) => delivered += 1,
                Some(Fate::Indeterminate) => {}
            }
            c.duplicated += n.saturating_sub(1);
        }
        c.unexpected += log.foreign;
        c.delivered.push(delivered);
        for s in sent.iter().filter(|s| s.fate == Fate::Committed) {
            c.expected += 1;
            if times.contains_key(&s.key) {
                continue;
            }
            // Visible somewhere between sending COMMIT and its return.
            if gaps.iter().any(|&(start, end)| s.committing <= end && s.done >= start) {
                c.lost_in_gaps += 1;
            } else if s.done - s.begun + us(poll) >= us(lookback) {
                c.lost_late += 1;
            } else {
                c.lost += 1;
            }
        }
    }
    c
}

/// One listener's shared state: its handle (for its session id) and its log.
#[derive(Debug, Default)]
struct Slot {
    handle: Mutex<Option<ListenerHandle>>,
    log: Mutex<ListenLog>,
}

enum Control {
    Restart,
    Stop,
}

async fn listening(
    url: &str,
    options: &ListenerOptions,
    channels: &[String],
) -> Result<Listener, rowbus::Error> {
    let listener = Listener::connect_with(url, options.clone()).await?;
    for channel in channels {
        listener.listen(channel).await?;
    }
    Ok(listener)
}

/// Runs one listener until told to stop, logging what it receives; on SQLite, restarts it
/// when told to.
async fn listen_task(
    url: String,
    options: ListenerOptions,
    channels: Vec<String>,
    slot: Arc<Slot>,
    mut control: mpsc::UnboundedReceiver<Control>,
    ready: oneshot::Sender<()>,
) -> Result<(), BoxError> {
    let mut listener = listening(&url, &options, &channels).await?;
    *slot.handle.lock().unwrap_or_else(PoisonError::into_inner) = Some(listener.handle());
    let _ = ready.send(());
    loop {
        tokio::select! {
            command = control.recv() => match command {
                Some(Control::Restart) => {
                    let dropped = now_us();
                    drop(listener);
                    listener = listening(&url, &options, &channels).await?;
                    *slot.handle.lock().unwrap_or_else(PoisonError::into_inner) = Some(listener.handle());
                    let back = now_us();
                    slot.log.lock().unwrap_or_else(PoisonError::into_inner).restarts.push((dropped, back));
                }
                Some(Control::Stop) | None => return Ok(()),
            },
            event = listener.recv() => {
                let event = event?;
                let mut log = slot.log.lock().unwrap_or_else(PoisonError::into_inner);
                match event {
                    Event::Notification(n) => match n.payload.parse() {
                        Ok(key) => log.got.push(key),
                        Err(_) => log.foreign += 1,
                    },
                    Event::Disconnected(_) => log.disconnected.push(now_us()),
                    Event::Reconnected { .. } => log.reconnected.push(now_us()),
                    // Not a row of the notify table: none of the harness's notifications.
                    Event::Transient(_) => log.foreign += 1,
                    // Stopped, and what a later rowbus adds: nothing of the harness's rows.
                    _ => {}
                }
            }
        }
    }
}

/// Runs the notify scenario.
pub(crate) async fn run(ctx: &Ctx) -> Result<Report, BoxError> {
    match ctx.backend {
        Backend::Postgres => run_on::<Postgres>(ctx).await,
        Backend::MySql => run_on::<MySql>(ctx).await,
        Backend::Sqlite => run_on::<Sqlite>(ctx).await,
    }
}

async fn run_on<DB: Notifying>(ctx: &Ctx) -> Result<Report, BoxError> {
    let settings = &ctx.settings;
    sql::batch(&ctx.admin, &ctx.tables.truncate(ctx.backend)).await?;
    let config = config(&ctx.tables);
    let (poll, lookback) = (config.poll_interval, config.lookback);
    let options = ListenerOptions {
        notify_table: config.clone(),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_secs(1),
        buffer: 65_536,
        ..ListenerOptions::default()
    };
    let channels: Vec<String> = (0..4).map(|i| format!("{}_ch{i}", settings.prefix)).collect();

    // Listeners first: everything sent afterwards is expected.
    let listener_url = ctx.url(Role::Listener)?;
    let mut slots = Vec::new();
    let mut controls = Vec::new();
    let mut listeners = Vec::new();
    for _ in 0..settings.listeners {
        let slot = Arc::new(Slot::default());
        let (control, commands) = mpsc::unbounded_channel();
        let (ready, is_ready) = oneshot::channel();
        let task = listen_task(
            listener_url.clone(),
            options.clone(),
            channels.clone(),
            slot.clone(),
            commands,
            ready,
        );
        listeners.push(tokio::spawn(task));
        if is_ready.await.is_err() {
            let failed = listeners.pop().expect("just pushed").await?;
            return Err(format!(
                "a listener failed to start: {}",
                failed.err().map(|e| e.to_string()).unwrap_or_default()
            )
            .into());
        }
        slots.push(slot);
        controls.push(control);
    }

    let notifier_db = DbPool::connect_with_size(&ctx.url(Role::Notifier)?, settings.notifiers as u32).await?;
    let pool = DB::typed(&notifier_db).ok_or("the notifier pool is of another database")?;
    let notifier = Arc::new(Notifier::new(config.clone())?);
    // SQLite has one writer: a transaction held open holds every other notifier up, and
    // commits cannot overtake each other; short delays keep the notifiers going.
    let max_delay = match ctx.backend {
        Backend::Sqlite => Duration::from_millis(20),
        _ => lookback * 2 / 3,
    };
    let started = Instant::now();
    let deadline = started + settings.duration;
    let sent = Arc::new(Mutex::new(Vec::new()));
    let mut notifiers = Vec::new();
    for i in 0..settings.notifiers {
        let (pool, notifier, sent, channel) =
            (pool.clone(), notifier.clone(), sent.clone(), channels[i % channels.len()].clone());
        notifiers.push(tokio::spawn(async move {
            let mut rng = Rng::new(1000 + i as u64);
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let key = ((i as u64) << 32) | seq;
                seq += 1;
                let rollback = rng.chance(0.1);
                let delay = rng.below(max_delay);
                let record = DB::notify_tx(&pool, &notifier, &channel, key, delay, rollback).await;
                sent.lock().unwrap_or_else(PoisonError::into_inner).push(record);
                tokio::time::sleep(rng.below(Duration::from_millis(10))).await;
            }
        }));
    }

    let every = settings.listener_kill_every;
    let mut kill_tick = interval_at(started + every, every);
    let mut status_tick = interval_at(started, Duration::from_millis(500));
    kill_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    status_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let (first_crash, crash_every) = ctx.crash_schedule();
    let mut crash_tick = interval_at(started + first_crash, crash_every);
    crash_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut crashes = Vec::new();
    let mut progress = Progress::new(format!("notify on {}", ctx.database), settings.duration);
    let (mut rounds, mut kills, mut kill_errors) = (0u64, 0u64, 0u64);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break,
            _ = kill_tick.tick() => {
                // Half of the listeners each round, alternating.
                for (i, slot) in slots.iter().enumerate().filter(|(i, _)| i % 2 == (rounds % 2) as usize) {
                    if ctx.backend == Backend::Sqlite {
                        let _ = controls[i].send(Control::Restart);
                        kills += 1;
                        continue;
                    }
                    let handle = slot.handle.lock().unwrap_or_else(PoisonError::into_inner).clone();
                    let Some(id) = handle.as_ref().and_then(ListenerHandle::session_id) else { continue };
                    slot.log.lock().unwrap_or_else(PoisonError::into_inner).kills.push(now_us());
                    match kill_session(&ctx.admin, id).await {
                        Ok(true) => kills += 1,
                        Ok(false) => {}
                        Err(_) => kill_errors += 1,
                    }
                }
                rounds += 1;
            }
            _ = crash_tick.tick(), if ctx.server.is_some() => {
                progress.phase("server crashed; starting it again");
                // Every listener loses its session: a kill of each, for its gap.
                let crashed = now_us();
                for slot in &slots {
                    slot.log.lock().unwrap_or_else(PoisonError::into_inner).kills.push(crashed);
                }
                crashes.extend(ctx.crash_server().await?);
            }
            _ = status_tick.tick() => {
                let got = |s: &Arc<Slot>| s.log.lock().unwrap_or_else(PoisonError::into_inner).got.len();
                let received: usize = slots.iter().map(got).sum();
                let count = sent.lock().unwrap_or_else(PoisonError::into_inner).len();
                progress.update(&format!("sent {count} · received {received} · listener faults {kills}"));
            }
        }
    }
    for task in notifiers {
        task.await?;
    }

    // Drain: every listener connected again, and nothing new for a while.
    progress.phase("draining");
    let drain_started = Instant::now();
    let mut last = (usize::MAX, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (received, open) = slots.iter().fold((0, false), |(n, open), s| {
            let log = s.log.lock().unwrap_or_else(PoisonError::into_inner);
            (n + log.got.len(), open || log.disconnected.len() > log.reconnected.len())
        });
        if received != last.0 {
            last = (received, Instant::now());
        }
        let quiet = last.1.elapsed() >= Duration::from_millis(500);
        if (!open && quiet && drain_started.elapsed() >= poll * 10)
            || drain_started.elapsed() > Duration::from_secs(30)
        {
            break;
        }
    }
    let drained = drain_started.elapsed();
    let end = now_us();
    let mut task_errors = Vec::new();
    for (control, task) in controls.iter().zip(listeners) {
        let _ = control.send(Control::Stop);
        if let Err(error) = task.await? {
            task_errors.push(error.to_string());
        }
    }
    progress.finish();
    notifier_db.close().await;

    let sent = sent.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let logs: Vec<ListenLog> =
        slots.iter().map(|s| s.log.lock().unwrap_or_else(PoisonError::into_inner).clone()).collect();
    let c = check(&sent, &logs, poll, lookback, end);
    let disconnects: usize = logs.iter().map(|l| l.disconnected.len() + l.restarts.len()).sum();
    let gap_ms: i64 = logs
        .iter()
        .map(|l| gaps(l, us(poll + GAP_SLACK), end).0.iter().map(|(s, e)| (e - s) / 1000).sum::<i64>())
        .sum();
    let mut counts = super::report::rows(vec![
        ("committed", c.committed, "notifications committed"),
        ("rolled_back", c.rolled_back, "rolled back (or failed before commit): never to be delivered"),
        ("indeterminate", c.indeterminate, "commit returned an error: either way is right"),
        ("expected", c.expected, "committed × listeners"),
    ]);
    for (i, n) in c.delivered.iter().enumerate() {
        counts.push((
            format!("delivered_listener_{i}"),
            *n,
            "committed notifications this listener received",
        ));
    }
    counts.extend(super::report::rows(vec![
        ("lost_in_gaps", c.lost_in_gaps, "committed while that listener was disconnected: allowed"),
        ("lost_late", c.lost_late, "open longer than lookback − poll interval: the documented loss"),
        ("lost", c.lost, "committed outside any gap, never delivered (must be 0)"),
        ("duplicated", c.duplicated, "delivered twice to one listener (must be 0)"),
        ("rolled_back_delivered", c.rolled_back_delivered, "rolled back yet delivered (must be 0)"),
        ("unexpected", c.unexpected, "delivered, never sent (must be 0)"),
        ("listener_faults", kills, "sessions killed (SQLite: listeners restarted)"),
        ("kill_errors", kill_errors, "kills that failed"),
        ("disconnects", disconnects as u64, "disconnects reported (SQLite: restarts)"),
        ("not_reconnected", c.not_reconnected, "listeners that never came back (must be 0)"),
        ("gap_ms", u64::try_from(gap_ms).unwrap_or(0), "time in gaps, all listeners, slack included"),
    ]));
    let recoveries = listener_recoveries(&crashes, &logs);
    if ctx.server.is_some() {
        counts.extend(super::report::rows(super::broker::server_counts(&crashes, &recoveries)));
    }
    let mut report = Report {
        scenario: "notify",
        database: ctx.database,
        faulted: settings.duration,
        drained,
        counts,
        problems: task_errors.into_iter().map(|e| format!("a listener stopped: {e}")).collect(),
    };
    for name in ["lost", "duplicated", "rolled_back_delivered", "unexpected", "not_reconnected"] {
        report.require_zero(name);
    }
    if c.committed == 0 {
        report.problems.push("nothing was committed: run longer".into());
    }
    if recoveries.iter().any(Option::is_none) {
        report.problems.push("a listener did not come back after a server restart".into());
    }
    if ctx.server.is_some() && crashes.is_empty() {
        report.problems.push("the server was never crashed: run longer or crash more often".into());
    }
    if kills == 0 && crashes.is_empty() {
        report.problems.push("no listener fault was injected: run longer".into());
    }
    if kill_errors > 0 {
        report.problems.push(format!("{kill_errors} kills failed"));
    }
    Ok(report)
}

/// Recovery after each crash (`(down, up)`): until the last listener is back, from when the
/// server accepted connections again (0 for a listener back before the harness saw that:
/// it polls the server, and a listener may reconnect first); `None` where a listener never
/// came back after the crash.
fn listener_recoveries(crashes: &[(i64, i64)], logs: &[ListenLog]) -> Vec<Option<i64>> {
    crashes
        .iter()
        .map(|&(down, up)| {
            logs.iter()
                .map(|l| l.reconnected.iter().copied().filter(|&r| r >= down).min().map(|r| (r - up).max(0)))
                .collect::<Option<Vec<i64>>>()
                .and_then(|each| each.into_iter().max())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(key: u64, fate: Fate, begun: i64, done: i64) -> Sent {
        Sent { key, fate, begun, committing: done - 10, done }
    }

    #[test]
    fn losses_are_excused_only_inside_gaps() {
        let s = 1_000_000;
        let sent = [
            sent(1, Fate::Committed, 0, 100),
            sent(2, Fate::Committed, 9 * s, 9 * s + 100), // inside the gap
            sent(3, Fate::Committed, 20 * s, 20 * s + 100), // outside: lost
            sent(4, Fate::RolledBack, 0, 100),
            sent(5, Fate::Committed, 30 * s, 34 * s), // open 4 s > lookback 3 s
        ];
        let log = ListenLog {
            got: vec![1, 1, 4, 77],
            disconnected: vec![10 * s],
            reconnected: vec![10 * s + 200_000],
            kills: vec![10 * s - 50_000],
            ..ListenLog::default()
        };
        let c = check(&sent, &[log], Duration::from_millis(100), Duration::from_secs(3), 40 * s);
        assert_eq!((c.committed, c.rolled_back, c.expected), (4, 1, 4));
        assert_eq!(c.delivered, vec![1]);
        assert_eq!((c.lost_in_gaps, c.lost, c.lost_late), (1, 1, 1));
        assert_eq!((c.duplicated, c.rolled_back_delivered, c.unexpected), (1, 1, 1));
        assert_eq!(c.not_reconnected, 0);
    }

    #[test]
    fn a_gap_starts_before_the_kill() {
        let log = ListenLog {
            disconnected: vec![5_000_000],
            reconnected: vec![5_300_000],
            kills: vec![4_900_000],
            ..ListenLog::default()
        };
        assert_eq!(gaps(&log, 1_100_000, 0), (vec![(3_800_000, 5_300_000)], true));
        let never = ListenLog { disconnected: vec![5_000_000], ..ListenLog::default() };
        assert_eq!(gaps(&never, 0, 9_000_000), (vec![(5_000_000, 9_000_000)], false));
    }

    #[test]
    fn a_listener_back_before_the_harness_saw_the_server_up_has_recovered() {
        let back = |at: i64| ListenLog { reconnected: vec![at], ..ListenLog::default() };
        // Crashed at 10 s, seen accepting connections at 12 s.
        let crash = [(10_000_000, 12_000_000)];
        assert_eq!(listener_recoveries(&crash, &[back(11_900_000), back(12_500_000)]), [Some(500_000)]);
        assert_eq!(listener_recoveries(&crash, &[back(11_900_000)]), [Some(0)]);
        // Back before the crash only: not back after it.
        assert_eq!(listener_recoveries(&crash, &[back(9_000_000), back(12_500_000)]), [None]);
    }
}
