//! Schedules against the real PostgreSQL and MariaDB and a temporary SQLite file: every
//! and cron schedules publish through running subscriptions; several brokers (as several
//! processes would be) running the same schedules publish each tick once; ticks missed
//! while no broker ran are published once at the next start; adding, replacing, listing
//! and removing, also while brokers run; a queue deployed before schedules.
//!
//! Time is driven where it can be: the tests that are about which ticks go out move a
//! schedule's `since_us` back in the database rather than waiting for ticks hours apart.

use crate::common;

use std::time::Duration;

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use futures::StreamExt as _;
use rowbus::schedule::{Schedule, ScheduleChange, When};
use rowbus::{Broker, BrokerOptions, Error, Message, Queue};

/// How long a tick that is due may take to be published and seen.
const ARRIVES: Duration = Duration::from_secs(20);
/// How long a test watches for a message that must not come: many re-reads
/// ([`options`]) and many 200 ms ticks.
const QUIET: Duration = Duration::from_millis(1500);
const HOUR_US: i64 = 3_600_000_000;

use common::place_test as database_test;

/// The ticks recorded for schedule `name` of queue `q`, in order.
async fn ticks(place: &Place, q: &str, name: &str) -> Vec<i64> {
    place.ints(format!("SELECT tick_us FROM {q}_ticks WHERE schedule_name = '{name}' ORDER BY tick_us")).await
}

/// Short polls and re-reads, so that tests see changes quickly.
fn options() -> BrokerOptions {
    BrokerOptions {
        poll_interval: Duration::from_millis(50),
        schedule_reread: Duration::from_millis(100),
        ..BrokerOptions::default()
    }
}

/// A deployed queue of the test's own, dropped by `cleanup` whatever happens.
async fn queue<DB: Brokers>(place: &Place, cleanup: &Cleanup, prefix: &str) -> (Broker<DB>, Queue<DB>) {
    let broker = DB::broker(place, options()).await;
    let q = broker.queue(&cleanup.queue(&unique(prefix))).unwrap();
    q.deploy().await.unwrap();
    (broker, q)
}

/// A broker running `q`'s schedules through an idle subscription of a group nothing is
/// published to: the ticks stay in the table to be counted.
async fn runner<DB: Brokers>(place: &Place, q: &Queue<DB>) -> Broker<DB> {
    let broker = DB::broker(place, options()).await;
    let queue = broker.queue(q.table().channel()).unwrap();
    tokio::spawn(async move {
        queue.subscribe().group("idle").run(|_| async { Ok::<_, Error>(()) }).await.unwrap();
    });
    broker
}

/// Waits until `check` holds, polling; fails the test after [`ARRIVES`].
async fn until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + ARRIVES;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {ARRIVES:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An every and a cron schedule publish through a running stream subscription, each tick
/// with the schedule's payload and group; the list shows their last and next ticks.
async fn every_and_cron_schedules_publish<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (broker, q) = queue::<DB>(&place, &cleanup, "sch_pub").await;
    let every = Schedule::every(Duration::from_millis(200)).payload("fast").group("g");
    assert_eq!(q.schedule("fast", every).await.unwrap(), ScheduleChange::Added);
    let cron = Schedule::cron("* * * * * *").unwrap().payload("second").group("g");
    assert_eq!(q.schedule("each-second", cron).await.unwrap(), ScheduleChange::Added);

    let mut sub = q.subscribe().group("g").stream().await.unwrap();
    let (mut fast, mut second) = (0, 0);
    while fast < 3 || second < 2 {
        let delivery = tokio::time::timeout(ARRIVES, sub.next())
            .await
            .expect("ticks within 20 s")
            .expect("the stream goes on")
            .expect("a claim");
        assert_eq!(delivery.group(), "g");
        let tick: i64 =
            delivery.header(rowbus::schedule::TICK_HEADER).expect("the tick's time").parse().unwrap();
        assert!(
            tick > 0
                && tick
                    <= delivery.published_at().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros()
                        as i64
                        + 1_000_000
        );
        match delivery.text().unwrap() {
            "fast" => {
                assert_eq!(delivery.header(rowbus::schedule::SCHEDULE_HEADER), Some("fast"));
                fast += 1
            }
            "second" => second += 1,
            other => panic!("unexpected payload {other:?}"),
        }
        delivery.ack().await.unwrap();
    }
    let listed = q.schedules().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["each-second", "fast"]);
    for s in &listed {
        let (last, next) = (s.last_tick.expect("a tick published"), s.next_tick.expect("a next tick"));
        assert!(s.since < last && last < next, "{s:?}");
    }
    assert_eq!(listed[1].schedule.when, When::Every(Duration::from_millis(200)));
    assert_eq!(listed[0].schedule.when, When::Cron("* * * * * *".to_owned()));
    drop(sub);
    broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(every_and_cron_schedules_publish);

/// Three brokers run one 200 ms schedule for a couple of seconds: every tick between the
/// first and the last is recorded, and the queue holds exactly one message per tick.
async fn three_brokers_publish_each_tick_once<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (admin, q) = queue::<DB>(&place, &cleanup, "sch_once").await;
    let name = q.table().channel().to_owned();
    let brokers = [runner(&place, &q).await, runner(&place, &q).await, runner(&place, &q).await];
    q.schedule("tick", Schedule::every(Duration::from_millis(200)).payload("t").group("ticks"))
        .await
        .unwrap();

    let (p, n) = (&place, name.as_str());
    until("ten ticks", || async move { ticks(p, n, "tick").await.len() >= 10 }).await;
    for broker in &brokers {
        broker.shutdown(Duration::from_secs(1)).await;
    }
    // A tick's record and its message commit together: nothing half-done is counted.
    let ticks = ticks(&place, &name, "tick").await;
    let (depth, _) = q.depth("ticks").await.unwrap();
    assert_eq!(depth, ticks.len() as i64, "one message per recorded tick");
    assert!(ticks.windows(2).all(|w| w[1] - w[0] == 200_000), "every tick in between, none twice: {ticks:?}");
    admin.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(three_brokers_publish_each_tick_once);

/// Ten hourly ticks missed while no broker ran: a broker that starts publishes one, the
/// latest; a start with nothing missed publishes nothing; a start with other ticks missed
/// publishes one again.
async fn missed_ticks_are_published_once_at_a_start<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (admin, q) = queue::<DB>(&place, &cleanup, "sch_miss").await;
    let name = q.table().channel().to_owned();
    q.schedule("hourly", Schedule::every(Duration::from_secs(3600)).payload("h").group("ticks"))
        .await
        .unwrap();
    // As if it had been added ten and a half hours ago, and no broker had run since.
    place.exec(format!("UPDATE {name}_sched SET since_us = since_us - {}", 21 * HOUR_US / 2)).await;
    let since = place.ints(format!("SELECT since_us FROM {name}_sched")).await[0];

    let (p, n) = (&place, name.as_str());
    let first = runner(&place, &q).await;
    until("the missed tick", || async move { !ticks(p, n, "hourly").await.is_empty() }).await;
    tokio::time::sleep(QUIET).await;
    first.shutdown(Duration::from_secs(1)).await;
    assert_eq!(ticks(&place, &name, "hourly").await, [since + 10 * HOUR_US], "only the latest missed tick");
    assert_eq!(q.depth("ticks").await.unwrap().0, 1);

    // Started again with nothing missed since: nothing more.
    let again = runner(&place, &q).await;
    tokio::time::sleep(QUIET).await;
    again.shutdown(Duration::from_secs(1)).await;
    assert_eq!(q.depth("ticks").await.unwrap().0, 1, "a start with nothing missed publishes nothing");

    // Moved back by another two and a quarter hours: the latest tick is now one that was
    // never published (a whole number of hours would land on the one that was): one more.
    place.exec(format!("UPDATE {name}_sched SET since_us = since_us - {}", 9 * HOUR_US / 4)).await;
    let third = runner(&place, &q).await;
    until("the next missed tick", || async move { ticks(p, n, "hourly").await.len() == 2 }).await;
    tokio::time::sleep(QUIET).await;
    third.shutdown(Duration::from_secs(1)).await;
    assert_eq!(ticks(&place, &name, "hourly").await.len(), 2);
    assert_eq!(q.depth("ticks").await.unwrap().0, 2);
    admin.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(missed_ticks_are_published_once_at_a_start);

/// Added, unchanged, replaced, listed and removed; a replacement's ticks carry the new
/// payload, and a removal stops a running broker's ticks (without waiting for a re-read:
/// the tick's transaction checks the definition). A subscription with schedules off
/// publishes none.
async fn schedules_are_added_replaced_listed_and_removed<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (admin, q) = queue::<DB>(&place, &cleanup, "sch_admin").await;
    let name = q.table().channel().to_owned();
    let every = Schedule::every(Duration::from_millis(200)).payload("one").group("ticks");
    assert_eq!(q.schedule("s", every.clone()).await.unwrap(), ScheduleChange::Added);
    assert_eq!(q.schedule("s", every.clone()).await.unwrap(), ScheduleChange::Unchanged);
    let since = q.schedules().await.unwrap()[0].since;

    // A subscription with schedules off runs none.
    let off = DB::broker(&place, options()).await;
    let off_queue = off.queue(&name).unwrap();
    tokio::spawn(async move {
        let sub = off_queue.subscribe().group("idle").schedules(false);
        sub.run(|_| async { Ok::<_, Error>(()) }).await.unwrap();
    });
    tokio::time::sleep(QUIET).await;
    assert_eq!(q.depth("ticks").await.unwrap().0, 0, "schedules off: nothing published");

    let running = runner(&place, &q).await;
    let mut sub = q.subscribe().group("ticks").schedules(false).stream().await.unwrap();
    let next = async |sub: &mut rowbus::Subscription<DB>| {
        let d = common::next_delivery(sub).await;
        let text = d.text().unwrap().to_owned();
        d.ack().await.unwrap();
        text
    };
    assert_eq!(next(&mut sub).await, "one");

    let two = every.clone().payload("two");
    assert_eq!(q.schedule("s", two.clone()).await.unwrap(), ScheduleChange::Replaced);
    let listed = q.schedules().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].name.as_str(), &listed[0].schedule), ("s", &two));
    assert!(listed[0].since > since, "a replacement counts its ticks from then");
    // What was published before the replacement may still be in the queue.
    while next(&mut sub).await != "two" {}

    assert!(q.unschedule("s").await.unwrap());
    assert!(!q.unschedule("s").await.unwrap());
    assert!(q.schedules().await.unwrap().is_empty());
    assert!(ticks(&place, &name, "s").await.is_empty(), "its ticks go with it");
    // A tick in flight at the removal may still arrive; none after it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = q.depth("ticks").await.unwrap().0;
    tokio::time::sleep(QUIET).await;
    assert_eq!(q.depth("ticks").await.unwrap().0, before, "no tick after the removal");

    drop(sub);
    running.shutdown(Duration::from_secs(1)).await;
    off.shutdown(Duration::from_secs(1)).await;
    admin.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(schedules_are_added_replaced_listed_and_removed);

/// Bad names, intervals and cron expressions are refused before anything is stored, each
/// naming what is wrong.
async fn bad_schedules_are_refused<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (broker, q) = queue::<DB>(&place, &cleanup, "sch_bad").await;
    let every = Schedule::every(Duration::from_secs(1));
    let err = q.schedule("no spaces", every.clone()).await.unwrap_err();
    assert!(matches!(&err, Error::InvalidSchedule { name, .. } if name == "no spaces"), "{err}");
    let err = q.schedule("fast", Schedule::every(Duration::from_millis(10))).await.unwrap_err();
    assert!(err.to_string().contains("under the least"), "{err}");
    let err = Schedule::cron("0 3 * *").unwrap_err();
    assert!(matches!(&err, Error::InvalidCron { expr, .. } if expr == "0 3 * *"), "{err}");
    let bad_cron =
        Schedule { when: When::Cron("nope".to_owned()), payload: String::new(), group: String::new() };
    assert!(matches!(q.schedule("c", bad_cron).await, Err(Error::InvalidCron { .. })));
    assert!(q.schedules().await.unwrap().is_empty());
    broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(bad_schedules_are_refused);

/// A queue deployed before schedules: storing one names the missing tables and the
/// command that adds them; a consumer runs all the same; a new deploy adds them and
/// keeps the messages.
async fn deploy_adds_the_schedule_tables<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (broker, q) = queue::<DB>(&place, &cleanup, "sch_old").await;
    let name = q.table().channel().to_owned();
    place.exec(format!("DROP TABLE {name}_sched")).await;
    place.exec(format!("DROP TABLE {name}_ticks")).await;
    q.publish(Message::text("kept")).await.unwrap();
    let err = q.schedule("s", Schedule::every(Duration::from_secs(1))).await.unwrap_err();
    assert!(matches!(err, Error::MissingScheduleTable { .. }), "{err}");
    assert!(err.to_string().contains("rowbus deploy --queue"), "{err}");
    assert!(err.is_permanent());
    // Its consumers go on: the scheduler says why it cannot run, and waits.
    let mut sub = q.subscribe().stream().await.unwrap();
    assert_eq!(common::next_delivery(&mut sub).await.text().unwrap(), "kept");
    drop(sub);

    q.deploy().await.unwrap();
    assert_eq!(
        q.schedule("s", Schedule::every(Duration::from_secs(1))).await.unwrap(),
        ScheduleChange::Added
    );
    assert_eq!(q.depth("").await.unwrap().0, 1, "the message is kept");
    broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(deploy_adds_the_schedule_tables);

/// Old tick rows go in batches of 1,000 (each pass that follows a published tick deletes
/// one batch), and the recent ones stay.
async fn old_ticks_are_cleaned_up_in_batches<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (admin, q) = queue::<DB>(&place, &cleanup, "sch_clean").await;
    let name = q.table().channel().to_owned();
    q.schedule("tick", Schedule::every(Duration::from_millis(200)).group("ticks")).await.unwrap();
    // 2,500 ticks of a day ago, as if recorded then.
    let day_ago = place.ints(format!("SELECT since_us FROM {name}_sched")).await[0] - 24 * HOUR_US;
    let rows: Vec<String> = (0..2500).map(|i| format!("('tick', {})", day_ago + i * 200_000)).collect();
    place.exec(format!("INSERT INTO {name}_ticks (schedule_name, tick_us) VALUES {}", rows.join(", "))).await;
    let old = format!("SELECT COUNT(*) FROM {name}_ticks WHERE tick_us < {}", day_ago + HOUR_US);

    // Passes at least 300 ms apart: each batch is seen on its own.
    let broker =
        DB::broker(&place, BrokerOptions { schedule_reread: Duration::from_millis(300), ..options() }).await;
    let queue = broker.queue(&name).unwrap();
    tokio::spawn(async move {
        queue.subscribe().group("idle").run(|_| async { Ok::<_, Error>(()) }).await.unwrap();
    });
    let mut seen = vec![2500];
    let deadline = tokio::time::Instant::now() + ARRIVES;
    while *seen.last().unwrap() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "old ticks left: {seen:?}");
        let count = place.ints(old.clone()).await[0];
        if count != *seen.last().unwrap() {
            seen.push(count);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.shutdown(Duration::from_secs(1)).await;
    assert!(seen.iter().all(|n| [2500, 1500, 500, 0].contains(n)), "not in batches of 1,000: {seen:?}");
    assert!(seen.contains(&1500) || seen.contains(&500), "all at once: {seen:?}");
    let ticks = ticks(&place, &name, "tick").await;
    assert!(!ticks.is_empty() && ticks[0] > day_ago + HOUR_US, "the recent ticks stay: {ticks:?}");
    admin.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(old_ticks_are_cleaned_up_in_batches);
