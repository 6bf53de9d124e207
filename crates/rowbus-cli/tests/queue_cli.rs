//! End-to-end tests of the queue commands of the `rowbus` binary (`deploy --queue`,
//! `publish`, `consume`, `stats`, `demo`): real processes against real PostgreSQL, MariaDB
//! and SQLite.
//!
//! The servers must be up (`scripts/services.sh` starts them); a test fails, never skips,
//! when one is unreachable. Every test uses its own queue tables (and, on MariaDB and
//! SQLite, its own notify table), dropped at the end, so they run in parallel.

mod common;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    Cleanup, Database, Kind, LINE_TIMEOUT, RUN_TIMEOUT, Running, assert_error, assert_mentions,
    on_each_database, rowbus, run, run_with, show, text, unique,
};
use serde_json::Value;

/// How long a consumer may take to exit after SIGINT/SIGTERM.
const EXIT_TIMEOUT: Duration = Duration::from_secs(15);

/// One test's database, its own notify table and the queue tables it made, all dropped at
/// the end (the SQLite file deleted), also when the test fails.
struct Db {
    database: Database,
    notify_table: String,
}

impl Db {
    fn new(kind: Kind, test: &str) -> Db {
        let notify_table = unique(&format!("qcli_{test}_notify"));
        let database = Database::new(kind, &notify_table);
        database.cleanup.notify_table(&notify_table);
        Db { database, notify_table }
    }

    /// A fresh queue table name, dropped with the test.
    fn queue(&self, name: &str) -> String {
        self.database.cleanup.queue(&unique(&format!("qcli_{name}")))
    }

    /// `rowbus --database-url URL --notify-table T ARGS...`
    fn rowbus(&self, args: &[&str]) -> Command {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &self.database.url, "--notify-table", &self.notify_table]).args(args);
        cmd
    }

    /// Runs a command that must succeed without a word on stderr; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        self.ok_with(args, None)
    }

    /// Like [`Db::ok`], `input` on stdin.
    fn ok_with(&self, args: &[&str], input: Option<&[u8]>) -> String {
        let (output, _) = run_with(self.rowbus(args), input, RUN_TIMEOUT);
        assert!(
            output.status.success() && output.stderr.is_empty(),
            "`rowbus {}` on {} did not succeed quietly (is the server up? scripts/services.sh starts it)\n{}",
            args.join(" "),
            self.database.server(),
            show(&output)
        );
        text(&output.stdout)
    }

    /// Runs a command that must fail; its error line.
    fn fail(&self, args: &[&str], what: &str) -> String {
        assert_error(&run(self.rowbus(args)), &format!("{what} on {}", self.database.server()))
    }

    /// `rowbus deploy --queue Q...`, checked line by line.
    fn deploy(&self, queues: &[&str]) {
        let mut args = vec!["deploy"];
        for q in queues {
            args.extend(["--queue", q]);
        }
        let stdout = self.ok(&args);
        let mut expected = match self.database.kind {
            Kind::Postgres => {
                "PostgreSQL has LISTEN/NOTIFY built in: no notify table needed, nothing to do\n".to_owned()
            }
            _ => format!("notify table `{}` is ready\n", self.notify_table),
        };
        for q in queues {
            expected.push_str(&format!("queue table `{q}` is ready (dead letters go to `{q}_dead`)\n"));
        }
        assert_eq!(stdout, expected);
    }

    /// `rowbus publish ARGS...`, which must say it published `n`.
    fn publish(&self, table: &str, args: &[&str], n: usize) {
        let mut all = vec!["publish", table];
        all.extend(args);
        let s = if n == 1 { "" } else { "s" };
        assert_eq!(self.ok(&all), format!("published {n} message{s} to `{table}`\n"));
    }

    /// `rowbus stats --json TABLES...`
    fn stats(&self, tables: &[&str]) -> Value {
        let mut args = vec!["stats", "--json"];
        args.extend(tables);
        let stdout = self.ok(&args);
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("stats --json is not JSON ({e}): {stdout}"))
    }

    /// The stats line of `table`'s `group`, if listed.
    fn group_stats(&self, table: &str, group: &str) -> Option<Value> {
        let stats = self.stats(&[table]);
        stats["queues"].as_array().expect("a queues array").iter().find(|q| q["group"] == group).cloned()
    }

    /// The depth of `table`'s `group`: 0 when stats does not list it (no message, no dead
    /// letter).
    fn depth(&self, table: &str, group: &str) -> i64 {
        self.group_stats(table, group).map_or(0, |g| g["depth"].as_i64().expect("a depth"))
    }

    /// Polls `stats TABLE` until `check` holds for `group`'s line (at most 15 s).
    fn wait_stats(&self, table: &str, group: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let line = self.group_stats(table, group).unwrap_or(Value::Null);
            if check(&line) {
                return line;
            }
            assert!(Instant::now() < deadline, "{what}: stats of `{table}` group {group:?} now: {line}");
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Starts a consumer and waits for its `rowbus: consuming ...` line.
fn start_consumer(cmd: Command) -> Running {
    let mut running = Running::spawn(cmd, EXIT_TIMEOUT);
    running.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    running
}

/// Stops `running` with `signal` and asserts exit status 0 with no unread stdout and no
/// error; returns its stderr lines.
fn stop_cleanly(running: &mut Running, signal: &str) -> Vec<String> {
    let (status, rest, stderr) = running.stop(signal);
    assert!(status.success(), "`{}` exited {status} after SIG{signal}:\n{}", running.what, stderr.join("\n"));
    assert!(rest.is_empty(), "`{}`: unexpected stdout lines {rest:#?}", running.what);
    assert!(
        !stderr.iter().any(|l| l.contains("error") || l.contains("panicked")),
        "`{}`: {stderr:#?}",
        running.what
    );
    stderr
}

/// Parses a `consume --json` line, checking its keys.
fn delivery(line: &str) -> Value {
    let value: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
    let mut keys: Vec<&str> = value.as_object().expect("an object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["attempt", "group", "id", "payload"], "{line}");
    assert!(value["id"].as_u64().is_some_and(|id| id > 0), "{line}");
    value
}

/// A payload with a newline, quotes, a backslash, a tab and non-ASCII text.
const TRICKY: &str = "line one\nline \"two\" isn't \\ done\tyet: héllo ✓";

/// Deploy (twice), publish in two groups, stats, `consume --json --listen-notify` of the
/// default group: the waiting message at once, and one published meanwhile from another
/// process well before the 30 s poll; SIGINT exits 0. Then the plain format of the other
/// group, with two workers, and SIGTERM.
fn consume_gets_its_groups_messages_and_wakes_on_publish(kind: Kind) {
    let db = Db::new(kind, "rt");
    let q = db.queue("rt");
    db.deploy(&[&q]);
    db.deploy(&[&q]);
    db.publish(&q, &["hello"], 1);
    db.publish(&q, &["--group", "g2", TRICKY], 1);
    let default = db.group_stats(&q, "").expect("the default group is listed");
    assert_eq!(
        (default["depth"].as_i64(), default["ready"].as_i64(), default["dead"].as_i64()),
        (Some(1), Some(1), Some(0))
    );
    assert_eq!(db.group_stats(&q, "g2").expect("g2 is listed")["depth"], 1);

    let mut consumer =
        start_consumer(db.rowbus(&["consume", &q, "--json", "--listen-notify", "--poll-interval", "30"]));
    let first = delivery(&consumer.next_line("hello"));
    assert_eq!(
        (first["payload"].as_str(), first["group"].as_str(), first["attempt"].as_u64()),
        (Some("hello"), Some(""), Some(1))
    );
    let sent = Instant::now();
    db.publish(&q, &["second"], 1);
    let second = delivery(&consumer.next_line("second"));
    let took = sent.elapsed();
    assert_eq!(second["payload"], "second");
    assert!(second["id"].as_u64() > first["id"].as_u64());
    assert!(
        took < Duration::from_secs(10),
        "woken after {took:?}: the notification did not wake the consumer"
    );
    stop_cleanly(&mut consumer, "INT");
    assert_eq!(db.depth(&q, ""), 0, "both acknowledged");
    assert_eq!(db.depth(&q, "g2"), 1, "the other group's message is left alone");

    let mut plain = start_consumer(db.rowbus(&["consume", &q, "--group", "g2", "--workers", "2"]));
    let line = plain.next_line("the tricky payload");
    let (id, rest) = line.split_once(' ').expect("ID GROUP PAYLOAD");
    assert!(id.parse::<u64>().is_ok(), "{line}");
    assert_eq!(rest, format!("g2 {}", TRICKY.escape_debug()));
    stop_cleanly(&mut plain, "TERM");
    assert_eq!(db.depth(&q, "g2"), 0);
}
on_each_database!(consume_gets_its_groups_messages_and_wakes_on_publish);

/// `publish TABLE -`: each stdin line a message (empty lines, CRLF, UTF-8 and not), in
/// batches; `consume --batch` gets them all, in order.
fn publish_dash_sends_each_stdin_line_in_order(kind: Kind) {
    let db = Db::new(kind, "stdin");
    let q = db.queue("stdin");
    db.deploy(&[&q]);
    let total = 2500;
    let payloads: Vec<String> = (0..total)
        .map(|i| match i {
            7 => String::new(),
            8 => "héllo ✓".to_owned(),
            _ => format!("line {i}"),
        })
        .collect();
    let mut input = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        input.extend_from_slice(p.as_bytes());
        input.extend_from_slice(if i == 9 { b"\r\n" } else { b"\n" });
    }
    let stdout = db.ok_with(&["publish", &q, "-"], Some(&input));
    assert_eq!(stdout, format!("published {total} messages to `{q}`\n"));
    assert_eq!(db.depth(&q, ""), total);

    let mut consumer = start_consumer(db.rowbus(&["consume", &q, "--batch", "500", "--json"]));
    let mut last_id = 0;
    for expected in &payloads {
        let d = delivery(&consumer.next_line(expected));
        assert_eq!(d["payload"].as_str(), Some(expected.as_str()));
        let id = d["id"].as_u64().unwrap();
        assert!(id > last_id, "in order");
        last_id = id;
    }
    stop_cleanly(&mut consumer, "INT");
    assert_eq!(db.depth(&q, ""), 0);
}
on_each_database!(publish_dash_sends_each_stdin_line_in_order on postgres, sqlite);

/// `consume --exec`: exit 0 acknowledges; a failing payload is retried after the backoff
/// and dead-lettered after `--max-attempts`; the command gets the payload on stdin and
/// the message's attempt in its environment.
fn exec_retries_then_dead_letters(kind: Kind, mode: &[&str]) {
    let db = Db::new(kind, "exec");
    let q = db.queue("exec");
    db.deploy(&[&q]);
    db.ok_with(&["publish", &q, "-"], Some(b"ok1\nbad\nok2\n"));
    let script = r#"p=$(cat); echo "ran $p $ROWBUS_ATTEMPT"; [ "$p" != bad ]"#;
    let mut args = vec!["consume", &q, "--exec", script, "--max-attempts", "2", "--retry-delay", "0.1"];
    args.extend(mode);
    let mut consumer = start_consumer(db.rowbus(&args));
    let mut ran: Vec<String> = (0..4).map(|_| consumer.next_line("the command's output")).collect();
    ran.sort();
    assert_eq!(ran, ["ran bad 1", "ran bad 2", "ran ok1 1", "ran ok2 1"]);
    db.wait_stats(&q, "", "dead-lettered", |g| g["dead"] == 1 && g["depth"] == 0);
    let stderr = stop_cleanly(&mut consumer, "INT");
    let failures: Vec<&String> = stderr.iter().filter(|l| l.contains("exited with status 1")).collect();
    assert_eq!(failures.len(), 2, "{stderr:#?}");
    assert_mentions(failures[0], &["(attempt 1 of 2)", "retrying in 100ms"], "the first failure");
    assert_mentions(failures[1], &["(attempt 2 of 2)", "dead-lettered"], "the second failure");
}

#[test]
fn exec_with_workers_retries_then_dead_letters_on_sqlite() {
    exec_retries_then_dead_letters(Kind::Sqlite, &["--workers", "2"]);
}

#[test]
fn exec_in_batches_retries_then_dead_letters_on_mariadb() {
    exec_retries_then_dead_letters(Kind::MariaDb, &["--batch", "10"]);
}

/// `stats` without tables finds the queue tables (and only them); with `--json` the same;
/// depth, ready, delayed, in flight and dead per group; the notify table's line.
fn stats_finds_the_queue_tables_and_counts_each_group(kind: Kind) {
    let db = Db::new(kind, "stats");
    let (a, b) = (db.queue("stats_a"), db.queue("stats_b"));
    db.deploy(&[&a, &b]);
    db.publish(&a, &["one"], 1);
    db.publish(&a, &["--group", "x", "two"], 1);
    db.publish(&b, &["--delay", "60", "later"], 1);

    let all = db.stats(&[]);
    let line = |table: &str, group: &str| {
        all["queues"]
            .as_array()
            .expect("queues")
            .iter()
            .find(|q| q["table"] == table && q["group"] == group)
            .cloned()
            .unwrap_or_else(|| panic!("{table}/{group:?} not found by discovery: {all}"))
    };
    let figures =
        |v: &Value| ["depth", "ready", "delayed", "in_flight", "dead"].map(|k| v[k].as_i64().unwrap_or(-1));
    assert_eq!(figures(&line(&a, "")), [1, 1, 0, 0, 0]);
    assert_eq!(figures(&line(&a, "x")), [1, 1, 0, 0, 0]);
    assert_eq!(figures(&line(&b, "")), [1, 0, 1, 0, 0]);
    assert!(line(&a, "")["oldest_age_s"].as_f64().is_some_and(|s| (0.0..60.0).contains(&s)));
    let dead_tables =
        all["queues"].as_array().unwrap().iter().any(|q| q["table"].as_str().unwrap().ends_with("_dead"));
    assert!(!dead_tables, "dead-letter tables are not queues: {all}");
    match kind {
        Kind::Postgres => assert!(all["notify_table"].is_null(), "{all}"),
        _ => assert_eq!(all["notify_table"]["table"], db.notify_table.as_str(), "{all}"),
    }

    // The plain table.
    let plain = db.ok(&["stats", &a, &b]);
    let lines: Vec<&str> = plain.lines().collect();
    let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        words(lines[0]),
        ["TABLE", "GROUP", "DEPTH", "READY", "DELAYED", "IN", "FLIGHT", "OLDEST", "DEAD"]
    );
    let row = |l: &str| {
        let w = words(l);
        [&w[..6], &w[w.len() - 1..]].concat()
    };
    assert_eq!(row(lines[1]), [a.as_str(), "-", "1", "1", "0", "0", "0"]);
    assert_eq!(row(lines[2]), [a.as_str(), "x", "1", "1", "0", "0", "0"]);
    assert_eq!(row(lines[3]), [b.as_str(), "-", "1", "0", "1", "0", "0"]);
    if kind == Kind::Postgres {
        assert_eq!(lines.len(), 4, "{plain}");
    } else {
        assert_eq!(lines.len(), 5, "{plain}");
        assert!(lines[4].starts_with(&format!("notify table `{}`: ", db.notify_table)), "{plain}");
    }

    // In flight: a message whose command is still running.
    let mut consumer = start_consumer(db.rowbus(&[
        "consume",
        &a,
        "--group",
        "x",
        "--exec",
        "sleep 30",
        "--shutdown-timeout",
        "0",
    ]));
    db.wait_stats(&a, "x", "in flight", |g| g["in_flight"] == 1 && g["ready"] == 0 && g["depth"] == 1);
    stop_cleanly(&mut consumer, "INT");
}
on_each_database!(stats_finds_the_queue_tables_and_counts_each_group);

/// The newcomer's path: `rowbus demo` with no flags but a small run, in an empty directory:
/// the default SQLite file, a summary, and "nothing lost"; the demo's table is gone after.
#[test]
fn demo_runs_on_the_default_sqlite_file_and_loses_nothing() {
    let dir = std::env::temp_dir().join(unique("rowbus_demo"));
    let cleanup = Cleanup::default();
    cleanup.dir(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = rowbus();
    cmd.current_dir(&dir).args(["demo", "--messages", "400", "--rate", "400"]);
    let (output, _) = run_with(cmd, None, Duration::from_secs(50));
    let stdout = text(&output.stdout);
    assert!(output.status.success() && output.stderr.is_empty(), "{}", show(&output));
    assert_mentions(
        &stdout,
        &[
            "rowbus demo on SQLite (sqlite://rowbus.sqlite)",
            "workers woken by listen_notify",
            "messages published",
            "messages handled",
            "throughput",
            "latency p50",
            "latency p99",
            "latency max",
            "dead letters",
            "nothing lost: every published message was handled exactly once",
        ],
        "the demo's output",
    );
    let figure = |label: &str| {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("{label}: {stdout}"));
        line[label.len() + 2..].split_whitespace().next().unwrap().replace(',', "")
    };
    assert_eq!(figure("messages published"), "400", "{stdout}");
    assert_eq!(figure("messages handled"), "400", "{stdout}");
    assert_eq!(figure("retries"), "4", "1 in 100 fails once: {stdout}");
    assert_eq!(figure("dead letters"), "0", "{stdout}");
    assert!(!stdout.contains("NOT VERIFIED"), "{stdout}");

    let mut stats = rowbus();
    stats.current_dir(&dir).args(["stats", "--json"]);
    let output = run(stats);
    assert!(output.status.success(), "{}", show(&output));
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["queues"], Value::Array(vec![]), "the demo's table was dropped: {value}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The demo on the servers, briefly.
fn demo_loses_nothing_and_drops_its_table(kind: Kind) {
    let db = Db::new(kind, "demo");
    let mut demo = Running::spawn(db.rowbus(&["demo", "--messages", "300", "--rate", "600"]), EXIT_TIMEOUT);
    // Its table is named after its process: dropped here should the demo not get to it.
    db.database.cleanup.queue(&format!("demo_{}", demo.id()));
    let (status, stdout, stderr) = demo.wait(RUN_TIMEOUT);
    assert!(status.success() && stderr.is_empty(), "`{}`: {status}\n{stderr:#?}", demo.what);
    let stdout = stdout.join("\n");
    assert_mentions(&stdout, &["nothing lost: every published message was handled exactly once"], "demo");
    assert!(!stdout.contains("NOT VERIFIED"), "{stdout}");
    let table = stdout.split('`').nth(1).expect("the demo names its table");
    let queues = db.stats(&[])["queues"].clone();
    assert!(
        !queues.as_array().unwrap().iter().any(|q| q["table"] == table),
        "{table} was not dropped: {queues}"
    );
}
on_each_database!(demo_loses_nothing_and_drops_its_table on postgres, mariadb);

/// Ctrl-C in the middle of the demo: exit 0, the summary so far, the table dropped.
#[test]
fn an_interrupted_demo_prints_the_summary_so_far() {
    let db = Db::new(Kind::Sqlite, "demo_int");
    let mut demo =
        Running::spawn(db.rowbus(&["demo", "--messages", "100000", "--rate", "500"]), EXIT_TIMEOUT);
    let header: Vec<String> = (0..3).map(|_| demo.next_line("the demo's header")).collect();
    assert!(header[0].starts_with("rowbus demo on SQLite"), "{header:#?}");
    thread::sleep(Duration::from_millis(1500));
    let (status, rest, stderr) = demo.stop("INT");
    assert!(status.success(), "{status}: {stderr:#?}");
    let summary = rest.join("\n");
    assert_mentions(
        &summary,
        &["interrupted: the summary so far", "messages published", "latency p50"],
        "summary",
    );
    assert!(
        summary.contains("nothing lost") || summary.contains("NOT VERIFIED"),
        "the summary says whether anything was lost: {summary}"
    );
    assert_eq!(db.stats(&[])["queues"], Value::Array(vec![]), "the demo's table was dropped");
}

/// A queue table that does not exist: publish, consume and stats say to deploy it.
fn a_missing_queue_table_says_how_to_deploy_it(kind: Kind) {
    let db = Db::new(kind, "missing");
    db.deploy(&[]);
    let q = unique("qcli_never");
    let hint = format!("create it with `rowbus deploy --queue {q}`");
    for args in [
        &["publish", &q, "x"][..],
        &["consume", &q],
        &["consume", &q, "--json", "--listen-notify"],
        &["stats", &q],
    ] {
        let what = format!("{args:?} without the table");
        let line = db.fail(args, &what);
        assert_mentions(&line, &[&format!("queue table `{q}` does not exist"), &hint], &what);
    }
}
on_each_database!(a_missing_queue_table_says_how_to_deploy_it);

/// Names rowbus refuses, everywhere a table or group is named; a table that is not a
/// queue; `--listen-notify` without the notify table.
#[test]
fn invalid_names_and_non_queue_tables_are_refused() {
    let db = Db::new(Kind::Sqlite, "names");
    let long = "x".repeat(58);
    for name in ["a;b", "jobs`", "1jobs", "", long.as_str(), "a.b.c"] {
        for args in [
            &["deploy", "--queue", name][..],
            &["publish", name, "x"],
            &["consume", name],
            &["stats", "--json", name],
        ] {
            let what = format!("{args:?}");
            let line = db.fail(args, &what);
            assert_mentions(&line, &["invalid name"], &what);
        }
    }
    let line = db.fail(&["deploy", "--queue", "app.jobs"], "a schema on SQLite");
    assert_mentions(&line, &["invalid name \"app.jobs\"", "SQLite has no schemas"], "a schema on SQLite");

    let q = db.queue("names");
    db.deploy(&[&q]);
    let line = db.fail(&["consume", &q, "--group", "trailing "], "a group ending in a space");
    assert_mentions(&line, &["invalid name \"trailing \"", "must not end with a space"], "a bad group");
    let line = db.fail(&["publish", &q, "--group", "trailing ", "x"], "publish to a bad group");
    assert_mentions(&line, &["invalid name \"trailing \""], "publish to a bad group");
    let line = db.fail(&["publish", &db.notify_table, "x"], "the notify table as a queue");
    assert_mentions(&line, &["is not a rowbus queue table", "rowbus deploy --queue"], "not a queue");
    let mut other = db.rowbus(&["consume", &q, "--listen-notify"]);
    other.args(["--notify-table", "qcli_no_such_notify"]);
    let line = assert_error(&run(other), "--listen-notify without its notify table");
    assert_mentions(&line, &["qcli_no_such_notify", "does not exist", "rowbus deploy"], "no notify table");

    // Flags clap refuses: its own message and status 2.
    let output = run(db.rowbus(&["consume", &q, "--workers", "2", "--batch", "5"]));
    assert_eq!(output.status.code(), Some(2), "{}", show(&output));
    assert_mentions(&text(&output.stderr), &["cannot be used with"], "--workers with --batch");
}

/// Unreachable servers and bad URLs: one line, at once.
#[test]
fn unreachable_servers_and_bad_urls_fail_at_once_in_one_line() {
    let commands: [&[&str]; 6] = [
        &["deploy", "--queue", "q"],
        &["publish", "q", "x"],
        &["consume", "q"],
        &["stats"],
        &["stats", "q"],
        &["demo", "--messages", "10"],
    ];
    for url in ["postgres://postgres@127.0.0.1:1/test", "mysql://root@127.0.0.1:1/test"] {
        for args in commands {
            let mut cmd = rowbus();
            cmd.args(["--database-url", url]).args(args);
            let what = format!("{url} {args:?}");
            let started = Instant::now();
            let line = assert_error(&run(cmd), &what);
            assert_mentions(&line, &["cannot connect to", "127.0.0.1:1", "Connection refused"], &what);
            assert!(started.elapsed() < Duration::from_secs(10), "{what}: took {:?}", started.elapsed());
        }
    }
    for args in commands {
        let mut cmd = rowbus();
        cmd.args(["--database-url", "foo://x"]).args(args);
        let what = format!("foo://x {args:?}");
        let line = assert_error(&run(cmd), &what);
        assert_mentions(&line, &["invalid database URL", "foo://x"], &what);
    }
}
