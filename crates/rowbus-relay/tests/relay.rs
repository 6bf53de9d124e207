//! The relay itself, with a sink that needs no broker, on the real PostgreSQL and MariaDB
//! and a temporary SQLite file.

mod common;

use std::time::Duration;

use common::{Brokers, Cleanup, Place, drained, fill, on_each_database, queue};
use rowbus::Message;
use rowbus_relay::Relay;
use rowbus_relay::sink::{Outgoing, Sink, SinkError};

/// Longer than many polls of the tests' brokers (50 ms): a relay that still claims has
/// claimed by then.
const QUIET: Duration = Duration::from_secs(1);

/// A broker that confirms everything at once.
struct Confirms;

impl Sink for Confirms {
    async fn send(&mut self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        batch.iter().map(|_| Ok(())).collect()
    }

    fn system(&self) -> &'static str {
        "test"
    }
}

/// A relay whose task is aborted claims nothing more: what is published afterwards stays
/// ready for the next relay rather than held under a lease by a claim no one sends.
async fn an_aborted_relay_claims_nothing_more<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_abort").await;
    fill(&queue, 10, 0).await;
    let relay = tokio::spawn(Relay::new(queue.clone(), Confirms).batch(5).run());
    drained(&queue).await;
    relay.abort();
    assert!(relay.await.unwrap_err().is_cancelled());

    queue.publish_batch((0..20).map(|i| Message::text(format!("after {i}")))).await.unwrap();
    tokio::time::sleep(QUIET).await;
    let groups = queue.group_stats().await.unwrap();
    let default = groups.iter().find(|g| g.group.is_empty()).expect("the default group");
    assert_eq!((default.ready, default.in_flight), (20, 0), "{groups:?}");
}
on_each_database!(an_aborted_relay_claims_nothing_more);
