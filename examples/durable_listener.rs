//! A durable listener: notifications committed while it was down are delivered when it
//! comes back under the same name.
//!
//! `cargo run -p rowbus-examples --example durable_listener` listens on `orders` as
//! `audit`, receives and acknowledges three notifications, stops (as a restarted process
//! would), misses three more sent meanwhile, starts again under the same name, and gets
//! exactly those three.

use std::time::Duration;

use rowbus::durable::Resume;
use rowbus::{DbPool, Event, Listener, ListenerOptions, NotifyConfig};
use rowbus_examples::TempDatabase;

/// The listener's options: the notify table polled every 50 ms.
fn options() -> ListenerOptions {
    let notify_table = NotifyConfig { poll_interval: Duration::from_millis(50), ..NotifyConfig::default() };
    ListenerOptions { notify_table, ..ListenerOptions::default() }
}

/// The next `n` notifications' payloads.
async fn receive(listener: &mut Listener, n: usize) -> Result<Vec<String>, rowbus::Error> {
    let mut payloads = Vec::new();
    while payloads.len() < n {
        if let Event::Notification(notification) = listener.recv().await? {
            payloads.push(notification.payload);
        }
    }
    Ok(payloads)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database = TempDatabase::new("durable_listener");
    let url = database.url();
    let db = DbPool::connect_creating(&url, 2).await?;
    // The notify table and the table of durable listeners' positions.
    db.deploy_notify_table(&options().notify_table).await?;

    let mut listener = Listener::connect_with(&url, options()).await?;
    assert_eq!(listener.listen_durable("orders", "audit").await?, Resume::New);
    for n in 1..=3 {
        db.notify("orders", &format!("order {n}")).await?;
    }
    println!("first run: {:?}", receive(&mut listener, 3).await?);
    // Stored: a listener that takes the name next resumes after these.
    listener.ack("orders").await?;
    drop(listener);

    for n in 4..=6 {
        db.notify("orders", &format!("order {n}")).await?;
    }
    println!("sent order 4 to 6 while no listener ran");

    let mut listener = Listener::connect_with(&url, options()).await?;
    assert_eq!(listener.listen_durable("orders", "audit").await?, Resume::Resumed);
    let missed = receive(&mut listener, 3).await?;
    println!("after the restart: {missed:?}");
    assert_eq!(missed, ["order 4", "order 5", "order 6"]);
    listener.ack("orders").await?;
    drop(listener);
    db.close().await;
    Ok(())
}
