//! `rowbus listen --durable`: a listener SIGKILLed while eight sessions commit
//! notifications out of order (a tenth rolled back), restarted under the same name,
//! misses nothing committed and repeats only what it printed before the kill.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{Database, Kind, Running, on_each_database, run, show, unique};
use rowbus::{DbPool, Notifier, NotifyConfig};

/// How long a listener may take to say it listens, and to exit after a signal.
const TIMEOUT: Duration = Duration::from_secs(20);
/// Notifying sessions.
const SESSIONS: usize = 8;

struct Db {
    database: Database,
    table: String,
}

impl Db {
    fn rowbus(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = common::rowbus();
        cmd.arg("--database-url")
            .arg(&self.database.url)
            .args(["--notify-table", &self.table, "--poll-interval", "0.05", "--lookback", "5s"])
            .args(args);
        cmd
    }
}

/// `rowbus listen CHANNEL --durable NAME`, once it says it listens.
fn listen(db: &Db, channel: &str, name: &str) -> Running {
    let mut listener =
        Running::spawn(db.rowbus(&["listen", channel, "--durable", name, "--lease", "1s"]), TIMEOUT);
    listener.await_stderr("listening on", TIMEOUT, |line| line.contains("listening on"));
    listener
}

/// A random number below `n`.
fn below(n: u64) -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("randomness");
    u64::from_le_bytes(bytes) % n
}

/// Each session commits (or, one time in ten, rolls back) one notification per
/// transaction, holding it open a random few milliseconds so that commits land out of id
/// order, until `until`. Returns the payloads committed and those rolled back.
async fn notify_until(
    db: &DbPool,
    notifier: &Notifier,
    channel: &str,
    until: Instant,
) -> (Vec<String>, Vec<String>) {
    let sessions = (0..SESSIONS).map(|s| async move {
        let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
        let mut i = 0;
        while Instant::now() < until {
            let payload = format!("s{s}-{i}");
            i += 1;
            let commit = below(10) != 0;
            let hold = Duration::from_millis(below(15));
            let done = match db {
                DbPool::MySql(pool) => {
                    let mut tx = pool.begin().await.expect("begin");
                    notifier.notify(&mut *tx, channel, &payload).await.expect("notify");
                    tokio::time::sleep(hold).await;
                    if commit { tx.commit().await } else { tx.rollback().await }
                }
                DbPool::Sqlite(pool) => {
                    let mut tx = pool.begin().await.expect("begin");
                    notifier.notify(&mut *tx, channel, &payload).await.expect("notify");
                    tokio::time::sleep(hold).await;
                    if commit { tx.commit().await } else { tx.rollback().await }
                }
                DbPool::Postgres(pool) => {
                    let mut tx = pool.begin().await.expect("begin");
                    notifier.notify(&mut *tx, channel, &payload).await.expect("notify");
                    tokio::time::sleep(hold).await;
                    if commit { tx.commit().await } else { tx.rollback().await }
                }
            };
            done.expect("end the transaction");
            if commit { committed.push(payload) } else { rolled_back.push(payload) }
        }
        (committed, rolled_back)
    });
    let mut all = (Vec::new(), Vec::new());
    for (committed, rolled_back) in futures::future::join_all(sessions).await {
        all.0.extend(committed);
        all.1.extend(rolled_back);
    }
    all
}

impl Db {
    /// A notify table of the test's own, deployed for durable listeners (dropped with the
    /// test's other tables).
    fn deployed(kind: Kind) -> Db {
        let table = unique("dcli");
        let database = Database::new(kind, &table);
        database.cleanup.notify_table(&table);
        let db = Db { database, table };
        let deployed = run(db.rowbus(&["deploy", "--durable"]));
        assert!(deployed.status.success(), "deploy failed\n{}", show(&deployed));
        db
    }
}

fn sigkill_and_restart_miss_nothing(kind: Kind) {
    let db = Db::deployed(kind);
    let (channel, name) = (unique("dch"), unique("reader"));
    let prefix = format!("{channel}: ");

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let pool = runtime.block_on(DbPool::connect_with_size(&db.database.url, SESSIONS as u32 + 1)).unwrap();
    let config = NotifyConfig { table: db.table.clone(), ..NotifyConfig::default() };
    // On PostgreSQL the notify table's rows come from durable notifiers only.
    let notifier = Notifier::durable(config).unwrap();

    let mut first = listen(&db, &channel, &name);
    let start = Instant::now();
    let senders = {
        let (pool, notifier, channel) = (pool.clone(), notifier, channel.clone());
        runtime.spawn(async move {
            notify_until(&pool, &notifier, &channel, start + Duration::from_secs(6)).await
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let (_, before_kill, _) = first.stop("KILL");
    std::thread::sleep(Duration::from_secs(2));
    let mut second = listen(&db, &channel, &name);
    let (committed, rolled_back) = runtime.block_on(senders).unwrap();
    assert!(
        committed.len() > 100 && !rolled_back.is_empty(),
        "{} committed, {} rolled back",
        committed.len(),
        rolled_back.len()
    );

    // The restarted listener catches up with everything committed.
    let printed_before: BTreeSet<String> =
        before_kill.iter().filter_map(|l| l.strip_prefix(&prefix)).map(str::to_owned).collect();
    assert_eq!(
        printed_before.len(),
        before_kill.len(),
        "a line twice, or not on the channel, before the kill"
    );
    let mut after: BTreeMap<String, usize> = BTreeMap::new();
    let missing = |after: &BTreeMap<String, usize>| {
        committed.iter().filter(|p| !printed_before.contains(*p) && !after.contains_key(*p)).count()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while missing(&after) > 0 {
        assert!(Instant::now() < deadline, "{} committed notifications never printed", missing(&after));
        let line = second.next_line("the rest of the committed notifications");
        let payload =
            line.strip_prefix(&prefix).unwrap_or_else(|| panic!("a line not on the channel: {line:?}"));
        *after.entry(payload.to_owned()).or_default() += 1;
    }
    second.no_line(Duration::from_millis(500), "everything committed was printed");
    let (status, rest, stderr) = second.stop("TERM");
    assert!(status.success() && rest.is_empty(), "{status}, {rest:?}, {stderr:?}");
    assert!(stderr.iter().any(|l| l.contains("resuming")), "the restart did not resume: {stderr:?}");

    // `rowbus stats` shows the name: given up at SIGTERM, caught up.
    let stats = run(db.rowbus(&["stats", "--json"]));
    assert!(stats.status.success(), "{}", show(&stats));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let listed = stats["durable_listeners"].as_array().expect("durable_listeners").iter();
    let mine: Vec<_> = listed.filter(|d| d["name"] == name.as_str()).collect();
    assert_eq!(mine.len(), 1, "{stats}");
    assert_eq!(
        (&mine[0]["channel"], &mine[0]["owned"], &mine[0]["lag_rows"]),
        (&channel.as_str().into(), &false.into(), &0.into())
    );
    assert!(mine[0]["mark"].as_u64().is_some(), "{stats}");

    let committed: BTreeSet<&String> = committed.iter().collect();
    for (payload, times) in &after {
        assert_eq!(*times, 1, "{payload} printed {times} times after the restart");
        assert!(committed.contains(payload), "{payload} printed but never committed (rolled back?)");
    }
    let repeats: Vec<&String> = after.keys().filter(|p| printed_before.contains(*p)).collect();
    for payload in &printed_before {
        assert!(committed.contains(payload), "{payload} printed before the kill but never committed");
    }
    eprintln!(
        "durable restart on {:?}: {} committed, {} rolled back, {} printed before the kill, {} after, {} of them again",
        kind,
        committed.len(),
        rolled_back.len(),
        printed_before.len(),
        after.len(),
        repeats.len()
    );
    runtime.block_on(pool.close());
}
on_each_database!(sigkill_and_restart_miss_nothing);

/// `rowbus notify --durable` on PostgreSQL writes the row a durable `listen` reads, and
/// still reaches a plain `listen` as sent; a plain `notify` reaches both too (the durable
/// one prints it while it runs, and does not resume it).
fn postgres_durable_notify_reaches_both_listeners(kind: Kind) {
    let table = unique("dcli");
    let database = Database::new(kind, &table);
    database.cleanup.notify_table(&table);
    let db = Db { database, table };
    let plain_deploy = run(db.rowbus(&["deploy"]));
    let said = String::from_utf8_lossy(&plain_deploy.stdout);
    assert!(plain_deploy.status.success() && said.contains("deploy --durable"), "{}", show(&plain_deploy));
    let refused = run(db.rowbus(&["notify", "x", "--durable"]));
    assert!(!refused.status.success(), "notified durably without the table");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("rowbus deploy --durable"),
        "{}",
        show(&refused)
    );
    let deployed = run(db.rowbus(&["deploy", "--durable"]));
    assert!(deployed.status.success(), "deploy failed\n{}", show(&deployed));

    let channel = unique("both");
    let mut durable = listen(&db, &channel, &unique("reader"));
    let mut plain = Running::spawn(db.rowbus(&["listen", &channel]), TIMEOUT);
    plain.await_stderr("listening on", TIMEOUT, |line| line.contains("listening on"));
    for args in [["notify", &channel, "plain"].as_slice(), &["notify", &channel, "kept", "--durable"]] {
        let sent = run(db.rowbus(args));
        assert!(sent.status.success(), "{}", show(&sent));
    }
    assert_eq!(plain.next_line("the plain notification"), format!("{channel}: plain"));
    assert_eq!(plain.next_line("the durable notification"), format!("{channel}: kept"));
    let mut got = [durable.next_line("a notification"), durable.next_line("the other notification")];
    got.sort();
    assert_eq!(got, [format!("{channel}: kept"), format!("{channel}: plain")]);
    durable.no_line(Duration::from_millis(500), "each notification comes once");
    plain.no_line(Duration::from_millis(100), "each notification comes once");
    for mut running in [durable, plain] {
        let (status, _, stderr) = running.stop("TERM");
        assert!(status.success(), "{status}, {stderr:?}");
    }
}
on_each_database!(postgres_durable_notify_reaches_both_listeners on postgres);

/// `listen --durable NAME` with its name held, waiting for it, once it says so.
fn waiting(db: &Db, channel: &str, name: &str) -> Running {
    let mut waiting =
        Running::spawn(db.rowbus(&["listen", channel, "--durable", name, "--lease", "4s"]), TIMEOUT);
    let said = waiting.await_stderr("waiting", TIMEOUT, |line| line.contains("waiting at most"));
    assert!(said.contains("held by another process"), "{said}");
    waiting
}

/// Whether `rowbus stats` says durable listener `name` is held.
fn stats_says_held(db: &Db, name: &str) -> bool {
    let stats = run(db.rowbus(&["stats"]));
    assert!(stats.status.success(), "{}", show(&stats));
    let text = String::from_utf8_lossy(&stats.stdout).into_owned();
    let line = text.lines().find(|l| l.contains(&format!("{name:?}"))).unwrap_or_else(|| panic!("{text}"));
    assert!(line.ends_with("(held)") || line.ends_with("(free)"), "{line}");
    line.ends_with("(held)")
}

/// An owner SIGKILLed keeps its name until its lease runs out: two `listen`s started at
/// once with the name both wait for it, and exactly one takes it, the other refused; the
/// winner SIGKILLed in turn, `stats` says held only until its lease has run out.
fn a_killed_owners_name_goes_to_one_of_two_waiting(kind: Kind) {
    let db = Db::deployed(kind);
    let (channel, name) = (unique("dch"), unique("reader"));
    let mut owner =
        Running::spawn(db.rowbus(&["listen", &channel, "--durable", &name, "--lease", "4s"]), TIMEOUT);
    owner.await_stderr("listening on", TIMEOUT, |line| line.contains("listening on"));
    assert!(stats_says_held(&db, &name), "a live owner holds its name");
    owner.stop("KILL");

    let mut racers = [waiting(&db, &channel, &name), waiting(&db, &channel, &name)];
    let outcomes: Vec<String> = racers
        .iter_mut()
        .map(|r| {
            r.await_stderr("listening or refused", TIMEOUT, |l| {
                l.contains("listening on") || l.contains("error")
            })
        })
        .collect();
    let winners: Vec<usize> = (0..2).filter(|&i| outcomes[i].contains("listening on")).collect();
    assert_eq!(winners.len(), 1, "exactly one takes the name: {outcomes:?}");
    let (winner, loser) = (winners[0], 1 - winners[0]);
    assert!(outcomes[loser].contains("in use by another process"), "{outcomes:?}");
    let (status, _) = racers[loser].wait_exit(TIMEOUT);
    assert!(!status.success(), "the refused one fails");

    let sent = run(db.rowbus(&["notify", &channel, "to the winner", "--durable"]));
    assert!(sent.status.success(), "{}", show(&sent));
    assert_eq!(racers[winner].next_line("the notification"), format!("{channel}: to the winner"));
    racers[winner].stop("KILL");
    let deadline = Instant::now() + Duration::from_secs(60);
    while stats_says_held(&db, &name) {
        assert!(Instant::now() < deadline, "still held a minute after its owner was killed");
        std::thread::sleep(Duration::from_millis(500));
    }
    let json = run(db.rowbus(&["stats", "--json"]));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("stats --json");
    let mine =
        report["durable_listeners"].as_array().unwrap().iter().find(|d| d["name"] == name.as_str()).cloned();
    let mine = mine.unwrap_or_else(|| panic!("{report}"));
    assert_eq!((mine["owned"].as_bool(), mine["lease_s"].as_f64()), (Some(false), Some(4.0)), "{mine}");

    // `--no-wait` refuses at once while a live owner holds the name.
    let mut live = listen(&db, &channel, &name);
    let refused = run(db.rowbus(&["listen", &channel, "--durable", &name, "--no-wait"]));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && !said.contains("waiting"), "{}", show(&refused));
    assert!(said.contains("in use by another process"), "{}", show(&refused));
    let (status, _, _) = live.stop("TERM");
    assert!(status.success());
}
on_each_database!(a_killed_owners_name_goes_to_one_of_two_waiting);
