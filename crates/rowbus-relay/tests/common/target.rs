//! The one harness of the four brokers: what a scenario needs of a broker (a [`Target`]:
//! the test's own place there, sinks to it, and what arrived) and the scenarios every
//! broker's tests run through it, each once per database ([`scenarios!`]). A broker's test
//! file holds its [`Target`] and what is its own alone.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rowbus::stats::Counted;
use rowbus::{Db, Queue};
use rowbus_relay::sink::{Sink, SinkError};
use rowbus_relay::{Relay, RelayReport};

use super::proxy::Proxy;
use super::sinks::{StallsAfter, all_ok, batch};
use super::{
    Brokers, Cleanup, KEYED_DEADLINE, Place, drained, drained_within, eventually, fill, key_of, payload,
    prefix, queue, run, start, stop,
};

/// How long a scenario waits for the next message to arrive before it fails.
const ARRIVAL: Duration = Duration::from_secs(30);

/// One message as the broker's receiver saw it.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The id it carried (`<prefix>:<message id>`).
    pub id: String,
    /// Its number, from the header `n`.
    pub n: usize,
    pub group: Option<String>,
    pub key: Option<String>,
    pub payload: Vec<u8>,
    /// Where it arrived: its subject, stream, routing key or topic.
    pub place: String,
}

/// A broker as the scenarios see it.
pub trait Target: Sized {
    /// What names the test's queues.
    const NAME: &'static str;
    /// The broker's host:port, which a [`Proxy`] stands in front of.
    const ADDR: &'static str;
    /// Whether the broker keeps one copy of a message sent twice with the same id.
    const DEDUPLICATES: bool;
    type Sink: Sink + 'static;

    /// A place of the test's own at the broker, with a receiver of what arrives there.
    async fn new() -> Self;

    /// Where a message of `group` and `key` (each `_` for none) arrives: a sink's template
    /// is this of `{group}` and `{key}`.
    fn place(&self, group: &str, key: &str) -> String;

    /// A sink through `addr` (host:port: the broker's, or a proxy's) to the test's place,
    /// its ids prefixed with `prefix`.
    async fn sink(&self, addr: &str, prefix: &str) -> Self::Sink;

    /// The next message to arrive, or `None` when none did `within`.
    async fn next(&mut self, within: Duration) -> Option<Arrival>;

    /// The id a message `id` of a relay whose ids are prefixed with `prefix` carries.
    fn id_of(prefix: &str, id: i64) -> String {
        format!("{prefix}:{id}")
    }

    /// Drops what [`Target::new`] made.
    async fn close(self);

    /// The next `n` messages to arrive, each within 30 s.
    async fn arrivals(&mut self, n: usize) -> Vec<Arrival> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let next = self.next(ARRIVAL).await;
            out.push(next.unwrap_or_else(|| panic!("{} arrived, then nothing for {ARRIVAL:?}", out.len())));
        }
        out
    }

    /// The template of [`Target::place`].
    fn template(&self) -> rowbus_relay::Template {
        rowbus_relay::Template::parse(&self.place("{group}", "{key}")).unwrap()
    }
}

/// Runs each scenario of this module named as one test per database against `$target`
/// (`scenario::postgres`, ...). The test file says `use common::place_test as database_test;`.
#[allow(unused_macros)]
macro_rules! scenarios {
    ($target:ty: $($scenario:ident),+ $(,)?) => {
        $(
            async fn $scenario<DB: crate::common::Brokers>(place: crate::common::Place) {
                crate::common::target::$scenario::<DB, $target>(place).await
            }
            crate::common::on_each_database!($scenario);
        )+
    };
}
#[allow(unused_imports)]
pub(crate) use scenarios;

/// Checks `arrived` against the messages numbered 0.. whose ids are `ids`, each every
/// `keyed`-th keyed ([`key_of`]): each exactly once with its id, group, key and payload,
/// at the place its group and key name, and each key's in the order published.
fn check_once<T: Target>(target: &T, arrived: &[Arrival], ids: &[i64], keyed: usize, prefix: &str) {
    assert_eq!(arrived.len(), ids.len(), "as many arrived as were published");
    let mut seen = vec![0u32; ids.len()];
    let mut last_of_key: HashMap<&str, usize> = HashMap::new();
    for a in arrived {
        assert!(a.n < ids.len(), "{a:?}");
        seen[a.n] += 1;
        assert_eq!(a.id, T::id_of(prefix, ids[a.n]), "the id of {}", a.n);
        assert_eq!(a.payload, payload(a.n), "the payload of {}", a.n);
        assert_eq!(a.key, key_of(a.n, keyed), "the key of {}", a.n);
        assert_eq!(a.group.as_deref(), Some(""), "the group of {}", a.n);
        assert_eq!(a.place, target.place("_", a.key.as_deref().unwrap_or("_")), "where {} arrived", a.n);
        if let Some(key) = &a.key
            && let Some(last) = last_of_key.insert(key, a.n)
        {
            assert!(last < a.n, "key {key}: {} arrived after {last}", a.n);
        }
    }
    let missing: Vec<_> = seen.iter().enumerate().filter(|(_, c)| **c != 1).map(|(i, _)| i).collect();
    assert!(missing.is_empty(), "not exactly once: {:?}", &missing[..missing.len().min(20)]);
}

/// Checks `arrived` against the messages numbered 0.. whose ids are `ids` when some may
/// have been sent twice: each at least once, every copy with its id and payload.
fn check_at_least_once<T: Target>(arrived: &[Arrival], ids: &[i64], prefix: &str) {
    let mut seen = HashSet::new();
    for a in arrived {
        assert!(a.n < ids.len(), "{a:?}");
        assert_eq!(a.id, T::id_of(prefix, ids[a.n]), "the id of {} (sent again with another?)", a.n);
        assert_eq!(a.payload, payload(a.n), "the payload of {}", a.n);
        seen.insert(a.n);
    }
    let missing: Vec<_> = (0..ids.len()).filter(|n| !seen.contains(n)).collect();
    assert!(missing.is_empty(), "missing: {:?}", &missing[..missing.len().min(20)]);
}

/// What the relays `running` did, added up, once stopped; each took a share when
/// `shared`.
async fn stop_all(running: Vec<super::Running>, shared: bool) -> RelayReport {
    let mut total = RelayReport::default();
    for relay in running {
        let report = stop(relay).await;
        assert!(!shared || report.confirmed > 0, "every relay took a share: {report:?}");
        total.relayed += report.relayed;
        total.confirmed += report.confirmed;
        total.resent += report.resent;
        total.refused += report.refused;
    }
    total
}

/// 10,000 messages, every tenth keyed, reach the broker each once, with its id, group,
/// key, headers and payload, where its group and key say; the queue's counts say so.
pub async fn ten_thousand_arrive_once_each<DB: Brokers, T: Target>(place: Place) {
    const N: usize = 10_000;
    let cleanup = Cleanup::new(place.backend());
    let mut target = T::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, &format!("relay_{}", T::NAME)).await;
    let ids = fill(&queue, 0..N, 10).await;
    let relay = start(&queue, target.sink(T::ADDR, &prefix(&queue)).await, 500);
    drained(&queue).await;
    let report = stop(relay).await;
    let n = N as u64;
    assert_eq!((report.relayed, report.confirmed, report.resent, report.refused), (n, n, 0, 0), "{report:?}");

    let arrived = target.arrivals(N).await;
    check_once(&target, &arrived, &ids, 10, &prefix(&queue));
    let counts = queue.counts().await.unwrap().unwrap();
    assert_eq!((counts.get(Counted::Relayed), counts.get(Counted::Confirmed)), (n, n));
    target.close().await;
}

/// Four relays share the queue, each with a sink (a connection) of its own; each key's
/// messages reach the broker in the order they were published.
pub async fn four_relays_keep_each_keys_order<DB: Brokers, T: Target>(place: Place) {
    const N: usize = 1_400;
    let cleanup = Cleanup::new(place.backend());
    let mut target = T::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, &format!("relay_{}_order", T::NAME)).await;
    // Every message keyed, k0 ... k6.
    let ids = fill(&queue, 0..N, 1).await;
    let mut relays = Vec::new();
    for _ in 0..4 {
        relays.push(start(&queue, target.sink(T::ADDR, &prefix(&queue)).await, 50));
    }
    drained_within(&queue, KEYED_DEADLINE).await;
    let report = stop_all(relays, true).await;
    assert_eq!((report.confirmed, report.refused), (N as u64, 0), "{report:?}");

    let arrived = target.arrivals(N).await;
    check_once(&target, &arrived, &ids, 1, &prefix(&queue));
    target.close().await;
}

/// The broker goes away (its port closed, connections cut) while messages wait: the relay
/// gives them back and waits, then sends them again once it is back. Every message
/// arrives, what was sent twice with the same id; once only where the broker drops a copy
/// by its id.
pub async fn an_unreachable_server_is_waited_for<DB: Brokers, T: Target>(place: Place) {
    let cleanup = Cleanup::new(place.backend());
    let mut target = T::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, &format!("relay_{}_away", T::NAME)).await;
    let proxy = Proxy::start(T::ADDR).await;
    let relay = start(&queue, target.sink(&proxy.addr(), &prefix(&queue)).await, 100);
    let mut ids = fill(&queue, 0..500, 0).await;
    let mut arrived = target.arrivals(500).await;

    proxy.stop().await;
    ids.extend(fill(&queue, 500..2_000, 0).await);
    // The relay tries, fails, gives the messages back and tries again later.
    eventually("the relay gives back what the broker did not confirm", || async {
        queue.counts().await.unwrap().unwrap().get(Counted::Resent) > 0
    })
    .await;
    assert!(queue.group_stats().await.unwrap()[0].depth > 0, "nothing may leave while the broker is away");
    proxy.resume().await;
    drained(&queue).await;
    let report = stop(relay).await;
    assert!(report.resent > 0 && report.confirmed == 2_000, "{report:?}");

    let mut numbers: HashSet<usize> = arrived.iter().map(|a| a.n).collect();
    while numbers.len() < ids.len() {
        let next = target.next(ARRIVAL).await;
        let a = next.unwrap_or_else(|| panic!("{} of {} arrived, then nothing", numbers.len(), ids.len()));
        numbers.insert(a.n);
        arrived.push(a);
    }
    check_at_least_once::<T>(&arrived, &ids, &prefix(&queue));
    if T::DEDUPLICATES {
        assert_eq!(arrived.len(), ids.len(), "each id once at the broker");
    }
    target.close().await;
}

/// A relay killed mid-stream (its task aborted: its connection gone, its claims left under
/// their lease), then another started: every message arrives, those the first had sent but
/// not settled again with the same id.
pub async fn a_leased_relay_killed_mid_stream_loses_nothing<DB: Brokers, T: Target>(place: Place) {
    killed_mid_stream::<DB, T>(place, false).await
}

/// The same claiming in transactions: the killed relay's transaction is rolled back, and
/// what it had sent goes again at once.
pub async fn a_transactional_relay_killed_mid_stream_loses_nothing<DB: Brokers, T: Target>(place: Place) {
    killed_mid_stream::<DB, T>(place, true).await
}

async fn killed_mid_stream<DB: Brokers, T: Target>(place: Place, transactional: bool) {
    const N: usize = 3_000;
    let cleanup = Cleanup::new(place.backend());
    let mut target = T::new().await;
    let (_broker, queue) = queue::<DB>(&place, &cleanup, &format!("relay_{}_killed", T::NAME)).await;
    let ids = fill(&queue, 0..N, 0).await;
    let prefix = prefix(&queue);
    fn relay<DB: Db, S: Sink>(queue: &Queue<DB>, sink: S, transactional: bool) -> Relay<DB, S> {
        Relay::new(queue.clone(), sink).transactional(transactional).batch(20).lease(Duration::from_secs(2))
    }

    // Killed with a batch sent and not settled (its sink stalls after 300 messages).
    let (stalling, stalled) = StallsAfter::new(target.sink(T::ADDR, &prefix).await, 300);
    let first = tokio::spawn(relay(&queue, stalling, transactional).run());
    stalled.await.expect("the first relay sends 300 messages");
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());

    let second = run(relay(&queue, target.sink(T::ADDR, &prefix).await, transactional));
    // Until every message arrived, the stalled batch again, and the queue is empty: the
    // stalled batch arrived once already and comes again when its lease ran out (or its
    // transaction was rolled back).
    let (mut arrived, mut seen) = (Vec::new(), HashSet::new());
    let start = tokio::time::Instant::now();
    while seen.len() < N || arrived.len() <= N || queue.depth("").await.unwrap().0 > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} of {N} arrived, {} in all; or the queue is not empty",
            seen.len(),
            arrived.len()
        );
        if let Some(arrival) = target.next(Duration::from_millis(200)).await {
            seen.insert(arrival.n);
            arrived.push(arrival);
        }
    }
    let report = stop(second).await;
    check_at_least_once::<T>(&arrived, &ids, &prefix);
    assert_eq!(queue.depth("").await.unwrap(), (0, 0));
    if !transactional {
        assert!(report.resent > 0, "the first relay's claims were sent again: {report:?}");
    }
    target.close().await;
}

/// A sink through a proxy that is stopped: while the broker is gone every message of a
/// batch is unavailable, batch after batch, and once it is back the same sink sends them;
/// each arrives once, in order.
pub async fn while_the_broker_is_gone_every_message_is_unavailable<T: Target>() {
    let mut target = T::new().await;
    let proxy = Proxy::start(T::ADDR).await;
    let sink = target.sink(&proxy.addr(), "orders").await;
    all_ok(&sink.send(&batch(1, 10, 2)).await);

    proxy.stop().await;
    for attempt in 0..2 {
        for r in sink.send(&batch(11, 10, 2)).await {
            assert!(matches!(r, Err(SinkError::Unavailable(_))), "attempt {attempt}: {r:?}");
        }
    }

    proxy.resume().await;
    all_ok(&sink.send(&batch(11, 10, 2)).await);
    let ids: Vec<String> = target.arrivals(20).await.into_iter().map(|a| a.id).collect();
    let expected: Vec<String> = (1..=20).map(|id| T::id_of("orders", id)).collect();
    assert_eq!(ids, expected);
    target.close().await;
}
