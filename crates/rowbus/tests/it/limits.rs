//! Concurrency and rate limits, against the real PostgreSQL and MariaDB and a temporary
//! SQLite file: several brokers (each its own pool, as processes would be) race their
//! claims on one queue, and what their handlers record says how many ran at once and
//! when each started.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use rowbus::limit::{Limit, LimitScope, Rate};
use rowbus::{Broker, BrokerOptions, Db, DbPool, Error, Message, Queue};

use common::place_test as database_test;

/// How long a test waits for its messages to be handled.
const DRAINS: Duration = Duration::from_secs(60);

fn options() -> BrokerOptions {
    BrokerOptions { poll_interval: Duration::from_millis(200), ..BrokerOptions::default() }
}

/// What handlers record: how many run at once (in all and per key), the most so far,
/// and when each started.
#[derive(Default)]
struct Meter {
    state: Mutex<MeterState>,
}

#[derive(Default)]
struct MeterState {
    running: usize,
    most: usize,
    keys: HashMap<String, usize>,
    key_most: HashMap<String, usize>,
    starts: Vec<Instant>,
    done: usize,
}

impl Meter {
    fn start(&self, key: Option<&str>) {
        let mut s = self.state.lock().unwrap();
        s.running += 1;
        s.most = s.most.max(s.running);
        s.starts.push(Instant::now());
        if let Some(key) = key {
            let n = s.keys.entry(key.to_owned()).or_default();
            *n += 1;
            let n = *n;
            let most = s.key_most.entry(key.to_owned()).or_default();
            *most = (*most).max(n);
        }
    }

    fn end(&self, key: Option<&str>) {
        let mut s = self.state.lock().unwrap();
        s.running -= 1;
        s.done += 1;
        if let Some(key) = key {
            *s.keys.get_mut(key).unwrap() -= 1;
        }
    }

    fn most(&self) -> usize {
        self.state.lock().unwrap().most
    }

    /// Starts a new phase: the most at once counts from what runs now.
    fn reset_most(&self) {
        let mut s = self.state.lock().unwrap();
        s.most = s.running;
    }

    fn done(&self) -> usize {
        self.state.lock().unwrap().done
    }

    /// Waits until `n` messages were handled.
    async fn wait_done(&self, n: usize) {
        let deadline = Instant::now() + DRAINS;
        while self.done() < n {
            assert!(Instant::now() < deadline, "{} of {n} handled within {DRAINS:?}", self.done());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Runs `workers` handlers on `group` of `queue`, each holding its message `hold`.
fn consume<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    workers: usize,
    hold: Duration,
    meter: &Arc<Meter>,
) -> tokio::task::JoinHandle<()> {
    let meter = meter.clone();
    let sub = queue.subscribe().group(group).workers(workers);
    tokio::spawn(async move {
        sub.run(move |delivery| {
            let meter = meter.clone();
            async move {
                let key = delivery.key().map(str::to_owned);
                meter.start(key.as_deref());
                tokio::time::sleep(hold).await;
                meter.end(key.as_deref());
                Ok::<_, Error>(())
            }
        })
        .await
        .unwrap()
    })
}

/// `n` brokers on `place` and the queue `name` on each, deployed.
async fn brokers<DB: Brokers>(place: &Place, name: &str, n: usize) -> (Vec<Broker<DB>>, Vec<Queue<DB>>) {
    let mut brokers = Vec::new();
    let mut queues = Vec::new();
    for _ in 0..n {
        let broker = DB::broker(place, options()).await;
        let queue = broker.queue(name).unwrap();
        queue.deploy().await.unwrap();
        brokers.push(broker);
        queues.push(queue);
    }
    (brokers, queues)
}

async fn shutdown<DB: Db>(brokers: Vec<Broker<DB>>, tasks: Vec<tokio::task::JoinHandle<()>>) {
    for broker in &brokers {
        broker.shutdown(Duration::from_secs(5)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
}

async fn publish<DB: Db>(queue: &Queue<DB>, messages: impl IntoIterator<Item = Message>) {
    let messages: Vec<Message> = messages.into_iter().collect();
    for chunk in messages.chunks(100) {
        queue.publish_batch(chunk.iter().cloned()).await.unwrap();
    }
}

fn texts(n: usize, group: &str) -> Vec<Message> {
    (0..n).map(|i| Message::text(format!("m{i}")).group(group)).collect()
}

/// Three brokers of eight workers each, with a limit of five in flight: never more than
/// five handlers at once, and five are reached.
async fn racing_claims_stay_within_max_running<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_run"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 3).await;
    queues[0].set_limit(&LimitScope::Queue, Limit::MaxRunning(5)).await.unwrap();
    publish(&queues[0], texts(120, "")).await;
    let meter = Arc::new(Meter::default());
    let tasks: Vec<_> = queues.iter().map(|q| consume(q, "", 8, Duration::from_millis(25), &meter)).collect();
    meter.wait_done(120).await;
    assert_eq!(meter.most(), 5, "at most five at once, and five were reached");
    shutdown(brokers, tasks).await;
    queues[0].undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(racing_claims_stay_within_max_running);

/// Two messages of a key at once with `PerKey(2)`, across brokers, and still one at once
/// on a queue without it.
async fn per_key_runs_n_of_a_key<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_key"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 2).await;
    queues[0].set_limit(&LimitScope::Group(String::new()), Limit::PerKey(2)).await.unwrap();
    let keyed = (0..30).map(|i| Message::text(format!("m{i}")).key(if i % 2 == 0 { "a" } else { "b" }));
    publish(&queues[0], keyed).await;
    let meter = Arc::new(Meter::default());
    let tasks: Vec<_> = queues.iter().map(|q| consume(q, "", 6, Duration::from_millis(30), &meter)).collect();
    meter.wait_done(30).await;
    let key_most = meter.state.lock().unwrap().key_most.clone();
    assert_eq!(key_most.get("a"), Some(&2), "{key_most:?}");
    assert_eq!(key_most.get("b"), Some(&2), "{key_most:?}");
    shutdown(brokers, tasks).await;
    queues[0].undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(per_key_runs_n_of_a_key);

/// A limit on group `a` leaves group `b` alone.
async fn group_limit_leaves_other_groups<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_grp"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 1).await;
    let q = &queues[0];
    q.set_limit(&LimitScope::Group("a".into()), Limit::MaxRunning(1)).await.unwrap();
    publish(q, texts(8, "a").into_iter().chain(texts(8, "b"))).await;
    let (a, b) = (Arc::new(Meter::default()), Arc::new(Meter::default()));
    let tasks = vec![
        consume(q, "a", 4, Duration::from_millis(60), &a),
        consume(q, "b", 4, Duration::from_millis(60), &b),
    ];
    a.wait_done(8).await;
    b.wait_done(8).await;
    assert_eq!(a.most(), 1);
    assert_eq!(b.most(), 4, "group b is not limited");
    shutdown(brokers, tasks).await;
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(group_limit_leaves_other_groups);

/// A limit raised and lowered while consumers run: the next claims obey it.
async fn limit_changes_while_running<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_chg"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 2).await;
    let q = &queues[0];
    let hold = Duration::from_millis(40);
    // No limit yet: consumers running, then the limit comes.
    let meter = Arc::new(Meter::default());
    let tasks: Vec<_> = queues.iter().map(|q| consume(q, "", 4, hold, &meter)).collect();
    publish(q, texts(200, "")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    q.set_limit(&LimitScope::Queue, Limit::MaxRunning(1)).await.unwrap();
    // What was claimed before the limit (a message per worker, and those claimed ahead)
    // runs as claimed: once it has all been handled, what runs was claimed under the
    // limit. A claim sent before the limit came returns within the hold.
    tokio::time::sleep(hold).await;
    let claimed: u64 = brokers.iter().map(|b| b.stats().claimed).sum();
    while meter.done() < claimed as usize {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    meter.reset_most();
    let before = meter.done();
    while meter.done() < before + 10 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(meter.most(), 1, "one at once");
    q.set_limit(&LimitScope::Queue, Limit::MaxRunning(3)).await.unwrap();
    meter.reset_most();
    let before = meter.done();
    while meter.done() < before + 30 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(meter.most(), 3, "three at once after the raise");
    assert!(q.clear_limit(&LimitScope::Queue).await.unwrap());
    assert!(q.limits().await.unwrap().is_empty());
    meter.wait_done(200).await;
    assert!(meter.most() > 3, "unlimited again: {}", meter.most());
    shutdown(brokers, tasks).await;
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(limit_changes_while_running);

/// A message whose lease ran out no longer holds its slot.
async fn expired_lease_frees_its_slot<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_exp"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 2).await;
    queues[0].set_limit(&LimitScope::Queue, Limit::MaxRunning(1)).await.unwrap();
    publish(&queues[0], texts(2, "")).await;
    // A consumer that claims one and never settles it (a process that died).
    let mut held = queues[0].subscribe().lease(Duration::from_millis(1500)).batch(5).stream().await.unwrap();
    let first = futures::StreamExt::next(&mut held).await.unwrap().unwrap();
    let status = queues[0].limits().await.unwrap();
    assert_eq!((status[0].running, status[0].ready, status[0].held), (1, 1, 1), "{status:?}");
    assert_eq!(queues[0].limited().await.unwrap(), 1);
    let meter = Arc::new(Meter::default());
    let claimed = Instant::now();
    let task = consume(&queues[1], "", 4, Duration::ZERO, &meter);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(meter.done(), 0, "the slot is held while the lease runs");
    meter.wait_done(2).await;
    assert!(claimed.elapsed() >= Duration::from_millis(1400), "handled once the lease ran out");
    drop(first);
    drop(held);
    shutdown(brokers, vec![task]).await;
    queues[0].undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(expired_lease_frees_its_slot);

/// Three brokers drain 600 messages under 50/s: no second holds more than 50 starts.
async fn rate_limit_spreads_starts<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_rate"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 3).await;
    let rate: Rate = "50/s".parse().unwrap();
    queues[0].set_limit(&LimitScope::Queue, Limit::Rate(rate)).await.unwrap();
    publish(&queues[0], texts(600, "")).await;
    let meter = Arc::new(Meter::default());
    let tasks: Vec<_> = queues.iter().map(|q| consume(q, "", 8, Duration::from_millis(5), &meter)).collect();
    meter.wait_done(600).await;
    let mut starts = meter.state.lock().unwrap().starts.clone();
    starts.sort();
    let most = most_in_window(&starts, Duration::from_secs(1));
    assert!(most <= 50, "{most} starts in one second");
    let span = starts[599] - starts[0];
    assert!(span >= Duration::from_millis(10_900), "600 at 50/s take 11 s at least, took {span:?}");
    shutdown(brokers, tasks).await;
    queues[0].undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(rate_limit_spreads_starts);

/// Three brokers of eight workers race under 20/s while, every other period's worth of
/// starts, their handlers hold a runtime thread a moment as they begin (a busy process):
/// the gap between a claim and its handlers' beginnings is widened on purpose, past the
/// rate's guard, in one period and not in the next. Measured where the handlers begin,
/// no second holds more than 20 starts, and every message is handled.
async fn rate_holds_at_handler_start<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_late"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 3).await;
    queues[0].set_limit(&LimitScope::Queue, Limit::Rate("20/s".parse().unwrap())).await.unwrap();
    publish(&queues[0], texts(60, "")).await;
    let meter = Arc::new(Meter::default());
    let begun = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = queues
        .iter()
        .map(|q| {
            let (meter, begun) = (meter.clone(), begun.clone());
            let sub = q.subscribe().workers(8);
            tokio::spawn(async move {
                sub.run(move |_delivery| {
                    let (meter, begun) = (meter.clone(), begun.clone());
                    async move {
                        meter.start(None);
                        let n = begun.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if (n / 20) % 2 == 0 {
                            // Blocks the runtime's thread: the other handlers' beginnings wait.
                            std::thread::sleep(Duration::from_millis(40));
                        }
                        meter.end(None);
                        Ok::<_, Error>(())
                    }
                })
                .await
                .unwrap()
            })
        })
        .collect();
    meter.wait_done(60).await;
    let mut starts = meter.state.lock().unwrap().starts.clone();
    starts.sort();
    let most = most_in_window(&starts, Duration::from_secs(1));
    assert!(most <= 20, "{most} handlers began in one second under 20/s");
    shutdown(brokers, tasks).await;
    queues[0].undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(rate_holds_at_handler_start);

/// A burst of 1 spreads the starts of 10/s evenly over two brokers: one every 100 ms (a
/// start may be late by the guard, 100 ms), where without it ten begin at once.
async fn burst_of_one_spreads_starts<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_burst"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 2).await;
    let rate: Rate = "10/s".parse().unwrap();
    queues[0].set_limit(&LimitScope::Queue, Limit::Rate(rate.with_burst(1))).await.unwrap();
    assert_eq!(queues[1].limits().await.unwrap()[0].rate, Some(rate.with_burst(1)));
    publish(&queues[0], texts(20, "")).await;
    let meter = Arc::new(Meter::default());
    let tasks: Vec<_> = queues.iter().map(|q| consume(q, "", 4, Duration::from_millis(5), &meter)).collect();
    meter.wait_done(20).await;
    let mut starts = meter.state.lock().unwrap().starts.clone();
    starts.sort();
    let most = most_in_window(&starts, Duration::from_millis(400));
    assert!(most <= 5, "{most} starts in 400 ms at 10/s, burst 1");
    let span = starts[19] - starts[0];
    assert!(span >= Duration::from_millis(1_800), "20 at 10/s, burst 1, took {span:?}");
    shutdown(brokers, tasks).await;
    queues[0].undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(burst_of_one_spreads_starts);

/// A transactional handler of a limited group is refused at its start, typed; so is one
/// of any group under a whole-queue limit; without limits it runs.
async fn transactional_handlers_refuse_limited_groups<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_tx"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 1).await;
    let q = &queues[0];
    q.set_limit(&LimitScope::Group("g".into()), Limit::MaxRunning(2)).await.unwrap();
    let run = q.subscribe().group("g").run_tx(|_, _| Box::pin(async { Ok::<_, Error>(()) }));
    match run.await {
        Err(Error::LimitedTransactional { table, group }) => {
            assert_eq!((table, group), (name.clone(), "g".into()))
        }
        other => panic!("expected LimitedTransactional, got {other:?}"),
    }
    q.set_limit(&LimitScope::Queue, Limit::Rate("5/s".parse().unwrap())).await.unwrap();
    let run = q.subscribe().group("other").run_batch_tx(|_, _| Box::pin(async { Ok::<_, Error>(()) }));
    assert!(matches!(run.await, Err(Error::LimitedTransactional { .. })));
    q.clear_limit(&LimitScope::Queue).await.unwrap();
    q.clear_limit(&LimitScope::Group("g".into())).await.unwrap();
    q.publish(Message::text("tx").group("g")).await.unwrap();
    let (done, handled) = tokio::sync::oneshot::channel::<()>();
    let done = Arc::new(Mutex::new(Some(done)));
    let sub = q.subscribe().group("g").until(async move { drop(handled.await) });
    sub.run_tx(move |_, _| {
        let done = done.clone();
        Box::pin(async move {
            if let Some(done) = done.lock().unwrap().take() {
                let _ = done.send(());
            }
            Ok::<_, Error>(())
        })
    })
    .await
    .unwrap();
    shutdown(brokers, vec![]).await;
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(transactional_handlers_refuse_limited_groups);

/// The most of `sorted` times in any window `window` long (half open).
fn most_in_window(sorted: &[Instant], window: Duration) -> usize {
    let mut most = 0;
    let mut first = 0;
    for (i, t) in sorted.iter().enumerate() {
        while *t - sorted[first] >= window {
            first += 1;
        }
        most = most.max(i + 1 - first);
    }
    most
}

/// Limits are refused out of range, read back as set, and cleared scope by scope.
async fn limits_read_back<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_list"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 1).await;
    let q = &queues[0];
    for bad in [Limit::MaxRunning(0), Limit::PerKey(0), Limit::MaxRunning(u64::MAX)] {
        assert!(matches!(q.set_limit(&LimitScope::Queue, bad).await, Err(Error::InvalidLimit { .. })));
    }
    assert!(
        "0/s".parse::<Rate>().is_err() && "5/d".parse::<Rate>().is_err() && "x/s".parse::<Rate>().is_err()
    );
    q.set_limit(&LimitScope::Queue, Limit::MaxRunning(7)).await.unwrap();
    q.set_limit(&LimitScope::Queue, Limit::Rate("10/m".parse().unwrap())).await.unwrap();
    q.set_limit(&LimitScope::Group("g".into()), Limit::PerKey(3)).await.unwrap();
    let all = q.limits().await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].scope, LimitScope::Queue);
    assert_eq!((all[0].max_running, all[0].per_key), (Some(7), None));
    assert_eq!(all[0].rate.unwrap().to_string(), "10/m");
    assert_eq!(all[1].scope, LimitScope::Group("g".into()));
    assert_eq!((all[1].max_running, all[1].per_key, all[1].rate), (None, Some(3), None));
    assert!(q.clear_limit(&LimitScope::Group("g".into())).await.unwrap());
    assert!(!q.clear_limit(&LimitScope::Group("g".into())).await.unwrap());
    assert_eq!(q.limits().await.unwrap().len(), 1);
    shutdown(brokers, vec![]).await;
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(limits_read_back);

/// A queue deployed before limits (its limits tables dropped here) cannot be claimed
/// from and says to deploy; deploying it again adds the tables and keeps its messages.
async fn deploy_adds_the_limits_tables<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_old"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 1).await;
    let q = &queues[0];
    q.publish(Message::text("old")).await.unwrap();
    drop_limits_tables(&place, &name).await;
    let mut sub = q.subscribe().stream().await.unwrap();
    match futures::StreamExt::next(&mut sub).await.unwrap() {
        Err(Error::MissingLimitsTable { table }) => assert_eq!(table, name),
        other => panic!("expected MissingLimitsTable, got {other:?}"),
    }
    drop(sub);
    let err = q.set_limit(&LimitScope::Queue, Limit::MaxRunning(1)).await.unwrap_err();
    assert!(err.is_permanent() && err.to_string().contains("rowbus deploy --queue"), "{err}");
    q.deploy().await.unwrap();
    q.set_limit(&LimitScope::Queue, Limit::MaxRunning(1)).await.unwrap();
    let mut sub = q.subscribe().stream().await.unwrap();
    let got = futures::StreamExt::next(&mut sub).await.unwrap().unwrap();
    assert_eq!(got.text().unwrap(), "old");
    got.ack().await.unwrap();
    drop(sub);
    shutdown(brokers, vec![]).await;
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(deploy_adds_the_limits_tables);

/// A limits table made before bursts (its two newest columns dropped here): a rate
/// cannot be set; a deploy adds the columns, and keeps the limits it had.
async fn deploy_adds_the_burst_columns<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("lim_burstcol"));
    let (brokers, queues) = brokers::<DB>(&place, &name, 1).await;
    let q = &queues[0];
    q.set_limit(&LimitScope::Queue, Limit::MaxRunning(3)).await.unwrap();
    for column in ["rate_burst", "rate_next_us"] {
        let sql = format!("ALTER TABLE {name}_limits DROP COLUMN {column}");
        execute(&place, &sql).await;
    }
    let rate = Rate::new(4, Duration::from_secs(60)).with_burst(2);
    let err = q.set_limit(&LimitScope::Queue, Limit::Rate(rate)).await.unwrap_err();
    assert!(matches!(err, Error::MissingLimitsTable { .. }), "{err}");
    assert!(matches!(q.limits().await, Err(Error::MissingLimitsTable { .. })));
    q.deploy().await.unwrap();
    q.set_limit(&LimitScope::Queue, Limit::Rate(rate)).await.unwrap();
    let all = q.limits().await.unwrap();
    assert_eq!((all[0].max_running, all[0].rate), (Some(3), Some(rate)));
    assert_eq!(all[0].rate.unwrap().to_string(), "4/m, burst 2");
    let bad = Rate::new(4, Duration::from_secs(60)).with_burst(5);
    assert!(matches!(
        q.set_limit(&LimitScope::Queue, Limit::Rate(bad)).await,
        Err(Error::InvalidLimit { .. })
    ));
    shutdown(brokers, vec![]).await;
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(deploy_adds_the_burst_columns);

/// Runs `sql` on the place's database.
async fn execute(place: &Place, sql: &str) {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    match place.pool().await {
        DbPool::Postgres(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
        DbPool::MySql(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
        DbPool::Sqlite(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
    }
}

/// Drops `<name>_limits` and `<name>_starts`, as a queue deployed by an older rowbus
/// lacks them.
async fn drop_limits_tables(place: &Place, name: &str) {
    for table in [format!("{name}_limits"), format!("{name}_starts")] {
        let sql = sqlx::AssertSqlSafe(format!("DROP TABLE {table}"));
        match place.pool().await {
            DbPool::Postgres(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
            DbPool::MySql(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
            DbPool::Sqlite(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
        }
    }
}
