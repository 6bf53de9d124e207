//! The relay to NATS JetStream against the real local server, on each database: the
//! shared scenarios (every message once, an unreachable server waited for, four relays
//! keeping each key's order), a batch over the client's pending PubAcks, and a refused
//! message dead-lettered with the server's reason.

mod common;

use std::time::Duration;

use common::jetstream::Stream;
use common::target::{Arrival, Target, scenarios};
use common::{
    Brokers, Cleanup, NATS, Place, drained, fill, on_each_database, place_test as database_test, prefix,
    queue,
};
use futures::StreamExt as _;
use rowbus_relay::Template;
use rowbus_relay::sink::nats::{NatsOptions, NatsSink};

/// A sink to `addr` publishing with `template`, ids prefixed with `prefix`; PubAcks
/// awaited a second at most, so that an outage shows quickly.
async fn sink(addr: &str, template: &str, prefix: &str) -> NatsSink {
    let mut options = NatsOptions::new(Template::parse(template).unwrap(), prefix);
    options.ack_timeout = Duration::from_secs(1);
    NatsSink::connect(&format!("nats://{addr}"), options)
        .await
        .unwrap_or_else(|e| panic!("NATS must be reachable: {e}"))
}

/// A stream of the test's own, read from its first message on.
struct Nats {
    stream: Stream,
    reader: Option<async_nats::jetstream::consumer::pull::Stream>,
    /// How many messages were read.
    read: u64,
}

impl Target for Nats {
    const NAME: &'static str = "nats";
    const ADDR: &'static str = NATS;
    /// JetStream drops a message whose Nats-Msg-Id it had within its duplicate window.
    const DEDUPLICATES: bool = true;
    type Sink = NatsSink;

    async fn new() -> Nats {
        Nats { stream: Stream::new().await, reader: None, read: 0 }
    }

    fn place(&self, group: &str, key: &str) -> String {
        format!("{}.{group}.{key}", self.stream.root)
    }

    async fn sink(&self, addr: &str, prefix: &str) -> NatsSink {
        sink(addr, &self.place("{group}", "{key}"), prefix).await
    }

    async fn next(&mut self, within: Duration) -> Option<Arrival> {
        let deadline = tokio::time::Instant::now() + within;
        let message = loop {
            if self.reader.is_none() {
                self.reader = Some(self.stream.reader(self.read + 1).await);
            }
            let reader = self.reader.as_mut().expect("made above");
            match tokio::time::timeout_at(deadline, reader.next()).await.ok()? {
                Some(Ok(message)) => break message,
                // A reader left idle while a relay ran missed the server's heartbeats
                // (MissingHeartbeat): a new one goes on after what was read.
                Some(Err(_)) | None => self.reader = None,
            }
        };
        self.read += 1;
        let header =
            |name: &str| message.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_owned());
        Some(Arrival {
            id: header("Nats-Msg-Id").expect("an id"),
            n: header("n").expect("the header n").parse().unwrap(),
            group: header("Rowbus-Group"),
            key: header("Rowbus-Key"),
            payload: message.payload.to_vec(),
            place: message.subject.to_string(),
        })
    }

    async fn close(self) {}
}

scenarios!(Nats: ten_thousand_arrive_once_each, an_unreachable_server_is_waited_for, four_relays_keep_each_keys_order);

/// A batch larger than the PubAcks the client lets wait at once (5,000) arrives whole: the
/// sink awaits the oldest before it publishes more, where it waited for a permit that its
/// own unawaited PubAcks held, for ever.
async fn a_batch_over_the_clients_pending_acks_arrives<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let stream = Stream::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_nats_large").await;
    fill(&queue, 0..6_000, 0).await;
    let subject = format!("{}.{{group}}", stream.root);
    let relay = common::start(&queue, sink(NATS, &subject, &prefix(&queue)).await, 6_000);
    drained(&queue).await;
    let report = common::stop(relay).await;
    assert_eq!((report.relayed, report.confirmed, report.refused), (6_000, 6_000, 0), "{report:?}");
    assert_eq!(stream.count().await, 6_000);
}
on_each_database!(a_batch_over_the_clients_pending_acks_arrives);

/// A message whose subject no stream covers is refused by the server: it goes to the dead
/// letters with the reason, and the others arrive.
async fn a_refused_message_is_dead_lettered<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    // Unkeyed messages go to `_.<root>` (a missing key renders as `_`), which the stream
    // covers; the keyed one to `nostream.<root>`, which nothing covers.
    let stream = Stream::covering(|root| vec![format!("_.{root}")]).await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_nats_refused").await;
    let template = format!("{{key}}.{}", stream.root);
    let sink = sink(NATS, &template, &prefix(&queue)).await;
    let reason = common::one_refused(&queue, sink, "nostream").await;
    assert!(
        reason.contains("no JetStream stream covers subject") && reason.contains("nostream."),
        "{reason}"
    );
    assert_eq!(stream.count().await, 20);
}
on_each_database!(a_refused_message_is_dead_lettered);
