//! The relay to NATS JetStream against the real local server, on each database: every
//! message arrives once, a refused one is dead-lettered with the server's reason, an
//! unreachable server is waited for, and four relays keep each key's order.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::jetstream::Stream;
use common::proxy::Proxy;
use common::{
    Brokers, Cleanup, KEYED_DEADLINE, NATS, Place, drained, drained_within, eventually, fill,
    on_each_database, queue, start, stop,
};
use rowbus::dead::DeadLetterPage;
use rowbus::stats::Counted;
use rowbus::{Db, Queue};
use rowbus_relay::Template;
use rowbus_relay::sink::nats::{NatsOptions, NatsSink};

/// A sink to `url` publishing to `subject`, ids prefixed with the queue's name; PubAcks
/// awaited a second at most, so that an outage shows quickly.
async fn sink<DB: Db>(url: &str, subject: &str, queue: &Queue<DB>) -> NatsSink {
    let mut options = NatsOptions::new(Template::parse(subject).unwrap(), queue.table().to_string());
    options.ack_timeout = Duration::from_secs(1);
    NatsSink::connect(url, options).await.unwrap_or_else(|e| panic!("NATS must be reachable: {e}"))
}

/// 10,000 messages reach the stream, each once, with its id, headers and payload; the
/// queue's counts say so.
async fn ten_thousand_arrive_once_each<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let stream = Stream::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_nats").await;
    let ids = fill(&queue, 10_000, 10).await;
    let subject = format!("{}.{{group}}", stream.root);
    let relay = start(&queue, sink(NATS, &subject, &queue).await, 500);
    drained(&queue).await;
    let report = stop(relay).await;
    assert_eq!((report.relayed, report.confirmed, report.resent, report.refused), (10_000, 10_000, 0, 0));

    let got = stream.read_all().await;
    assert_eq!(got.len(), 10_000);
    let by_id: BTreeMap<String, _> = got.iter().map(|g| (g.msg_id.clone(), g)).collect();
    let expected: BTreeSet<String> = ids.iter().map(|id| format!("{}:{id}", queue.table())).collect();
    assert_eq!(by_id.keys().cloned().collect::<BTreeSet<_>>(), expected, "each id once");
    for (i, id) in ids.iter().enumerate() {
        let g = by_id[&format!("{}:{id}", queue.table())];
        let n = i + 1;
        assert_eq!(g.payload, format!("m{n}").into_bytes());
        assert_eq!(g.n.as_deref(), Some(n.to_string().as_str()));
        assert_eq!(g.subject, format!("{}._", stream.root), "the default group renders as _");
        assert_eq!(g.group.as_deref(), Some(""));
        let key = (n % 10 == 0).then(|| format!("k{}", n % 7));
        assert_eq!(g.key, key);
    }
    let counts = queue.counts().await.unwrap().unwrap();
    assert_eq!((counts.get(Counted::Relayed), counts.get(Counted::Confirmed)), (10_000, 10_000));
}
on_each_database!(ten_thousand_arrive_once_each);

/// A batch larger than the PubAcks the client lets wait at once (5,000) arrives whole: the
/// sink awaits the oldest before it publishes more, where it waited for a permit that its
/// own unawaited PubAcks held, for ever.
async fn a_batch_over_the_clients_pending_acks_arrives<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let stream = Stream::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_nats_large").await;
    fill(&queue, 6_000, 0).await;
    let subject = format!("{}.{{group}}", stream.root);
    let relay = start(&queue, sink(NATS, &subject, &queue).await, 6_000);
    drained(&queue).await;
    let report = stop(relay).await;
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
    fill(&queue, 20, 0).await;
    let lost =
        queue.publish_with_id(rowbus::Message::text("nowhere").key("nostream")).await.unwrap().unwrap();
    let template = format!("{{key}}.{}", stream.root);
    let relay = start(&queue, sink(NATS, &template, &queue).await, 50);
    drained(&queue).await;
    let report = stop(relay).await;
    assert_eq!((report.confirmed, report.refused, report.resent), (20, 1, 0), "{report:?}");
    assert_eq!(stream.count().await, 20);

    let dead = queue.dead_letters(&DeadLetterPage::default()).await.unwrap();
    assert_eq!(dead.iter().map(|d| d.id).collect::<Vec<_>>(), [lost]);
    let reason = dead[0].last_error.as_deref().unwrap_or_default();
    assert!(
        reason.contains("no JetStream stream covers subject") && reason.contains("nostream."),
        "{reason}"
    );
    assert_eq!(queue.counts().await.unwrap().unwrap().get(Counted::Refused), 1);
}
on_each_database!(a_refused_message_is_dead_lettered);

/// The server goes away (its port closed, connections cut) while messages wait: the relay
/// gives them back and waits, then sends them again once it is back. Every message is in
/// the stream once: what was sent twice carried the same Nats-Msg-Id, and JetStream
/// dropped the second.
async fn an_unreachable_server_is_waited_for<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let stream = Stream::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_nats_away").await;
    let mut proxy = Proxy::to("127.0.0.1:4222").await;
    let subject = format!("{}.all", stream.root);
    let relay = start(&queue, sink(&format!("nats://{}", proxy.addr), &subject, &queue).await, 100);
    let first = fill(&queue, 500, 0).await;
    eventually("the first messages arrive", || async { stream.count().await == 500 }).await;

    proxy.stop().await;
    let more = fill(&queue, 1_500, 0).await;
    // The relay tries, fails, gives the messages back and tries again later.
    eventually("the relay gives back what the server did not confirm", || async {
        queue.counts().await.unwrap().unwrap().get(Counted::Resent) > 0
    })
    .await;
    assert!(queue.group_stats().await.unwrap()[0].depth > 0, "nothing may leave while the server is away");
    proxy.start();
    drained(&queue).await;
    let report = stop(relay).await;
    assert!(report.resent > 0, "{report:?}");
    assert_eq!(report.confirmed, 2_000, "{report:?}");

    let got = stream.read_all().await;
    let ids: Vec<String> = got.iter().map(|g| g.msg_id.clone()).collect();
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "each id once in the stream");
    let expected: BTreeSet<String> =
        first.iter().chain(&more).map(|id| format!("{}:{id}", queue.table())).collect();
    assert_eq!(unique.into_iter().cloned().collect::<BTreeSet<_>>(), expected);
}
on_each_database!(an_unreachable_server_is_waited_for);

/// Four relays share the queue; each key's messages reach the stream in the order they
/// were published.
async fn four_relays_keep_each_keys_order<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let stream = Stream::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_nats_order").await;
    // Every message keyed (k0 ... k6), plus unkeyed ones between them.
    fill(&queue, 1_400, 1).await;
    let subject = format!("{}.{{key}}", stream.root);
    let mut relays = Vec::new();
    for _ in 0..4 {
        relays.push(start(&queue, sink(NATS, &subject, &queue).await, 50));
    }
    drained_within(&queue, KEYED_DEADLINE).await;
    let mut confirmed = 0;
    for relay in relays {
        let report = stop(relay).await;
        assert!(report.confirmed > 0, "every relay took a share: {report:?}");
        confirmed += report.confirmed;
    }
    assert_eq!(confirmed, 1_400);

    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    let got = stream.read_all().await;
    assert_eq!(got.len(), 1_400);
    for g in got {
        let key = g.key.expect("every message has a key");
        let n: usize = g.n.expect("the header n").parse().unwrap();
        assert_eq!(g.subject, format!("{}.{key}", stream.root));
        if let Some(before) = last.insert(key.clone(), n) {
            assert!(before < n, "key {key}: message {n} arrived after {before}");
        }
    }
    assert_eq!(last.len(), 7);
}
on_each_database!(four_relays_keep_each_keys_order);
