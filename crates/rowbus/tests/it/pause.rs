//! Pausing and resuming a queue or a group, against the real PostgreSQL and MariaDB and a
//! temporary SQLite file: running subscriptions (`run` and `run_tx`) of another broker (as
//! another process would be) stop taking messages, finish what they hold, and go on after
//! a resume; publishing goes on; the state is in the database.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use rowbus::stats::Paused;
use rowbus::{Broker, BrokerOptions, Db, DbPool, Error, Message, Queue};
use tokio::sync::{Notify, mpsc};

/// Longer than any test: a subscription that sees a message at all was woken.
const FOREVER: Duration = Duration::from_secs(3600);
/// How long a message a subscription should take may take to arrive.
const ARRIVES: Duration = Duration::from_secs(20);
/// How long a held subscription is watched for a message it must not take: many of the
/// short poll intervals, and ample for a woken claim.
const QUIET: Duration = Duration::from_millis(1500);

use common::place_test as database_test;

fn notifying() -> BrokerOptions {
    BrokerOptions { listen_notify: true, ..BrokerOptions::default() }
}

/// A deployed queue of the test's own on `broker`.
async fn queue<DB: Db>(broker: &Broker<DB>, name: &str) -> Queue<DB> {
    let queue = broker.queue(name).unwrap();
    queue.deploy().await.unwrap();
    queue
}

/// What a running subscription handles: each payload, in order. A message `hold` says
/// so on `started` and waits for `gate` before it is done.
struct Handled {
    payloads: mpsc::UnboundedReceiver<String>,
    started: Arc<Notify>,
    gate: Arc<Notify>,
}

impl Handled {
    fn new() -> (Handled, Handler) {
        let (tx, payloads) = mpsc::unbounded_channel();
        let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let handler = Handler { tx, started: started.clone(), gate: gate.clone() };
        (Handled { payloads, started, gate }, handler)
    }

    /// The next payload handled, which must come within [`ARRIVES`].
    async fn next(&mut self, what: &str) -> String {
        tokio::time::timeout(ARRIVES, self.payloads.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}: nothing handled within {ARRIVES:?}"))
            .expect("the subscription is running")
    }

    /// Asserts nothing is handled for [`QUIET`].
    async fn nothing(&mut self, what: &str) {
        if let Ok(got) = tokio::time::timeout(QUIET, self.payloads.recv()).await {
            panic!("{what}: handled {got:?}");
        }
    }
}

/// The handler's side of [`Handled`].
#[derive(Clone)]
struct Handler {
    tx: mpsc::UnboundedSender<String>,
    started: Arc<Notify>,
    gate: Arc<Notify>,
}

impl Handler {
    async fn handle(&self, text: &str) {
        if text == "hold" {
            self.started.notify_one();
            self.gate.notified().await;
        }
        let _ = self.tx.send(text.to_owned());
    }
}

/// Which runner a scenario drives.
#[derive(Clone, Copy, Debug)]
enum Runner {
    Run,
    RunTx,
}

/// Starts `runner` on `queue`'s `group` with `poll`, two workers.
fn start<DB: Db>(
    queue: &Queue<DB>,
    group: &str,
    poll: Duration,
    runner: Runner,
) -> (Handled, tokio::task::JoinHandle<()>) {
    let (handled, handler) = Handled::new();
    let sub = queue.subscribe().group(group).workers(2).poll_interval(poll);
    let task = tokio::spawn(async move {
        match runner {
            Runner::Run => sub
                .run(move |delivery| {
                    let handler = handler.clone();
                    async move {
                        handler.handle(delivery.text()?).await;
                        Ok::<_, Error>(())
                    }
                })
                .await
                .unwrap(),
            Runner::RunTx => sub
                .run_tx(move |_conn, message| {
                    let handler = handler.clone();
                    Box::pin(async move {
                        handler.handle(message.text()?).await;
                        Ok::<_, Error>(())
                    })
                })
                .await
                .unwrap(),
        }
    });
    (handled, task)
}

/// With `listen_notify` and an hour's poll interval, another broker's pause holds a running
/// subscription while it finishes the message it holds; publishing goes on; the resume
/// wakes it at once and it takes what was published meanwhile.
async fn pause_and_resume<DB: Brokers>(place: Place, runner: Runner) {
    let (consumer, operator) = (DB::broker(&place, notifying()).await, DB::broker(&place, notifying()).await);
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("pause"));
    let (mine, theirs) = (queue(&consumer, &name).await, operator.queue(&name).unwrap());
    let (mut handled, task) = start(&mine, "", FOREVER, runner);

    theirs.publish(Message::text("before")).await.unwrap();
    assert_eq!(handled.next("a message before the pause").await, "before");
    theirs.publish(Message::text("hold")).await.unwrap();
    handled.started.notified().await;
    // On SQLite a transactional handler holds the one write lock, which the pause waits
    // for: the gate opens while the pause runs.
    let pausing = tokio::spawn({
        let theirs = theirs.clone();
        async move { theirs.pause(None).await.unwrap() }
    });
    tokio::task::yield_now().await;
    handled.gate.notify_one();
    assert_eq!(handled.next("the message held over the pause").await, "hold");
    assert!(pausing.await.unwrap(), "a first pause pauses");
    assert!(!theirs.pause(None).await.unwrap(), "a second changes nothing");

    theirs.publish_batch([Message::text("during 1"), Message::text("during 2")]).await.unwrap();
    handled.nothing("paused").await;
    assert_eq!(theirs.depth("").await.unwrap().0, 2, "published while paused, and left alone");
    assert!(mine.is_paused("").await.unwrap());
    let stats = mine.group_stats().await.unwrap();
    assert!(stats[0].paused && stats[0].ready == 2, "{stats:?}");

    assert_eq!(theirs.resume(None).await.unwrap(), 1);
    let mut after = vec![handled.next("after the resume").await, handled.next("after the resume").await];
    after.sort();
    assert_eq!(after, ["during 1", "during 2"]);
    assert!(!mine.is_paused("").await.unwrap());
    assert!(!mine.group_stats().await.unwrap()[0].paused);

    consumer.shutdown(Duration::from_secs(5)).await;
    task.await.unwrap();
    mine.undeploy().await.unwrap();
    cleanup.forget(&name);
    operator.shutdown(Duration::from_secs(1)).await;
}

async fn pause_and_resume_run<DB: Brokers>(place: Place) {
    pause_and_resume::<DB>(place, Runner::Run).await;
}
on_each_database!(pause_and_resume_run);

async fn pause_and_resume_run_tx<DB: Brokers>(place: Place) {
    pause_and_resume::<DB>(place, Runner::RunTx).await;
}
on_each_database!(pause_and_resume_run_tx);

/// Without `listen_notify`, nothing wakes a subscription of another broker: it sees a
/// pause and a resume at its next poll. Pausing a group leaves the others alone; a
/// group's resume does not lift the whole queue's pause; the queue's resume lifts all.
async fn groups_and_polls<DB: Brokers>(place: Place) {
    let options = BrokerOptions { poll_interval: Duration::from_millis(100), ..BrokerOptions::default() };
    let (consumer, operator) = (DB::broker(&place, options.clone()).await, DB::broker(&place, options).await);
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("pause_groups"));
    let (mine, theirs) = (queue(&consumer, &name).await, operator.queue(&name).unwrap());
    let (mut a, a_task) = start(&mine, "a", Duration::from_millis(100), Runner::Run);
    let (mut b, b_task) = start(&mine, "b", Duration::from_millis(100), Runner::RunTx);

    assert!(theirs.pause(Some("a")).await.unwrap());
    theirs.publish_batch([Message::text("a1").group("a"), Message::text("b1").group("b")]).await.unwrap();
    assert_eq!(b.next("the other group").await, "b1");
    a.nothing("group a paused").await;
    let paused = theirs.paused().await.unwrap();
    assert_eq!((paused.queue, paused.groups), (false, vec!["a".to_owned()]));
    assert!(mine.is_paused("a").await.unwrap() && !mine.is_paused("b").await.unwrap());
    settled(&mine, "b").await;
    let stats = mine.group_stats().await.unwrap();
    let paused: Vec<(&str, bool)> = stats.iter().map(|g| (g.group.as_str(), g.paused)).collect();
    assert_eq!(paused, [("a", true)], "b's message is gone; a's stays, paused");

    assert!(theirs.pause(None).await.unwrap());
    theirs.publish(Message::text("b2").group("b")).await.unwrap();
    b.nothing("the whole queue paused").await;
    assert_eq!(theirs.resume(Some("a")).await.unwrap(), 1);
    a.nothing("the group resumed, the queue still paused").await;
    let paused = theirs.paused().await.unwrap();
    assert_eq!((paused.queue, paused.groups), (true, Vec::<String>::new()));

    assert!(theirs.pause(Some("c")).await.unwrap());
    let stats = mine.group_stats().await.unwrap();
    let listed: Vec<(&str, i64, bool)> =
        stats.iter().map(|g| (g.group.as_str(), g.depth, g.paused)).collect();
    assert_eq!(
        listed,
        [("a", 1, true), ("b", 1, true), ("c", 0, true)],
        "a paused group with no message is listed"
    );
    assert_eq!(theirs.resume(None).await.unwrap(), 2, "the queue's pause and c's");
    assert_eq!(a.next("resumed at the next poll").await, "a1");
    assert_eq!(b.next("resumed at the next poll").await, "b2");
    assert_eq!(theirs.paused().await.unwrap(), Paused::default());

    consumer.shutdown(Duration::from_secs(5)).await;
    a_task.await.unwrap();
    b_task.await.unwrap();
    mine.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(groups_and_polls);

/// Waits (at most [`ARRIVES`]) until `group` has no message left: the handled ones
/// acknowledged.
async fn settled<DB: Db>(queue: &Queue<DB>, group: &str) {
    let deadline = tokio::time::Instant::now() + ARRIVES;
    while queue.depth(group).await.unwrap().0 > 0 {
        assert!(tokio::time::Instant::now() < deadline, "group {group:?} still has messages");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pause is in the database: a broker made after it (a restarted process) finds the
/// queue paused and takes nothing until it is resumed.
async fn pause_outlives_the_broker<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("pause_kept"));
    let first = DB::broker(&place, BrokerOptions::default()).await;
    let q = queue(&first, &name).await;
    q.publish(Message::text("kept")).await.unwrap();
    q.pause(None).await.unwrap();
    first.shutdown(Duration::from_secs(1)).await;
    first.pool().close().await;

    let second = DB::broker(&place, notifying()).await;
    let q = queue(&second, &name).await;
    assert!(q.is_paused("").await.unwrap());
    let (mut handled, task) = start(&q, "", FOREVER, Runner::Run);
    handled.nothing("paused before this broker began").await;
    q.resume(None).await.unwrap();
    assert_eq!(handled.next("resumed").await, "kept");
    second.shutdown(Duration::from_secs(5)).await;
    task.await.unwrap();
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(pause_outlives_the_broker);

/// A queue deployed before pause tables (its pause table dropped here) cannot be claimed
/// from or paused, and says to deploy; its figures show nothing paused; deploying it
/// again adds the pause table and keeps its messages.
async fn deploy_adds_the_pause_table<DB: Brokers>(place: Place) {
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("pause_old"));
    let q = queue(&broker, &name).await;
    q.publish(Message::text("old")).await.unwrap();
    drop_pause_table(&place, &name).await;

    let missing = |e: Error| match e {
        Error::MissingPauseTable { table } => assert_eq!(table, name),
        other => panic!("expected MissingPauseTable, got {other:?}"),
    };
    missing(q.pause(None).await.unwrap_err());
    let mut sub = q.subscribe().stream().await.unwrap();
    missing(futures::StreamExt::next(&mut sub).await.unwrap().unwrap_err());
    drop(sub);
    let err = q.pause(Some("g")).await.unwrap_err();
    assert!(err.is_permanent() && err.to_string().contains("rowbus deploy --queue"), "{err}");
    assert!(!q.group_stats().await.unwrap()[0].paused);

    q.deploy().await.unwrap();
    assert!(q.pause(None).await.unwrap());
    assert_eq!(q.depth("").await.unwrap().0, 1);
    q.resume(None).await.unwrap();
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
    broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(deploy_adds_the_pause_table);

/// Drops `<name>_pause`, as a queue deployed by an older rowbus lacks it.
async fn drop_pause_table(place: &Place, name: &str) {
    let sql = sqlx::AssertSqlSafe(format!("DROP TABLE {name}_pause"));
    match place.pool().await {
        DbPool::Postgres(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
        DbPool::MySql(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
        DbPool::Sqlite(pool) => drop(sqlx::query(sql).execute(&pool).await.unwrap()),
    }
}
