//! Schedules: a message published on a timetable, by whichever consumer of the queue is
//! running (each tick once, however many run).
//!
//! `cargo run -p rowbus-examples --example cron_schedule` schedules a heartbeat every
//! second and a cron job every two seconds (`*/2 * * * * *`: six fields, seconds first),
//! handles ticks for about five seconds, lists the schedules with their next ticks, and
//! exits.

use std::time::{Duration, SystemTime};

use rowbus::schedule::{SCHEDULE_HEADER, Schedule};
use rowbus::sqlx::Sqlite;
use rowbus::{Broker, BrokerOptions};
use rowbus_examples::TempDatabase;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database = TempDatabase::new("cron_schedule");
    let pool = rowbus::connect_creating::<Sqlite>(&database.url(), 4).await?;
    let broker = Broker::new(pool, BrokerOptions::default()).await?;
    let jobs = broker.queue("timed_jobs")?;
    jobs.deploy().await?;

    // Stored in the database: every consumer of the queue sees them, and a restart keeps them.
    jobs.schedule("heartbeat", Schedule::every(Duration::from_secs(1)).payload("ping")).await?;
    jobs.schedule("report", Schedule::cron("*/2 * * * * *")?.payload("build the report")).await?;

    let started = SystemTime::now();
    let stop = tokio::time::sleep(Duration::from_millis(5_500));
    let consumer = jobs.subscribe().until(stop).run(move |delivery| async move {
        let at = delivery.published_at().duration_since(started).unwrap_or_default();
        println!(
            "{:>5.1}s  {:<9} {}",
            at.as_secs_f64(),
            delivery.header(SCHEDULE_HEADER).unwrap_or("-"),
            delivery.text()?
        );
        Ok::<_, rowbus::Error>(())
    });
    consumer.await?;

    for schedule in jobs.schedules().await? {
        let next = schedule.next_tick.and_then(|t| t.duration_since(SystemTime::now()).ok());
        println!("{}: next tick in {:.1}s", schedule.name, next.unwrap_or_default().as_secs_f64());
    }
    jobs.unschedule("heartbeat").await?;
    broker.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
