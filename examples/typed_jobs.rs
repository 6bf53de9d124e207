//! A typed JSON job, retried with backoff when its handler fails, and the dead letters
//! inspected afterwards.
//!
//! `cargo run -p rowbus-examples --example typed_jobs` publishes five resize jobs, one of
//! them for an image the handler cannot read; the four others are done at once, the
//! fifth fails three times (retried after 50 ms, then 100 ms) and is dead-lettered; the
//! example then lists the dead letters with their errors, and exits.

use std::time::Duration;

use rowbus::dead::{DeadLetterPage, DeadLetters};
use rowbus::sqlx::Sqlite;
use rowbus::{Broker, BrokerOptions, Message, RetryPolicy};
use rowbus_examples::TempDatabase;
use serde::{Deserialize, Serialize};

/// The job: what a publisher sends and the handler reads back, as JSON.
#[derive(Debug, Serialize, Deserialize)]
struct Resize {
    image: String,
    width: u32,
}

/// The handler: an `Err` fails the attempt (retried, then dead-lettered with the error).
async fn resize(job: Resize, attempt: u32) -> Result<(), String> {
    if job.image.ends_with(".broken") {
        println!("handler: {} failed (attempt {attempt})", job.image);
        return Err(format!("cannot decode {}", job.image));
    }
    println!("handler: {} resized to {}px (attempt {attempt})", job.image, job.width);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database = TempDatabase::new("typed_jobs");
    let pool = rowbus::connect_creating::<Sqlite>(&database.url(), 4).await?;
    let options = BrokerOptions {
        retry: RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(50),
            factor: 2.0,
            max_delay: Duration::from_secs(1),
        },
        ..BrokerOptions::default()
    };
    let broker = Broker::new(pool, options).await?;
    let jobs = broker.queue("resize_jobs")?;
    jobs.deploy().await?;

    let images = ["a.png", "b.png", "c.jpg", "d.gif", "e.broken"];
    let messages = images
        .iter()
        .map(|image| Message::json(&Resize { image: (*image).into(), width: 640 }))
        .collect::<Result<Vec<_>, _>>()?;
    jobs.publish_batch(messages).await?;

    let worker = tokio::spawn(jobs.subscribe().workers(4).run(|delivery| async move {
        // A payload that is not a `Resize` fails too, with the decoding error.
        let job: Resize = delivery.json().map_err(|e| e.to_string())?;
        resize(job, delivery.attempt()).await
    }));

    // Wait until the queue is empty: four acknowledged, one dead-lettered.
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let groups = jobs.group_stats().await?;
            let (depth, dead) =
                groups.iter().fold((0, 0), |(d, x), g| (d + g.depth, x + g.dead.unwrap_or(0)));
            if depth == 0 && dead == 1 {
                return Ok::<_, rowbus::Error>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await??;
    broker.shutdown(Duration::from_secs(5)).await;
    worker.await??;

    for dead in jobs.dead_letters(&DeadLetterPage::default()).await? {
        let job: Resize = serde_json::from_slice(&dead.payload)?;
        println!(
            "dead letter {}: {} after {} attempts: {}",
            dead.id,
            job.image,
            dead.attempts,
            dead.last_error.as_deref().unwrap_or("-")
        );
    }
    // Once the cause is fixed, `requeue_dead` puts them back; here they are purged.
    let purged = jobs.purge_dead(&DeadLetters::All).await?;
    println!("{purged} dead letter purged");
    Ok(())
}
