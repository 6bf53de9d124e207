//! The relay to Redis Streams against the real local server, on each database: the
//! shared scenarios (every message once with its fields, an unreachable server waited
//! for, four relays keeping each key's order), streams trimmed, a refused message
//! dead-lettered with the server's reason, and an ordered relay keeping the group's order
//! when a batch fails.

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use common::streams::Streams;
use common::target::{Arrival, Target, scenarios};
use common::{
    Brokers, Cleanup, Place, REDIS, drained, fill, on_each_database, place_test as database_test, queue, run,
    start, stop,
};
use rowbus_relay::sink::redis::{RedisOptions, RedisSink};
use rowbus_relay::sink::{Outgoing, Sink, SinkError};
use rowbus_relay::{Relay, Template};

/// A sink to `addr` adding to `stream`; replies awaited a second at most.
async fn sink(addr: &str, stream: &str, maxlen: Option<u64>) -> RedisSink {
    let mut options = RedisOptions::new(Template::parse(stream).unwrap());
    options.maxlen = maxlen;
    options.timeout = Duration::from_secs(1);
    RedisSink::connect(&format!("redis://{addr}"), options)
        .await
        .unwrap_or_else(|e| panic!("Redis must be reachable: {e}"))
}

/// The test's streams, read as entries are added to them.
struct Redis {
    streams: Streams,
    /// Where the next read of each stream starts.
    from: BTreeMap<String, String>,
    /// Read and not yet taken.
    read: VecDeque<Arrival>,
}

impl Target for Redis {
    const NAME: &'static str = "redis";
    const ADDR: &'static str = REDIS;
    /// Each XADD is an entry of its own.
    const DEDUPLICATES: bool = false;
    type Sink = RedisSink;

    async fn new() -> Redis {
        Redis { streams: Streams::new().await, from: BTreeMap::new(), read: VecDeque::new() }
    }

    fn place(&self, group: &str, key: &str) -> String {
        self.streams.name(&format!("{group}:{key}"))
    }

    /// Entries carry the message's id alone, in the field `id`.
    async fn sink(&self, addr: &str, _prefix: &str) -> RedisSink {
        sink(addr, &self.place("{group}", "{key}"), None).await
    }

    fn id_of(_prefix: &str, id: i64) -> String {
        id.to_string()
    }

    /// Reads every stream of the test's after what it read of it before, every 20 ms,
    /// each stream's entries in its order.
    async fn next(&mut self, within: Duration) -> Option<Arrival> {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(arrival) = self.read.pop_front() {
                return Some(arrival);
            }
            for stream in self.streams.names().await {
                let from = self.from.get(&stream).map_or("-", String::as_str);
                let page = self.streams.page(&stream, from).await;
                if let Some((last, _)) = page.last() {
                    self.from.insert(stream.clone(), format!("({last}"));
                }
                self.read.extend(page.into_iter().map(|(_, e)| {
                    let headers: BTreeMap<String, String> =
                        serde_json::from_slice(&e.fields["headers"]).unwrap();
                    assert_eq!(headers.keys().collect::<Vec<_>>(), ["n"], "the headers as published");
                    Arrival {
                        id: e.text("id").expect("an id"),
                        n: headers["n"].parse().unwrap(),
                        group: e.text("group"),
                        key: e.text("key"),
                        payload: e.fields["payload"].clone(),
                        place: stream.clone(),
                    }
                }));
            }
            if self.read.is_empty() {
                if start.elapsed() >= within {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    async fn close(self) {}
}

scenarios!(Redis: ten_thousand_arrive_once_each, an_unreachable_server_is_waited_for, four_relays_keep_each_keys_order);

/// `--maxlen` trims each stream to about that many entries; bytes that are not UTF-8 go
/// as they are.
async fn streams_are_trimmed_and_payloads_kept<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let streams = Streams::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, "relay_redis_trim").await;
    fill(&queue, 0..2_000, 0).await;
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
    let reason = common::one_refused(&queue, sink(REDIS, &streams.name("{key}"), None).await, "taken").await;
    assert!(reason.contains("WRONGTYPE"), "{reason}");
    assert_eq!(streams.len(&streams.name("_")).await, 20);
}
on_each_database!(a_refused_message_is_dead_lettered);

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
    let ids = fill(&queue, 0..1_000, 0).await;
    let sink = FailsThird { inner: sink(REDIS, &stream, None).await, batches: 0.into() };
    let relay = run(Relay::new(queue.clone(), sink).batch(50).ordered(true));
    drained(&queue).await;
    let report = stop(relay).await;
    assert_eq!((report.resent, report.confirmed), (50, 1_000), "{report:?}");

    let order: Vec<i64> =
        streams.read_all(&stream).await.iter().map(|e| e.text("id").unwrap().parse().unwrap()).collect();
    let first_out = order.iter().zip(&ids).position(|(got, published)| got != published);
    assert_eq!((order.len(), first_out), (ids.len(), None), "every message once, in the order published");
}
on_each_database!(an_ordered_relay_keeps_the_groups_order);
