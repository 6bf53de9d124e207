//! Hand-offs, against the real PostgreSQL and MariaDB and a temporary SQLite file: a
//! publish that finds a runner of its own broker waiting for work stores the message
//! leased to it and hands it over without a claim; what holds a claim back (a pause, a
//! limit) holds a hand-off back too; with another broker claiming the same queue, every
//! message is still handled once; a message handed to a runner that stopped meanwhile is
//! given back at once. `publish_with_id` hands over as `publish` does.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use rowbus::limit::{Limit, LimitScope};
use rowbus::stats::Stats;
use rowbus::{Broker, BrokerOptions, Db, Delivery, Error, Message, Queue};
use tokio::sync::{Notify, mpsc};

use common::place_test as database_test;

/// Longer than any test: a runner that sees a message at all was handed it or woken.
const FOREVER: Duration = Duration::from_secs(3600);
/// How long a message a runner should take may take to arrive.
const ARRIVES: Duration = Duration::from_secs(20);
/// How long a runner is watched for a message it must not start.
const QUIET: Duration = Duration::from_millis(1500);

/// A deployed queue of the test's own on `broker`.
async fn queue<DB: Db>(broker: &Broker<DB>, name: &str) -> Queue<DB> {
    let queue = broker.queue(name).unwrap();
    queue.deploy().await.unwrap();
    queue
}

/// What a handler saw of a message.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    id: i64,
    text: String,
    group: String,
    priority: i16,
    attempt: u32,
    header: Option<String>,
}

/// Starts a runner of `workers` on `queue`'s `group` with `poll`: each message it starts
/// is sent on the channel; one whose text is `hold` waits for `gate` first.
fn start<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    workers: usize,
    poll: Duration,
    gate: Arc<Notify>,
) -> (mpsc::UnboundedReceiver<Seen>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let sub = queue.subscribe().group(group).workers(workers).poll_interval(poll);
    let task = tokio::spawn(async move {
        sub.run(move |d: Delivery<DB>| {
            let (tx, gate) = (tx.clone(), gate.clone());
            async move {
                let seen = Seen {
                    id: d.id(),
                    text: d.text()?.to_owned(),
                    group: d.group().to_owned(),
                    priority: d.priority(),
                    attempt: d.attempt(),
                    header: d.headers().get("h").cloned(),
                };
                let hold = seen.text == "hold";
                let _ = tx.send(seen);
                if hold {
                    gate.notified().await;
                }
                Ok::<_, Error>(())
            }
        })
        .await
        .unwrap()
    });
    (rx, task)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>, what: &str) -> Seen {
    tokio::time::timeout(ARRIVES, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing started within {ARRIVES:?}"))
        .expect("the runner is running")
}

async fn nothing(rx: &mut mpsc::UnboundedReceiver<Seen>, what: &str) {
    if let Ok(got) = tokio::time::timeout(QUIET, rx.recv()).await {
        panic!("{what}: started {got:?}");
    }
}

/// Waits until the runner's first claim (which finds nothing) is done: it then waits for
/// work.
async fn until_idle<DB: Db>(broker: &Broker<DB>) {
    until_counted(broker, "the runner's first claim", |s| s.claims > 0).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Waits until `broker`'s counters say `done`, within [`ARRIVES`].
async fn until_counted<DB: Db>(broker: &Broker<DB>, what: &str, done: impl Fn(&Stats) -> bool) {
    let waited = tokio::time::timeout(ARRIVES, async {
        while !done(&broker.stats()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    if waited.await.is_err() {
        panic!("{what}: not counted within {ARRIVES:?}: {:?}", broker.stats());
    }
}

/// Waits until `queue` holds nothing in `group`.
async fn until_empty<DB: Db>(queue: &Queue<DB>, group: &str) {
    tokio::time::timeout(ARRIVES, async {
        while queue.depth(group).await.unwrap().0 > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every message acknowledged");
}

/// With an hour's poll interval, messages published one after another by the runner's own
/// broker are each handed to it: no claim runs for them, each starts on its first attempt
/// with what it was published with, and each is acknowledged.
async fn hands_over_when_idle<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup.queue(&unique("handoff"))).await;
    let (mut seen, task) = start(&q, "g", 2, FOREVER, Arc::new(Notify::new()));
    until_idle(&broker).await;
    let claims = broker.stats().claims;

    for i in 0..10 {
        let m = Message::text(format!("m{i}")).group("g").priority(-3).header("h", format!("v{i}"));
        q.publish(m).await.unwrap();
        let got = next(&mut seen, "a message published while the runner waits").await;
        let want = Seen {
            id: got.id,
            text: format!("m{i}"),
            group: "g".into(),
            priority: -3,
            attempt: 1,
            header: Some(format!("v{i}")),
        };
        assert_eq!(got, want);
    }
    until_empty(&q, "g").await;
    // The acknowledgements are counted once their statement returned, a moment after
    // their rows are gone.
    until_counted(&broker, "10 acknowledgements", |s| s.acked >= 10).await;
    let stats = broker.stats();
    assert_eq!(stats.handed_off, 10, "{stats:?}");
    assert_eq!(stats.claims, claims, "no claim ran for them: {stats:?}");

    // Another group's message is not this runner's: it waits in the queue.
    q.publish(Message::text("other")).await.unwrap();
    nothing(&mut seen, "a message of another group").await;
    assert_eq!(broker.stats().handed_off, 10);
    assert_eq!(q.depth("").await.unwrap().0, 1);

    broker.shutdown(Duration::from_secs(5)).await;
    task.await.unwrap();
}

on_each_database!(hands_over_when_idle);

/// `publish_with_id` hands over as `publish` does, and the id it returns is the one the
/// runner started.
async fn publish_with_id_hands_over<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup.queue(&unique("handoff_id"))).await;
    let (mut seen, task) = start(&q, "g", 2, FOREVER, Arc::new(Notify::new()));
    until_idle(&broker).await;
    let claims = broker.stats().claims;

    for i in 0..3 {
        let id = q.publish_with_id(Message::text(format!("m{i}")).group("g")).await.unwrap();
        let got = next(&mut seen, "a message published with its id while the runner waits").await;
        assert_eq!((Some(got.id), got.text.as_str(), got.attempt), (id, format!("m{i}").as_str(), 1));
    }
    until_empty(&q, "g").await;
    let stats = broker.stats();
    assert_eq!(stats.handed_off, 3, "{stats:?}");
    assert_eq!(stats.claims, claims, "no claim ran for them: {stats:?}");
    broker.shutdown(Duration::from_secs(5)).await;
    task.await.unwrap();
}

on_each_database!(publish_with_id_hands_over);

/// A batch runner waiting for work is handed a message as a batch of one.
async fn hands_a_batch_runner_a_batch_of_one<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let q = queue(&broker, &cleanup.queue(&unique("handbatch"))).await;
    let (tx, mut batches) = mpsc::unbounded_channel::<Vec<String>>();
    let sub = q.subscribe().batch(10).workers(2).poll_interval(FOREVER);
    let task = tokio::spawn(async move {
        sub.run_batch(move |batch: Vec<Delivery<DB>>| {
            let texts: Result<Vec<String>, Error> = batch.iter().map(|d| Ok(d.text()?.to_owned())).collect();
            let sent = texts.map(|texts| drop(tx.send(texts)));
            async move { sent }
        })
        .await
        .unwrap()
    });
    until_idle(&broker).await;
    let claims = broker.stats().claims;

    for i in 0..5 {
        q.publish(Message::text(format!("b{i}"))).await.unwrap();
        let batch = tokio::time::timeout(ARRIVES, batches.recv()).await.expect("a batch").unwrap();
        assert_eq!(batch, vec![format!("b{i}")]);
    }
    until_empty(&q, "").await;
    let stats = broker.stats();
    assert_eq!((stats.handed_off, stats.claims), (5, claims), "{stats:?}");

    broker.shutdown(Duration::from_secs(5)).await;
    task.await.unwrap();
}

on_each_database!(hands_a_batch_runner_a_batch_of_one);

/// A pause holds what a publish would hand over, as it holds a claim: the message waits
/// in the queue until the resume. The pause comes from another broker (an operator's
/// process), which does not wake the runner: only the insert's own check sees it.
async fn a_pause_holds_a_hand_off<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let operator = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("handpause"));
    let q = queue(&broker, &name).await;
    let (mut seen, task) = start(&q, "", 2, FOREVER, Arc::new(Notify::new()));
    until_idle(&broker).await;

    assert!(operator.queue(&name).unwrap().pause(None).await.unwrap());
    q.publish(Message::text("paused")).await.unwrap();
    nothing(&mut seen, "a message published to a paused queue").await;
    assert_eq!(broker.stats().handed_off, 0);
    assert_eq!(q.depth("").await.unwrap().0, 1);

    // Resumed through the runner's own broker, which wakes it.
    q.resume(None).await.unwrap();
    assert_eq!(next(&mut seen, "after the resume").await.text, "paused");
    until_empty(&q, "").await;
    // Its claims bring messages again: hand-offs go on.
    q.publish(Message::text("after")).await.unwrap();
    assert_eq!(next(&mut seen, "after the resume, published").await.text, "after");
    until_empty(&q, "").await;
    assert_eq!(broker.stats().handed_off, 1);

    broker.shutdown(Duration::from_secs(5)).await;
    task.await.unwrap();
}

on_each_database!(a_pause_holds_a_hand_off);

/// A limit of one running message, set by another broker while the runner waits, holds
/// what a publish would hand to a second free worker while the first message runs.
async fn a_limit_holds_a_hand_off<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let operator = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("handlimit"));
    let q = queue(&broker, &name).await;
    let gate = Arc::new(Notify::new());
    let (mut seen, task) = start(&q, "", 2, Duration::from_millis(100), gate.clone());
    until_idle(&broker).await;
    // Set elsewhere, without waking the runner: it has not seen the limit, so only the
    // insert's own check holds the hand-offs back.
    operator.queue(&name).unwrap().set_limit(&LimitScope::Queue, Limit::MaxRunning(1)).await.unwrap();

    q.publish(Message::text("hold")).await.unwrap();
    assert_eq!(next(&mut seen, "the first message").await.text, "hold");
    q.publish(Message::text("second")).await.unwrap();
    nothing(&mut seen, "a second message while the limit's one runs").await;
    gate.notify_one();
    assert_eq!(next(&mut seen, "once the first is done").await.text, "second");
    until_empty(&q, "").await;
    assert_eq!(broker.stats().handed_off, 0);

    broker.shutdown(Duration::from_secs(5)).await;
    task.await.unwrap();
}

on_each_database!(a_limit_holds_a_hand_off);

/// Two brokers (as two processes) run on one queue, each claiming every 50 ms. The first
/// broker publishes 20 messages one at a time, each started before the next (most handed
/// to its runner, which waits between its claims), then 400 from four publishers at once
/// (mostly claimed, by either broker): every message is started exactly once.
async fn handed_over_or_claimed_once<DB: Brokers>(place: Place) {
    let (mine, theirs) = (
        DB::broker(&place, BrokerOptions::default()).await,
        DB::broker(&place, BrokerOptions::default()).await,
    );
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("handonce"));
    let q = queue(&mine, &name).await;
    let gate = Arc::new(Notify::new());
    let (mut seen_here, here) = start(&q, "", 2, Duration::from_millis(50), gate.clone());
    let (mut seen_there, there) =
        start(&theirs.queue(&name).unwrap(), "", 2, Duration::from_millis(50), gate);
    until_idle(&mine).await;
    until_idle(&theirs).await;

    let mut count: HashMap<String, usize> = HashMap::new();
    let mut next_of_either = async |count: &mut HashMap<String, usize>| {
        let got = tokio::select! {
            got = next(&mut seen_here, "a message published") => got,
            got = next(&mut seen_there, "a message published") => got,
        };
        *count.entry(got.text).or_default() += 1;
    };
    for i in 0..20 {
        q.publish(Message::text(format!("one-{i}"))).await.unwrap();
        next_of_either(&mut count).await;
    }
    let handed_off = mine.stats().handed_off;
    assert!(handed_off > 0, "some were handed over: {:?}", mine.stats());

    let publishers: Vec<_> = (0..4)
        .map(|p| {
            let q = q.clone();
            tokio::spawn(async move {
                for i in 0..100 {
                    q.publish(Message::text(format!("{p}-{i}"))).await.unwrap();
                    if i % 7 == 0 {
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                }
            })
        })
        .collect();
    for p in publishers {
        p.await.unwrap();
    }
    for _ in 0..400 {
        next_of_either(&mut count).await;
    }
    until_empty(&q, "").await;
    nothing(&mut seen_here, "after all 420").await;
    nothing(&mut seen_there, "after all 420").await;
    assert_eq!(count.len(), 420, "every message started");
    assert!(count.values().all(|&n| n == 1), "none twice: {count:?}");

    mine.shutdown(Duration::from_secs(5)).await;
    theirs.shutdown(Duration::from_secs(5)).await;
    here.await.unwrap();
    there.await.unwrap();
}

on_each_database!(handed_over_or_claimed_once);

/// A port that reaches the server at `127.0.0.1:port` with each of its answers held back
/// `delay`: every statement through it takes at least that long.
async fn delaying(port: u16, delay: Duration) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = relay.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = relay.accept().await {
            let server = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let (mut from_client, mut to_client) = inbound.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut from_client, &mut to_server).await });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match from_server.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            tokio::time::sleep(delay).await;
                            if to_client.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    local
}

/// A runner that stops while a publish's insert is on its way to it: the message, stored
/// leased to the runner for an hour, is given back at once (its attempt not counted) and
/// another broker's subscription takes it within seconds. The publishing broker's
/// statements go through a relay that holds each answer back 300 ms, so the runner's stop
/// falls between the hand-off's reservation and its send.
async fn a_runner_gone_gets_nothing<DB: Db>(port: u16, url: &str) {
    let slow_url = common::trickle::on_port(url, delaying(port, Duration::from_millis(300)).await);
    let slow = sqlx::pool::PoolOptions::<DB>::new().max_connections(4).connect(&slow_url).await.unwrap();
    let publisher = Broker::new(slow, BrokerOptions::default()).await.unwrap();
    let other =
        Broker::new(rowbus::connect::<DB>(url, 4).await.unwrap(), BrokerOptions::default()).await.unwrap();
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("handgone"));
    let theirs = queue(&other, &name).await;
    let q = publisher.queue(&name).unwrap();
    // Read (and kept) before the publish, which would otherwise read it first.
    q.max_message_bytes().await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (seen_tx, mut seen) = mpsc::unbounded_channel::<i64>();
    let sub = q.subscribe().lease(Duration::from_secs(3600)).poll_interval(FOREVER).until(async move {
        let _ = stop_rx.await;
    });
    let runner = tokio::spawn(async move {
        sub.run(move |d: Delivery<DB>| {
            let _ = seen_tx.send(d.id());
            async { Ok::<_, Error>(()) }
        })
        .await
        .unwrap()
    });
    until_idle(&publisher).await;

    let publish = tokio::spawn({
        let q = q.clone();
        async move { q.publish(Message::text("to a runner that stops")).await.unwrap() }
    });
    // The reservation is made at once; the insert's answer is 300 ms away.
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop_tx.send(()).unwrap();
    tokio::time::timeout(ARRIVES, runner).await.expect("the runner stopped").unwrap();
    assert_eq!(publish.await.unwrap().stored, 1);
    assert!(seen.try_recv().is_err(), "the stopped runner started nothing");

    let mut sub = theirs.subscribe().poll_interval(Duration::from_millis(50)).stream().await.unwrap();
    let delivery = tokio::time::timeout(ARRIVES, futures::StreamExt::next(&mut sub))
        .await
        .expect("given back, not held for its hour's lease")
        .unwrap()
        .unwrap();
    assert_eq!((delivery.text().unwrap(), delivery.attempt()), ("to a runner that stops", 1));
    delivery.ack().await.unwrap();
    // Counted once the release's answer is back, 300 ms after the row was free.
    until_counted(&publisher, "the release", |s| s.released >= 1).await;
    assert_eq!(publisher.stats().handed_off, 1);
    drop(sub);
    publisher.shutdown(Duration::from_secs(5)).await;
    other.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_gone_gets_nothing_postgres() {
    a_runner_gone_gets_nothing::<sqlx::Postgres>(5432, common::PG).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_gone_gets_nothing_mariadb() {
    a_runner_gone_gets_nothing::<sqlx::MySql>(3306, common::MARIADB).await;
}
