//! End to end, in child processes against the real PostgreSQL and MariaDB and a SQLite
//! file: `rowbus pause` holds a running `rowbus consume` (it prints nothing published
//! meanwhile), `rowbus stats` says PAUSED, and `rowbus resume` lets it go on at once.

mod common;

use std::time::Duration;

use common::{
    Database, Kind, LINE_TIMEOUT, Running, on_each_database, queue_tables_on, rowbus, run, show, text, unique,
};
use serde_json::Value;

/// How long the paused consumer is watched: the publish's wake-up reaches it in well
/// under a second, and it claims at once.
const QUIET: Duration = Duration::from_secs(2);

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

/// The payload of a `consume --json` line.
fn payload(line: &str) -> String {
    let value: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
    value["payload"].as_str().unwrap_or_else(|| panic!("no payload: {line}")).to_owned()
}

fn pause_holds_a_running_consumer_until_resume(kind: Kind) {
    let (database, notify_table, q) = fixture(kind);
    let rowbus_ok = |args: &[&str]| ok(&database, &notify_table, args);
    let cleanup = Cleanup::of(&database, &notify_table, &q);

    rowbus_ok(&["deploy", "--queue", &q]);
    let mut cmd = rowbus();
    cmd.args(["--database-url", &database.url, "--notify-table", &notify_table]);
    cmd.args(["consume", &q, "--json", "--listen-notify", "--poll-interval", "10m"]);
    let mut consumer = Running::spawn(cmd, Duration::from_secs(15));
    consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    rowbus_ok(&["publish", &q, "before"]);
    assert_eq!(payload(&consumer.next_line("before")), "before");

    assert_eq!(
        rowbus_ok(&["pause", &q]),
        format!("paused queue `{q}`: consumers take nothing from it until `rowbus resume`\n")
    );
    let stats = rowbus_ok(&["stats", &q]);
    let line =
        stats.lines().find(|l| l.starts_with(&q)).unwrap_or_else(|| panic!("no line for {q}:\n{stats}"));
    assert!(line.ends_with("PAUSED"), "{stats}");
    let json: Value = serde_json::from_str(&rowbus_ok(&["stats", "--json", &q])).unwrap();
    assert_eq!(json["queues"][0]["paused"], true, "{json}");

    rowbus_ok(&["publish", &q, "during"]);
    consumer.no_line(QUIET, "the queue is paused");
    let json: Value = serde_json::from_str(&rowbus_ok(&["stats", "--json", &q])).unwrap();
    assert_eq!(
        (json["queues"][0]["ready"].as_i64(), json["queues"][0]["in_flight"].as_i64()),
        (Some(1), Some(0))
    );

    assert_eq!(rowbus_ok(&["resume", &q]), format!("resumed queue `{q}`\n"));
    // The consumer polls every ten minutes: only the resume's wake-up brings the message now.
    assert_eq!(payload(&consumer.next_line("the message published while paused")), "during");
    let json: Value = serde_json::from_str(&rowbus_ok(&["stats", "--json", &q])).unwrap();
    assert_eq!(json["queues"][0]["paused"], false, "{json}");
    let (status, rest, stderr) = consumer.stop("INT");
    assert!(status.success() && rest.is_empty(), "{status} {rest:?} {stderr:?}");
    drop(cleanup);
}
on_each_database!(pause_holds_a_running_consumer_until_resume);

/// A consumer started on a paused queue says so, once, on stderr, and says when it is
/// resumed.
fn a_consumer_says_it_is_paused_and_resumed(kind: Kind) {
    let (database, notify_table, q) = fixture(kind);
    let rowbus_ok = |args: &[&str]| ok(&database, &notify_table, args);
    let cleanup = Cleanup::of(&database, &notify_table, &q);
    rowbus_ok(&["deploy", "--queue", &q]);
    rowbus_ok(&["pause", &q]);
    let mut cmd = rowbus();
    cmd.args(["--database-url", &database.url, "--notify-table", &notify_table, "consume", &q]);
    let mut consumer = Running::spawn(cmd, Duration::from_secs(15));
    consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    let said = consumer.await_stderr("paused", LINE_TIMEOUT, |line| line.contains("paused"));
    assert_eq!(
        said,
        format!("rowbus: the queue `{q}` is paused: waiting, taking nothing until `rowbus resume {q}`")
    );
    rowbus_ok(&["resume", &q]);
    let said = consumer.await_stderr("resumed", LINE_TIMEOUT, |line| line.contains("resumed"));
    assert_eq!(said, format!("rowbus: `{q}` was resumed: consuming again"));
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "{status} {stderr:?}");
    assert_eq!(stderr.iter().filter(|l| l.contains("is paused")).count(), 1, "said once: {stderr:#?}");
    drop(cleanup);
}
on_each_database!(a_consumer_says_it_is_paused_and_resumed);

/// Drops the test's tables at the end, however it ends (SQLite's go with its file).
/// A database with a notify table's name and a queue's name of the test's own.
fn fixture(kind: Kind) -> (Database, String, String) {
    let notify_table = unique("pcli_notify");
    (Database::new(kind, &notify_table), notify_table, unique("pcli"))
}

struct Cleanup<'a> {
    database: &'a Database,
    tables: Vec<String>,
}

impl<'a> Cleanup<'a> {
    /// Drops queue `q`'s tables, notify table `notify_table` and its positions table.
    fn of(database: &'a Database, notify_table: &str, q: &str) -> Self {
        let tables = [
            queue_tables_on(database.kind.backend(), q),
            vec![notify_table.to_owned(), format!("{notify_table}_positions")],
        ]
        .concat();
        Cleanup { database, tables }
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let mut tables = self.tables.clone();
        if self.database.kind == Kind::Postgres {
            tables.pop(); // no notify table
        }
        self.database.drop_tables(&tables);
    }
}
