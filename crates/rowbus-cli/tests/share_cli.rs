//! End to end, in child processes against the real PostgreSQL and MariaDB and a SQLite
//! file: three `rowbus consume --workers 8` processes drain a backlog together, and each
//! handles a share of it. On SQLite this rests on how a process waits for the database's
//! one write lock: with SQLite's own busy handler, the process whose claims kept coming
//! back took nearly all of it.

mod common;

use std::time::{Duration, Instant};

use common::{Database, Kind, LINE_TIMEOUT, Running, on_each_database, rowbus, run, show, text, unique};
use serde_json::Value;

const MESSAGES: usize = 20_000;
const PROCESSES: usize = 3;

/// `rowbus --database-url URL --notify-table T ARGS...`, which must succeed quietly; its
/// stdout.
fn ok(database: &Database, notify_table: &str, args: &[&str]) -> String {
    let mut cmd = rowbus();
    cmd.args(["--database-url", &database.url, "--notify-table", notify_table]).args(args);
    let output = run(cmd);
    assert!(
        output.status.success() && output.stderr.is_empty(),
        "`rowbus {}` on {} did not succeed quietly\n{}",
        args.join(" "),
        database.server(),
        show(&output)
    );
    text(&output.stdout)
}

/// The backlog is published to a paused queue, the consumers start and say so, and the
/// resume wakes them together: each process then handles at least a tenth of the
/// messages (an even share is a third), and all of them are handled once.
fn three_processes_share_a_backlog(kind: Kind) {
    let q = unique("share");
    let database = Database::new(kind, &q);
    let notify_table = database.cleanup.notify_table(&unique("share_notify"));
    database.cleanup.queue(&q);
    ok(&database, &notify_table, &["deploy", "--queue", &q]);
    ok(&database, &notify_table, &["pause", &q]);
    let messages: String = (0..MESSAGES).map(|i| format!("m{i}\n")).collect();
    let mut publish = rowbus();
    publish.args(["--database-url", &database.url, "--notify-table", &notify_table, "publish", &q, "-"]);
    let (output, _) = common::run_with(publish, Some(messages.as_bytes()), common::RUN_TIMEOUT);
    assert!(output.status.success(), "{}", show(&output));

    let mut consumers: Vec<Running> = (0..PROCESSES)
        .map(|_| {
            let mut cmd = rowbus();
            cmd.args(["--database-url", &database.url, "--notify-table", &notify_table]);
            cmd.args(["consume", &q, "--workers", "8", "--listen-notify"]);
            Running::spawn(cmd, Duration::from_secs(15))
        })
        .collect();
    for consumer in &mut consumers {
        consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    }
    ok(&database, &notify_table, &["resume", &q]);

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats: Value = serde_json::from_str(&ok(&database, &notify_table, &["stats", &q, "--json"]))
            .expect("stats --json is JSON");
        let queue = &stats["queues"][0];
        if queue["depth"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not drained within a minute: {queue}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut shares = Vec::new();
    let mut handled: Vec<String> = Vec::new();
    for consumer in &mut consumers {
        let (status, lines, stderr) = consumer.stop("INT");
        assert!(status.success(), "{status} {stderr:?}");
        shares.push(lines.len());
        handled.extend(lines);
    }
    handled.sort();
    handled.dedup();
    assert_eq!(handled.len(), MESSAGES, "every message handled once; shares {shares:?}");
    assert_eq!(shares.iter().sum::<usize>(), MESSAGES, "no message handled twice; shares {shares:?}");
    assert!(
        shares.iter().all(|&share| share >= MESSAGES / 10),
        "each of {PROCESSES} processes handles at least a tenth: shares {shares:?}"
    );
}
on_each_database!(three_processes_share_a_backlog);
