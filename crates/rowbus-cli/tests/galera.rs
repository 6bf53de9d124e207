//! rowbus on a real three-node MariaDB Galera cluster (scripts/galera.sh: nodes on
//! 127.0.0.1:3311-3313, started here when down; a test fails when it cannot start): the
//! emulated LISTEN/NOTIFY across nodes with transactions committing out of order, three
//! `rowbus consume` processes (one per node) draining a backlog exactly once, and a node
//! SIGKILLed mid-drain and restarted. The tests take the cluster in turns: one kills a node.

// The database-per-test macro is for the shared servers; these tests have their own.
#[allow(unused_macros, unused_imports)]
mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::{queue_tables_on, read_all, read_lines, rowbus, run_quietly, run_with, show, text, unique};
use rowbus::sqlx::MySql;
use rowbus::{DbPool, Event, Listener, ListenerOptions, Notifier, NotifyConfig};

/// Node `n`'s URL (1-3).
fn url(n: usize) -> String {
    format!("mysql://root@127.0.0.1:{}/test", 3310 + n)
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/galera.sh")
}

/// Runs scripts/galera.sh with `args`; panics with its output when it fails.
fn galera(args: &[&str]) {
    let mut cmd = Command::new(script());
    cmd.args(args).stdin(Stdio::null());
    let (output, _) = run_with(cmd, None, Duration::from_secs(300));
    assert!(
        output.status.success(),
        "scripts/galera.sh {} failed: the Galera cluster the tests need is not running\n{}",
        args.join(" "),
        show(&output)
    );
}

static CLUSTER: Mutex<()> = Mutex::new(());

/// The cluster, all three nodes ready, for this test alone.
fn cluster() -> MutexGuard<'static, ()> {
    let turn = CLUSTER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    galera(&["up"]);
    turn
}

/// Runs `sql` on node `n` with the mariadb client; its output.
fn sql(n: usize, sql: &str) -> String {
    let port = (3310 + n).to_string();
    let out = Command::new("mariadb")
        .args(["-N", "-B", "-h", "127.0.0.1", "-P", &port, "-u", "root", "test", "-e", sql])
        .stdin(Stdio::null())
        .output()
        .expect("running the mariadb client");
    assert!(out.status.success(), "`{sql}` on node {n} failed: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Drops the tables a test made on the cluster, also when it fails (the cluster itself is
/// thrown away by `scripts/galera.sh down`, which scripts/test.sh runs after the tests).
struct Tables(Vec<String>);

impl Drop for Tables {
    fn drop(&mut self) {
        for node in [1, 3, 2] {
            let list = self.0.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ");
            let port = (3310 + node).to_string();
            let dropped = Command::new("mariadb")
                .args(["-h", "127.0.0.1", "-P", &port, "-u", "root", "test", "-e"])
                .arg(format!("DROP TABLE IF EXISTS {list}"))
                .stdin(Stdio::null())
                .output();
            if dropped.is_ok_and(|o| o.status.success()) {
                return;
            }
        }
        eprintln!("cannot drop {:?} on any node", self.0);
    }
}

/// A queue table deployed with `rowbus deploy` on node 1 and the same deploy again on
/// node 3 (DDL replicates in total order: the second finds everything in place), with its
/// own notify table; each node then has every one of them.
fn deploy(name: &str) -> Tables {
    let notify = format!("{name}_nt");
    let mut names = queue_tables_on(rowbus::Backend::MySql, name);
    names.push(notify.clone());
    let tables = Tables(names);
    for node in [1, 3] {
        let mut cmd = rowbus();
        cmd.args(["deploy", "--database-url", &url(node), "--queue", name, "--notify-table", &notify]);
        let out = run_quietly(cmd, None, &format!("Galera node {node}"));
        assert!(out.contains(&format!("queue table `{name}` is ready")), "{out}");
    }
    for node in 1..=3 {
        let found = sql(
            node,
            &format!(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'test' AND table_name IN ('{}')",
                tables.0.join("', '")
            ),
        );
        assert_eq!(
            found.trim(),
            tables.0.len().to_string(),
            "node {node} lacks a table the deploy made: {:?}",
            tables.0
        );
    }
    tables
}

/// Publishes `payloads` to `table` through node `n`, one message per line.
fn publish(n: usize, table: &str, payloads: &[String]) {
    let mut cmd = rowbus();
    cmd.args(["publish", "--database-url", &url(n), "--notify-table", &format!("{table}_nt"), table, "-"]);
    let input = payloads.join("\n") + "\n";
    run_quietly(cmd, Some(input.as_bytes()), &format!("Galera node {n}"));
}

/// A `rowbus consume --json` process on node `node`: its handled messages as they come.
struct Consumer {
    node: usize,
    child: Child,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl Consumer {
    fn start(node: usize, table: &str) -> Consumer {
        let mut cmd = rowbus();
        cmd.args(["consume", "--database-url", &url(node), "--json", "--workers", "4"])
            .args(["--poll-interval", "100ms", "--lease", "5s", table])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start rowbus consume");
        let lines = read_lines(child.stdout.take().unwrap());
        let stderr = Some(read_all(child.stderr.take().unwrap()));
        Consumer { node, child, lines, stderr }
    }

    /// Payloads handled since the last call.
    fn handled(&mut self) -> Vec<String> {
        let mut got = Vec::new();
        loop {
            match self.lines.try_recv() {
                Ok(line) => {
                    let v: serde_json::Value = serde_json::from_str(&line)
                        .unwrap_or_else(|e| panic!("consumer on node {}: not JSON ({e}): {line}", self.node));
                    got.push(v["payload"].as_str().expect("a text payload").to_owned());
                }
                Err(TryRecvError::Empty) => return got,
                Err(TryRecvError::Disconnected) => {
                    let (node, status) = (self.node, self.child.try_wait());
                    let log = self.stop();
                    panic!("consumer on node {node} exited ({status:?}): {log}");
                }
            }
        }
    }

    /// Stops it with SIGINT; its stderr.
    fn stop(&mut self) -> String {
        let _ = Command::new("kill").arg("-INT").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr.take().map(|h| text(&h.join().unwrap_or_default())).unwrap_or_default()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Collects what `consumers` handle until every one of `expected` was handled (within
/// `within`, or the test fails): per payload, the consumers (by index) that handled it.
fn collect(
    consumers: &mut [Consumer],
    seen: &mut HashMap<String, Vec<usize>>,
    expected: &BTreeSet<String>,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    while !expected.iter().all(|p| seen.contains_key(p)) {
        if Instant::now() > deadline {
            let missing: Vec<_> = expected.iter().filter(|p| !seen.contains_key(*p)).take(10).collect();
            let logs: Vec<String> = consumers
                .iter_mut()
                .map(|c| {
                    let node = c.node;
                    format!("node {node}: {}", c.stop())
                })
                .collect();
            panic!("not handled within {within:?} (first missing: {missing:?})\n{}", logs.join("\n"));
        }
        if !poll(consumers, seen) {
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Records what `consumers` handled since the last look; whether there was anything.
fn poll(consumers: &mut [Consumer], seen: &mut HashMap<String, Vec<usize>>) -> bool {
    let mut any = false;
    for (i, c) in consumers.iter_mut().enumerate() {
        for payload in c.handled() {
            any = true;
            seen.entry(payload).or_default().push(i);
        }
    }
    any
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A listener on node 2; transactions on nodes 1 and 3, opened in one order and committed
/// in another (their notify-table ids interleave by node and commit out of order), every
/// fourth rolled back: each committed notification arrives exactly once, no rolled-back one.
#[test]
fn notifications_cross_nodes_exactly_once_whatever_the_commit_order() {
    let _cluster = cluster();
    runtime().block_on(async {
        let config = NotifyConfig {
            table: unique("gnt"),
            poll_interval: Duration::from_millis(50),
            lookback: Duration::from_secs(10),
            ..NotifyConfig::default()
        };
        let _tables = Tables(vec![config.table.clone(), format!("{}_positions", config.table)]);
        let db = DbPool::connect(&url(1)).await.expect("node 1");
        db.deploy_notify_table(&config).await.expect("deploy the notify table on node 1");
        let options = ListenerOptions { notify_table: config.clone(), ..ListenerOptions::default() };
        let mut listener = Listener::connect_with(&url(2), options).await.expect("a listener on node 2");
        let channel = unique("gch");
        listener.listen(&channel).await.unwrap();
        let notifier = Notifier::new(config.clone()).unwrap();
        let nodes = [
            rowbus::connect::<MySql>(&url(1), 12).await.expect("node 1"),
            rowbus::connect::<MySql>(&url(3), 12).await.expect("node 3"),
        ];

        let mut committed = BTreeSet::new();
        for round in 0..4 {
            let mut open = Vec::new();
            for i in 0..10 {
                let mut tx = nodes[i % 2].begin().await.unwrap();
                let payload = format!("{round}-{i}");
                notifier.notify(&mut *tx, &channel, &payload).await.expect("notify in a transaction");
                open.push((payload, tx));
            }
            // Last opened first, then the others: higher ids commit before lower ones.
            open.rotate_left(3);
            open.reverse();
            for (n, (payload, tx)) in open.into_iter().enumerate() {
                if n % 4 == 3 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.expect("commit");
                    committed.insert(payload);
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }

        let mut received = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while received.len() < committed.len() {
            match tokio::time::timeout_at(deadline, listener.recv()).await {
                Ok(Ok(Event::Notification(n))) => received.push(n.payload),
                Ok(other) => panic!("expected notifications, got {other:?}"),
                Err(_) => panic!(
                    "{} of {} notifications within 30 s: {received:?}",
                    received.len(),
                    committed.len()
                ),
            }
        }
        // Anything more (a duplicate, a rolled-back one) would come within a few polls.
        if let Ok(event) = tokio::time::timeout(Duration::from_secs(2), listener.recv()).await {
            panic!("expected nothing more, got {event:?}");
        }
        let unique_received: BTreeSet<String> = received.iter().cloned().collect();
        assert_eq!(unique_received.len(), received.len(), "a notification arrived twice: {received:?}");
        assert_eq!(unique_received, committed);
        drop(listener);
        for pool in nodes {
            pool.close().await;
        }
        db.close().await;
    });
}

/// Three `rowbus consume` processes, one per node, drain a backlog published on all three
/// exactly once; none reports a failed claim (a certification conflict is retried at once).
#[test]
fn one_consumer_per_node_drains_a_backlog_exactly_once() {
    let _cluster = cluster();
    let table = unique("gq");
    let _tables = deploy(&table);
    let mut expected = BTreeSet::new();
    for node in 1..=3 {
        let payloads: Vec<String> = (0..500).map(|i| format!("n{node}-{i}")).collect();
        publish(node, &table, &payloads);
        expected.extend(payloads);
    }
    let mut consumers: Vec<Consumer> = (1..=3).map(|node| Consumer::start(node, &table)).collect();
    let mut seen = HashMap::new();
    collect(&mut consumers, &mut seen, &expected, Duration::from_secs(120));
    thread::sleep(Duration::from_secs(1)); // a duplicate would come now
    poll(&mut consumers, &mut seen);
    let logs: Vec<String> = consumers.iter_mut().map(Consumer::stop).collect();
    let twice: Vec<_> = seen.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(seen.len(), expected.len(), "handled messages that were not published");
    for (node, log) in (1..=3).zip(&logs) {
        assert!(!log.contains("claim failed") && !log.contains("claims failed"), "node {node}: {log}");
    }
    let handled_by: Vec<usize> = (0..3).map(|i| seen.values().filter(|by| by[0] == i).count()).collect();
    assert!(handled_by.iter().all(|&n| n > 0), "a consumer handled nothing: {handled_by:?}");
    assert_eq!(sql(2, &format!("SELECT COUNT(*) FROM `{table}`")).trim(), "0");
    assert_eq!(sql(3, &format!("SELECT COUNT(*) FROM `{table}_dead`")).trim(), "0");
}

/// Node 2 SIGKILLed mid-drain and started again: every message is handled (some twice
/// around the fault: at least once), those published after the node rejoined exactly once,
/// and node 2's consumer takes messages again once the node has rejoined.
#[test]
fn a_node_killed_mid_drain_loses_nothing_and_its_consumer_carries_on() {
    let _cluster = cluster();
    let table = unique("gk");
    let _tables = deploy(&table);
    let mut expected = BTreeSet::new();
    for node in 1..=3 {
        let payloads: Vec<String> = (0..1000).map(|i| format!("n{node}-{i}")).collect();
        publish(node, &table, &payloads);
        expected.extend(payloads);
    }
    let mut consumers: Vec<Consumer> = (1..=3).map(|node| Consumer::start(node, &table)).collect();
    let mut seen: HashMap<String, Vec<usize>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < expected.len() / 4 {
        assert!(Instant::now() < deadline, "a quarter of the backlog not handled within 60 s");
        if !poll(&mut consumers, &mut seen) {
            thread::sleep(Duration::from_millis(10));
        }
    }
    galera(&["kill", "2"]);
    let killed_at = seen.len();
    // The other two go on meanwhile; node 2 rejoins (IST or SST) and syncs.
    thread::sleep(Duration::from_secs(2));
    galera(&["start", "2"]);
    poll(&mut consumers, &mut seen);

    // Batches go out until node 2's consumer has taken one of them: how soon it claims
    // again after the rejoin depends on its pool's reconnect and the machine's load, and
    // the other two would drain one big batch alone meanwhile.
    let mut after: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    for round in 0.. {
        let batch: Vec<String> = (0..100).map(|i| format!("after-{round}-{i}")).collect();
        publish(1, &table, &batch);
        expected.extend(batch.iter().cloned());
        after.extend(batch);
        collect(&mut consumers, &mut seen, &expected, Duration::from_secs(120));
        if after.iter().any(|p| seen[p].contains(&1)) {
            break;
        }
        if Instant::now() > deadline {
            let log = consumers[1].stop();
            panic!(
                "node 2's consumer handled none of {} messages published after it rejoined\n{log}",
                after.len()
            );
        }
        thread::sleep(Duration::from_millis(500));
    }
    // A message handled when the node died, its acknowledgement lost, is still queued
    // under its lease: it runs again once that runs out (5 s).
    let deadline = Instant::now() + Duration::from_secs(60);
    while sql(1, &format!("SELECT COUNT(*) FROM `{table}`")).trim() != "0" {
        assert!(
            Instant::now() < deadline,
            "the queue did not empty within 60 s after every message was handled"
        );
        poll(&mut consumers, &mut seen);
        thread::sleep(Duration::from_millis(100));
    }
    poll(&mut consumers, &mut seen);
    let logs: Vec<String> = consumers.iter_mut().map(Consumer::stop).collect();

    assert_eq!(seen.len(), expected.len(), "handled messages that were not published");
    let carried_on = after.iter().filter(|p| seen[*p].contains(&1)).count();
    assert!(
        carried_on > 0,
        "node 2's consumer handled none of the messages published after it rejoined\n{}",
        logs[1]
    );
    // At least once: a message handled before node 2 rejoined may run again (its consumer's
    // acknowledgement died with the node, or the cluster stalled commits for longer than
    // the 5 s lease while it noticed the loss); none published after the rejoin may.
    for payload in &after {
        assert_eq!(
            seen[payload].len(),
            1,
            "{payload}, published after the rejoin, handled by {:?}",
            seen[payload]
        );
    }
    let twice = seen.values().filter(|by| by.len() > 1).count();
    eprintln!(
        "killed node 2 after {killed_at} of {} handled; {twice} handled twice; node 2's consumer took {carried_on} of {} published after it rejoined",
        expected.len() - after.len(),
        after.len()
    );
    assert_eq!(sql(1, &format!("SELECT COUNT(*) FROM `{table}`")).trim(), "0");
    assert_eq!(sql(1, &format!("SELECT COUNT(*) FROM `{table}_dead`")).trim(), "0");
}
