//! The relay to Redis Streams against the real local server, on each database: every
//! message arrives once with its fields, a refused one is dead-lettered with the server's
//! reason, an unreachable server is waited for, and four relays keep each key's order.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::proxy::Proxy;
use common::streams::Streams;
use common::{
    Brokers, Cleanup, KEYED_DEADLINE, Place, REDIS, drained, drained_within, eventually, fill,
    on_each_database, queue, start, stop,
};
use rowbus::dead::DeadLetterPage;
use rowbus::stats::Counted;
use rowbus_relay::sink::redis::{RedisOptions, RedisSink};
use rowbus_relay::sink::{Outgoing, Sink, SinkError};
use rowbus_relay::{Relay, Template};
use tokio::sync::oneshot;

/// A sink to `url` adding to `stream`; replies awaited a second at most.
async fn sink(url: &str, stream: &str, maxlen: Option<u64>) -> RedisSink {
    let mut options = RedisOptions::new(Template::parse(stream).unwrap());
    options.maxlen = maxlen;
    options.timeout = Duration::from_secs(1);
    RedisSink::connect(url, options).await.unwrap_or_else(|e| panic!("Redis must be reachable: {e}"))
}

/// 10,000 messages reach the stream, each once, with its fields; the queue's counts say so.
async fn ten_thousand_arrive_once_each<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let streams = Streams::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_redis").await;
    let ids = fill(&queue, 10_000, 10).await;
    let relay = start(&queue, sink(REDIS, &streams.name("all"), None).await, 500);
    drained(&queue).await;
    let report = stop(relay).await;
    assert_eq!((report.relayed, report.confirmed, report.resent, report.refused), (10_000, 10_000, 0, 0));

    let entries = streams.read_all(&streams.name("all")).await;
    assert_eq!(entries.len(), 10_000);
    let by_id: BTreeMap<i64, _> =
        entries.iter().map(|e| (e.text("id").unwrap().parse().unwrap(), e)).collect();
    assert_eq!(by_id.keys().copied().collect::<Vec<_>>(), ids, "each id once");
    for (i, id) in ids.iter().enumerate() {
        let (e, n) = (by_id[id], i + 1);
        assert_eq!(e.fields["payload"], format!("m{n}").into_bytes());
        assert_eq!(e.text("group").as_deref(), Some(""));
        let headers: serde_json::Value = serde_json::from_slice(&e.fields["headers"]).unwrap();
        assert_eq!(headers, serde_json::json!({ "n": n.to_string() }));
        assert_eq!(e.text("key"), (n % 10 == 0).then(|| format!("k{}", n % 7)));
    }
    let counts = queue.counts().await.unwrap().unwrap();
    assert_eq!((counts.get(Counted::Relayed), counts.get(Counted::Confirmed)), (10_000, 10_000));
}
on_each_database!(ten_thousand_arrive_once_each);

/// `--maxlen` trims each stream to about that many entries; bytes that are not UTF-8 go
/// as they are.
async fn streams_are_trimmed_and_payloads_kept<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let streams = Streams::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_redis_trim").await;
    fill(&queue, 2_000, 0).await;
    let relay = start(&queue, sink(REDIS, &streams.name("trim"), Some(100)).await, 500);
    drained(&queue).await;
    // Alone, so that it is the stream's last entry: batches in flight, unordered, may
    // reach the stream in another order than they were published.
    queue.publish(rowbus::Message::new(vec![0xff, 0, 0xfe])).await.unwrap();
    drained(&queue).await;
    stop(relay).await;
    // `~`: Redis trims whole nodes of its radix tree, so somewhat more than 100 stay.
    let len = streams.len(&streams.name("trim")).await;
    assert!((100..1_000).contains(&len), "{len} entries");
    let entries = streams.read_all(&streams.name("trim")).await;
    assert_eq!(entries.last().unwrap().fields["payload"], [0xff, 0, 0xfe]);
}
on_each_database!(streams_are_trimmed_and_payloads_kept);

/// A message whose stream's key holds another type is refused by the server (WRONGTYPE):
/// it goes to the dead letters with the reason, and the others arrive.
async fn a_refused_message_is_dead_lettered<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let streams = Streams::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_redis_refused").await;
    // The keyed message's stream is a string.
    let taken = streams.name("taken");
    let _: () = redis::cmd("SET")
        .arg(&taken)
        .arg("not a stream")
        .query_async(&mut streams.connection().await)
        .await
        .unwrap();
    fill(&queue, 20, 0).await;
    let lost = queue.publish_with_id(rowbus::Message::text("nowhere").key("taken")).await.unwrap().unwrap();
    let relay = start(&queue, sink(REDIS, &streams.name("{key}"), None).await, 50);
    drained(&queue).await;
    let report = stop(relay).await;
    assert_eq!((report.confirmed, report.refused, report.resent), (20, 1, 0), "{report:?}");
    assert_eq!(streams.len(&streams.name("_")).await, 20);

    let dead = queue.dead_letters(&DeadLetterPage::default()).await.unwrap();
    assert_eq!(dead.iter().map(|d| d.id).collect::<Vec<_>>(), [lost]);
    let reason = dead[0].last_error.as_deref().unwrap_or_default();
    assert!(reason.contains("WRONGTYPE"), "{reason}");
    assert_eq!(queue.counts().await.unwrap().unwrap().get(Counted::Refused), 1);
}
on_each_database!(a_refused_message_is_dead_lettered);

/// The server goes away (its port closed, connections cut) while messages wait: the relay
/// gives them back and waits, then sends them again once it is back; nothing is lost, and
/// an entry added twice carries the same `id`.
async fn an_unreachable_server_is_waited_for<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let streams = Streams::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_redis_away").await;
    let mut proxy = Proxy::to("127.0.0.1:6379").await;
    let stream = streams.name("all");
    let relay = start(&queue, sink(&format!("redis://{}", proxy.addr), &stream, None).await, 100);
    let first = fill(&queue, 500, 0).await;
    eventually("the first messages arrive", || async { streams.len(&stream).await == 500 }).await;

    proxy.stop().await;
    let more = fill(&queue, 1_500, 0).await;
    eventually("the relay gives back what the server did not confirm", || async {
        queue.counts().await.unwrap().unwrap().get(Counted::Resent) > 0
    })
    .await;
    assert!(queue.group_stats().await.unwrap()[0].depth > 0, "nothing may leave while the server is away");
    proxy.start();
    drained(&queue).await;
    let report = stop(relay).await;
    assert!(report.resent > 0 && report.confirmed == 2_000, "{report:?}");

    let entries = streams.read_all(&stream).await;
    let ids: BTreeSet<i64> = entries.iter().map(|e| e.text("id").unwrap().parse().unwrap()).collect();
    let expected: BTreeSet<i64> = first.iter().chain(&more).copied().collect();
    assert_eq!(ids, expected, "every message arrived");
}
on_each_database!(an_unreachable_server_is_waited_for);

/// Four relays share the queue; each key's messages reach its stream in the order they
/// were published.
async fn four_relays_keep_each_keys_order<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let streams = Streams::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_redis_order").await;
    fill(&queue, 1_400, 1).await;
    let mut relays = Vec::new();
    for _ in 0..4 {
        relays.push(start(&queue, sink(REDIS, &streams.name("{key}"), None).await, 50));
    }
    drained_within(&queue, KEYED_DEADLINE).await;
    let mut confirmed = 0;
    for relay in relays {
        let report = stop(relay).await;
        assert!(report.confirmed > 0, "every relay took a share: {report:?}");
        confirmed += report.confirmed;
    }
    assert_eq!(confirmed, 1_400);
    for k in 0..7 {
        let entries = streams.read_all(&streams.name(&format!("k{k}"))).await;
        assert_eq!(entries.len(), 200, "key k{k}");
        let ns: Vec<usize> = entries
            .iter()
            .map(|e| {
                serde_json::from_slice::<BTreeMap<String, String>>(&e.fields["headers"]).unwrap()["n"]
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(ns.windows(2).all(|w| w[0] < w[1]), "key k{k} out of order: {ns:?}");
    }
}
on_each_database!(four_relays_keep_each_keys_order);

/// A sink that answers its third batch with "unavailable" for every message, without
/// sending it, and hands the others to `inner`: a broker that failed one batch and took
/// the next.
struct FailsThird<S> {
    inner: S,
    batches: std::sync::atomic::AtomicUsize,
}

impl<S: Sink> Sink for FailsThird<S> {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        if self.batches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == 3 {
            return batch.iter().map(|_| Err(SinkError::Unavailable("not this time".to_owned()))).collect();
        }
        self.inner.send(batch).await
    }

    fn system(&self) -> &'static str {
        self.inner.system()
    }
}

/// An ordered relay keeps the group's order at the broker when a batch fails: it goes
/// again before anything after it. (Without `ordered`, the batches in flight behind the
/// failed one arrive first.)
async fn an_ordered_relay_keeps_the_groups_order<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let streams = Streams::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_redis_ordered").await;
    let stream = streams.name("ordered");
    let ids = fill(&queue, 1_000, 0).await;
    let (stopping, stopped) = oneshot::channel::<()>();
    let sink = FailsThird { inner: sink(REDIS, &stream, None).await, batches: 0.into() };
    let relay = Relay::new(queue.clone(), sink).batch(50).ordered(true).until(async move {
        let _ = stopped.await;
    });
    let relay = (stopping, tokio::spawn(async move { relay.run().await.expect("the relay runs") }));
    drained(&queue).await;
    let report = stop(relay).await;
    assert_eq!((report.resent, report.confirmed), (50, 1_000), "{report:?}");

    let order: Vec<i64> =
        streams.read_all(&stream).await.iter().map(|e| e.text("id").unwrap().parse().unwrap()).collect();
    let first_out = order.iter().zip(&ids).position(|(got, published)| got != published);
    assert_eq!((order.len(), first_out), (ids.len(), None), "every message once, in the order published");
}
on_each_database!(an_ordered_relay_keeps_the_groups_order);
