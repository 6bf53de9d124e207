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
    on_each_database, rowbus, run, run_quietly, run_with, show, text, unique,
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
        run_quietly(self.rowbus(args), input, self.database.server())
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
            Kind::Postgres if queues.is_empty() => "PostgreSQL has LISTEN/NOTIFY built in: no notify table \
                 needed, nothing to do (durable listeners need one: `rowbus deploy --durable`)\n"
                .to_owned(),
            Kind::Postgres => "PostgreSQL has LISTEN/NOTIFY built in: no notify table needed (durable \
                 listeners need one: `rowbus deploy --durable`)\n"
                .to_owned(),
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

/// On PostgreSQL, `deploy --queue` says what is true of the notify table: none needed (and
/// something to do: the queue), or, once `deploy --durable` made one, that it is there.
#[test]
fn deploy_on_postgres_says_what_is_true_of_the_notify_table() {
    let db = Db::new(Kind::Postgres, "pgnative");
    let q = db.queue("pgnative");
    let first_line = |out: String| out.lines().next().unwrap_or_default().to_owned();
    assert_eq!(
        first_line(db.ok(&["deploy", "--queue", &q])),
        "PostgreSQL has LISTEN/NOTIFY built in: no notify table needed (durable listeners need one: \
         `rowbus deploy --durable`)"
    );
    assert_eq!(
        first_line(db.ok(&["deploy", "--durable"])),
        format!("notify table `{}` is ready", db.notify_table)
    );
    for args in [&["deploy", "--queue", &q][..], &["deploy"]] {
        assert_eq!(
            first_line(db.ok(args)),
            format!(
                "PostgreSQL has LISTEN/NOTIFY built in; the notify table `{}` of durable listeners is there \
                 (made by `rowbus deploy --durable`)",
                db.notify_table
            ),
            "{args:?}"
        );
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
    assert_eq!(keys, ["attempt", "group", "headers", "id", "key", "payload", "priority"], "{line}");
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
    // As published, but for the line break.
    assert_eq!(rest, "g2 line one\\nline \"two\" isn't \\ done\tyet: héllo ✓");
    stop_cleanly(&mut plain, "TERM");
    assert_eq!(db.depth(&q, "g2"), 0);
}
on_each_database!(consume_gets_its_groups_messages_and_wakes_on_publish);

/// `publish --priority --key --header --dedup`: the consumer gets the most urgent first,
/// with its headers and key (`consume --json`); a second publish of a dedup id says it
/// is a duplicate and stores nothing; bad flags are one clear error line.
fn publish_flags_reach_the_consumer(kind: Kind) {
    let db = Db::new(kind, "flags");
    let q = db.queue("flags");
    db.deploy(&[&q]);
    db.publish(&q, &["low", "--priority", "5"], 1);
    db.publish(
        &q,
        &["high", "--priority", "-2", "--key", "K", "--header", "trace=a=b", "--header", "lang=fr"],
        1,
    );
    db.publish(&q, &["first", "--dedup", "D"], 1);
    assert_eq!(
        db.ok(&["publish", &q, "second", "--dedup", "D"]),
        format!("duplicate: a message with dedup id \"D\" is in `{q}`; nothing published\n")
    );
    assert_eq!(db.depth(&q, ""), 3);
    // Refused by the flags' parser (exit status 2), and by the command (1), in one line.
    for (args, needle) in [
        (vec!["publish", &q, "x", "--header", "novalue"], "is not NAME=VALUE"),
        (vec!["publish", &q, "x", "--priority", "40000"], "40000"),
    ] {
        let output = run(db.rowbus(&args));
        assert_eq!(output.status.code(), Some(2), "{args:?}\n{}", show(&output));
        assert_mentions(&text(&output.stderr), &[needle], &format!("{args:?}"));
    }
    let line = db.fail(&["publish", &q, "-", "--dedup", "D"], "one dedup id for every stdin line");
    assert_mentions(&line, &["--dedup names one message"], "publish - --dedup");
    let line = db.fail(&["publish", &q, "x", "--key", "trailing "], "a key ending with a space");
    assert_mentions(&line, &["invalid message key", "must not end with a space"], "publish --key");
    let mut consumer = start_consumer(db.rowbus(&["consume", &q, "--json"]));
    let high = delivery(&consumer.next_line("high"));
    assert_eq!(
        (high["payload"].as_str(), high["priority"].as_i64(), high["key"].as_str()),
        (Some("high"), Some(-2), Some("K"))
    );
    assert_eq!(high["headers"], serde_json::json!({"lang": "fr", "trace": "a=b"}));
    let first = delivery(&consumer.next_line("first"));
    assert_eq!(
        (first["payload"].as_str(), first["key"].clone(), first["headers"].clone()),
        (Some("first"), Value::Null, serde_json::json!({}))
    );
    assert_eq!(delivery(&consumer.next_line("low"))["priority"], 5);
    stop_cleanly(&mut consumer, "INT");
    assert_eq!(db.depth(&q, ""), 0);
}
on_each_database!(publish_flags_reach_the_consumer);

/// `publish TABLE - --keep-empty`: each stdin line a message (empty lines, CRLF, UTF-8
/// and not), in batches; `consume --batch` gets them all, in order.
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
    let stdout = db.ok_with(&["publish", &q, "-", "--keep-empty"], Some(&input));
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

/// `consume --exec`: a command that exits with status 75 snoozes its message: it runs
/// again after `--snooze` as the same attempt (with `--max-attempts 1`, a failure would
/// have dead-lettered it), stderr says so, and `stats` counts it in the queue's events.
fn exec_status_75_snoozes(kind: Kind, mode: &[&str]) {
    let db = Db::new(kind, "snooze");
    let q = db.queue("snooze");
    db.deploy(&[&q]);
    db.publish(&q, &["later"], 1);
    let mark = std::env::temp_dir().join(unique("qcli_snooze_mark"));
    let script = format!(
        r#"p=$(cat); echo "ran $p $ROWBUS_ATTEMPT"; [ -e '{0}' ] && exit 0; touch '{0}'; exit 75"#,
        mark.display()
    );
    let mut args = vec!["consume", &q, "--exec", &script, "--max-attempts", "1", "--snooze", "500ms"];
    args.extend(mode);
    let mut consumer = start_consumer(db.rowbus(&args));
    let ran: Vec<String> = (0..2).map(|_| consumer.next_line("the command's output")).collect();
    assert_eq!(ran, ["ran later 1", "ran later 1"], "snoozed, then run again as the same attempt");
    db.wait_stats(&q, "", "acknowledged", |g| g["depth"] == 0);
    let stderr = stop_cleanly(&mut consumer, "INT");
    let _ = std::fs::remove_file(&mark);
    let snoozed: Vec<&String> = stderr.iter().filter(|l| l.contains("snoozed by")).collect();
    assert_eq!(snoozed.len(), 1, "{stderr:#?}");
    assert_mentions(
        snoozed[0],
        &["(attempt 1)", "exit status 75", "back in 500ms", "not counted"],
        "the snooze",
    );
    assert!(!stderr.iter().any(|l| l.contains("of 1)")), "no failed attempt: {stderr:#?}");
    assert!(
        stderr.iter().any(|l| l.contains("1 acknowledged, 0 retried, 1 snoozed, 0 dead-lettered")),
        "{stderr:#?}"
    );
    let report = db.stats(&[&q]);
    let counts = &report["counts"][q.as_str()];
    assert_eq!(
        ["cancelled", "snoozed", "timed_out", "lease_lost"].map(|k| counts[k].as_i64()),
        [Some(0), Some(1), Some(0), Some(0)],
        "{report}"
    );
    let plain = db.ok(&["stats", &q]);
    let line =
        format!("events of `{q}`: cancelled 0, snoozed 1, timed out 0, lease lost 0, held by a limit now 0");
    assert!(plain.lines().any(|l| l == line), "no line {line:?} in\n{plain}");
}

#[test]
fn exec_status_75_snoozes_on_postgres() {
    exec_status_75_snoozes(Kind::Postgres, &[]);
}

#[test]
fn exec_status_75_snoozes_with_workers_on_mariadb() {
    exec_status_75_snoozes(Kind::MariaDb, &["--workers", "2"]);
}

#[test]
fn exec_status_75_snoozes_in_batches_on_sqlite() {
    exec_status_75_snoozes(Kind::Sqlite, &["--batch", "10"]);
}

/// `--snooze` without `--exec` is refused: only a command can ask for a snooze.
#[test]
fn snooze_needs_exec() {
    let db = Db::new(Kind::Sqlite, "snoozeflag");
    let q = db.queue("snoozeflag");
    db.deploy(&[&q]);
    let refused = run(db.rowbus(&["consume", &q, "--snooze", "5s"]));
    assert_eq!(refused.status.code(), Some(2), "{}", show(&refused));
    assert!(text(&refused.stderr).contains("--exec"), "{}", show(&refused));
}

/// `stats` without tables finds the queue tables (and only them); with `--json` the same;
/// depth, ready, delayed, in flight and dead per group; the notify table's line.
fn stats_finds_the_queue_tables_and_counts_each_group(kind: Kind) {
    let db = Db::new(kind, "stats");
    let (a, b) = (db.queue("stats_a"), db.queue("stats_b"));
    // A queue whose own name ends in `_dead`, as queues of other programs on the same
    // server may: a queue for `stats`, not a dead-letter table.
    let c = db.database.cleanup.queue(&format!("{}_dead", unique("qcli_stats_c")));
    db.deploy(&[&a, &b, &c]);
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
    // The oldest ready message's age: none where the only message is delayed.
    assert!(line(&a, "")["oldest_ready_age_s"].as_f64().is_some_and(|s| (0.0..60.0).contains(&s)));
    assert!(line(&b, "")["oldest_ready_age_s"].is_null(), "{all}");
    let listed = |table: &str| all["queues"].as_array().unwrap().iter().any(|q| q["table"] == table);
    for dead in [format!("{a}_dead"), format!("{b}_dead"), format!("{c}_dead")] {
        assert!(!listed(&dead), "dead-letter table {dead} is not a queue: {all}");
    }
    assert!(listed(&c), "queue {c} is a queue, whatever its name ends with: {all}");
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
    // What each queue's consumers did: nothing yet.
    for (line, q) in [(lines[4], &a), (lines[5], &b)] {
        assert_eq!(
            line,
            format!(
                "events of `{q}`: cancelled 0, snoozed 0, timed out 0, lease lost 0, held by a limit now 0"
            )
        );
    }
    // Each queue's health (no holder of the horizon is past 5 minutes here, unless another
    // program's: then a warning line follows).
    let health: Vec<&str> = lines[6..].iter().copied().filter(|l| l.starts_with("health of `")).collect();
    assert_eq!(health.len(), 2, "{plain}");
    for (line, q) in health.iter().zip([&a, &b]) {
        assert!(line.starts_with(&format!("health of `{q}`: ")) && line.contains(" on disk"), "{plain}");
    }
    if kind != Kind::Postgres {
        let last = lines.last().unwrap();
        assert!(last.starts_with(&format!("notify table `{}`: ", db.notify_table)), "{plain}");
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
            "handled rate",
            "paced by --rate 400/s: not a ceiling",
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

/// Every duration flag takes units (`250ms`, `4s`) as well as plain seconds. A duration
/// beyond what the database can add to its clock (a lease or delay over 100 years), a
/// lease of 0, a poll interval under 1 ms or a lookback over 100 years is refused at
/// once, naming the flag or the setting, before the server sees it. (Before, `consume
/// --lease 1e12` failed every claim on MariaDB forever, `publish --delay 1e12` failed on
/// the server or stored a message for 31,700 years, and `listen --poll-interval
/// 0.0000001` polled without pause.)
fn duration_flags_take_units_and_refuse_what_the_database_cannot_hold(kind: Kind) {
    let db = Db::new(kind, "durations");
    let q = db.queue("durations");
    db.deploy(&[&q]);
    let not_a_duration = "is not a duration";
    let century = "at most 100 years";
    for (args, flag, value, why) in [
        (&["consume", &q, "--lease", "1e12"][..], "--lease", "1e12", not_a_duration),
        (&["consume", &q, "--lease", "4000000000"], "--lease", "4000000000", century),
        (&["consume", &q, "--lease", "0"], "--lease", "0", "greater than 0"),
        (&["consume", &q, "--retry-delay", "1000000h"], "--retry-delay", "1000000h", century),
        (&["consume", &q, "--shutdown-timeout", "soon"], "--shutdown-timeout", "soon", not_a_duration),
        (&["publish", &q, "--delay", "1e12", "x"], "--delay", "1e12", not_a_duration),
        (&["publish", &q, "--delay", "4000000000", "x"], "--delay", "4000000000", century),
        (&["publish", &q, "--delay=-2s", "x"], "--delay", "-2s", "negative"),
        (&["publish", &q, "--delay", "5w", "x"], "--delay", "5w", "ms, s, m, h or d"),
        (&["publish", &q, "--delay", "36501d", "x"], "--delay", "36501d", century),
    ] {
        let what = format!("{args:?} on {}", db.database.server());
        let started = Instant::now();
        let output = run(db.rowbus(args));
        assert_eq!(output.status.code(), Some(2), "{what}: refused by the flag's parser\n{}", show(&output));
        let named = format!("invalid value '{value}' for '{flag} <DURATION>'");
        assert_mentions(&text(&output.stderr), &[&named, why], &what);
        assert!(started.elapsed() < Duration::from_secs(10), "{what}: took {:?}", started.elapsed());
    }
    for (args, needle) in [
        (&["listen", "ch", "--poll-interval", "0.0000001"][..], "invalid `poll_interval` = 0.0000001"),
        (&["consume", &q, "--poll-interval", "0.0000001"], "invalid `poll_interval` = 0.0000001"),
        (&["listen", "ch", "--lookback", "100000000000"], "invalid `lookback` = 100000000000"),
        (&["listen", "ch", "--lookback", "1e11"], "invalid `lookback` = 1e11: must be a duration"),
    ] {
        let what = format!("{args:?}");
        assert_mentions(&db.fail(args, &what), &[needle], &what);
    }
    assert_eq!(db.depth(&q, ""), 0, "nothing was published");

    db.publish(&q, &["--delay", "250ms", "soon"], 1);
    let args =
        ["consume", &q, "--json", "--lease", "4s", "--retry-delay", "1.5s", "--poll-interval", "100ms"];
    let mut consumer = start_consumer(db.rowbus(&args));
    assert_eq!(delivery(&consumer.next_line("the delayed message"))["payload"], "soon");
    stop_cleanly(&mut consumer, "INT");
    assert_eq!(db.depth(&q, ""), 0, "acknowledged");
}
on_each_database!(duration_flags_take_units_and_refuse_what_the_database_cannot_hold);

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
    assert_mentions(
        &line,
        &["is not a rowbus queue table", "missing columns: group_name", "rowbus deploy --queue"],
        "not a queue",
    );
    let mut other = db.rowbus(&["consume", &q, "--listen-notify"]);
    other.args(["--notify-table", "qcli_no_such_notify"]);
    let line = assert_error(&run(other), "--listen-notify without its notify table");
    assert_mentions(&line, &["qcli_no_such_notify", "does not exist", "rowbus deploy"], "no notify table");

    // Flags clap refuses: its own message and status 2.
    let output = run(db.rowbus(&["consume", &q, "--workers", "2", "--batch", "5"]));
    assert_eq!(output.status.code(), Some(2), "{}", show(&output));
    assert_mentions(&text(&output.stderr), &["cannot be used with"], "--workers with --batch");
}

/// Two replicas of an app deploying the same new queue at start-up, at once: both
/// succeed and say so.
fn two_deploys_at_once_both_succeed(kind: Kind) {
    let db = Db::new(kind, "replicas");
    let q = db.queue("replicas");
    thread::scope(|s| {
        let replicas: Vec<_> = (0..2).map(|_| s.spawn(|| db.deploy(&[&q]))).collect();
        for replica in replicas {
            if let Err(panic) = replica.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    db.publish(&q, &["after the race"], 1);
    assert_eq!(db.depth(&q, ""), 1);
}
on_each_database!(two_deploys_at_once_both_succeed);

/// `deploy --queue T` where `T` is some other table: one error line naming `T` and the
/// columns it lacks, and nothing created (no `T_dead`, no notify table).
fn deploy_over_a_foreign_table_is_refused(kind: Kind) {
    let db = Db::new(kind, "foreign");
    let t = db.queue("foreign");
    db.database.exec(&format!("CREATE TABLE {t} (id INTEGER, name TEXT)"));
    let line = db.fail(&["deploy", "--queue", &t], "deploy over a table that is not a queue");
    assert_mentions(
        &line,
        &[&format!("`{t}` is not a rowbus queue table"), "group_name", "rowbus deploy --queue"],
        "deploy over a foreign table",
    );
    assert!(!db.database.table_exists(&format!("{t}_dead")), "{t}_dead was created");
    assert!(!db.database.table_exists(&db.notify_table), "the notify table was created");
    assert!(db.database.table_exists(&t), "{t} is gone");
}
on_each_database!(deploy_over_a_foreign_table_is_refused);

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

/// A URL listing a refusing host (127.0.0.1:1) before the server, with
/// `target_session_attrs=read-write` on PostgreSQL: deploy, publish, and a
/// `consume --listen-notify` woken (long before its 600 s poll) by a publish from another
/// process; with every host down, one line naming each.
fn commands_take_a_url_listing_several_hosts(kind: Kind) {
    let mut db = Db::new(kind, "hosts");
    let url = db.database.url.clone();
    let (user, server) = url.split_once('@').expect("user@host");
    let extra = if kind == Kind::Postgres { "?target_session_attrs=read-write" } else { "" };
    db.database.url = format!("{user}@127.0.0.1:1,{server}{extra}");
    let q = db.queue("hosts");
    db.deploy(&[&q]);
    db.publish(&q, &["hello"], 1);
    let mut consumer =
        start_consumer(db.rowbus(&["consume", &q, "--json", "--listen-notify", "--poll-interval", "600"]));
    assert_eq!(delivery(&consumer.next_line("hello"))["payload"], "hello");
    db.publish(&q, &["woken"], 1);
    assert_eq!(delivery(&consumer.next_line("woken by the notification"))["payload"], "woken");
    stop_cleanly(&mut consumer, "INT");

    let (scheme, _) = user.split_once("://").expect("a scheme");
    let mut cmd = rowbus();
    cmd.args(["--database-url", &format!("{scheme}://u@127.0.0.1:1,127.0.0.1:2/test"), "stats"]);
    let line = assert_error(&run(cmd), "every host down");
    assert_mentions(
        &line,
        &["cannot connect to any host", "127.0.0.1:1: ", "127.0.0.1:2: "],
        "every host down",
    );
}
on_each_database!(commands_take_a_url_listing_several_hosts on postgres, mariadb);

/// A consumer whose queue table is dropped under it says why its claims fail and stops
/// with a non-zero status, rather than retrying forever with a bare count of failures.
fn a_consumer_whose_table_goes_stops_and_says_why(kind: Kind) {
    let db = Db::new(kind, "gone");
    let q = db.queue("gone");
    db.deploy(&[&q]);
    let mut consumer = start_consumer(db.rowbus(&["consume", &q, "--poll-interval", "0.1"]));
    db.database.drop_tables(&[q.clone(), format!("{q}_dead")]);
    let (status, stderr) = consumer.wait_exit(Duration::from_secs(20));
    assert!(!status.success(), "{stderr:#?}");
    let error = stderr.iter().find(|l| l.starts_with("rowbus: error: ")).expect("an error line");
    assert_mentions(error, &["cannot claim", &q, "does not exist"], "the table is gone");
}
on_each_database!(a_consumer_whose_table_goes_stops_and_says_why on postgres, mariadb);

/// Ctrl-C while a handler runs past `--shutdown-timeout`: the handler is stopped, its
/// message given back at once (claimable again, the attempt not counted), and the summary
/// and a warning say so.
fn ctrl_c_past_the_shutdown_timeout_gives_the_message_back(kind: Kind) {
    let db = Db::new(kind, "abandon");
    let q = db.queue("abandon");
    db.deploy(&[&q]);
    db.publish(&q, &["slow"], 1);
    let mut consumer = start_consumer(db.rowbus(&[
        "consume",
        &q,
        "--exec",
        "sleep 60",
        "--shutdown-timeout",
        "0.2",
        "--lease",
        "60",
    ]));
    let started = Instant::now();
    while db.group_stats(&q, "").is_none_or(|g| g["in_flight"] != 1) {
        assert!(started.elapsed() < LINE_TIMEOUT, "the message was never claimed");
        thread::sleep(Duration::from_millis(50));
    }
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "{stderr:#?}");
    let summary = stderr.iter().find(|l| l.starts_with("rowbus: stopped: ")).expect("a summary");
    assert_mentions(summary, &["0 acknowledged", "1 abandoned, released"], "the summary");
    assert!(
        stderr.iter().any(|l| l.starts_with("rowbus: warning: 1 message still being handled")),
        "{stderr:#?}"
    );
    let group = db.group_stats(&q, "").expect("the message is still there");
    assert_eq!((group["ready"].as_i64(), group["in_flight"].as_i64()), (Some(1), Some(0)), "{group}");
}
on_each_database!(ctrl_c_past_the_shutdown_timeout_gives_the_message_back);

/// `publish TABLE -` skips empty lines unless `--keep-empty`.
fn publish_dash_skips_empty_lines(kind: Kind) {
    let db = Db::new(kind, "empty");
    let q = db.queue("empty");
    db.deploy(&[&q]);
    assert_eq!(
        db.ok_with(&["publish", &q, "-"], Some(b"a\n\n\r\nb\n")),
        format!("published 2 messages to `{q}`\n")
    );
    assert_eq!(db.depth(&q, ""), 2);
}
on_each_database!(publish_dash_skips_empty_lines on sqlite);

/// A line over MariaDB's `max_allowed_packet` in the middle of stdin: the lines before it
/// are published, the command says exactly how many and that nothing from that line on
/// was, and exits 1 (it used to commit an unsaid number and die on a reset connection).
fn an_over_long_line_says_what_was_published(kind: Kind) {
    let db = Db::new(kind, "long");
    let q = db.queue("long");
    db.deploy(&[&q]);
    let mut input = b"one\ntwo\nthree\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 17 << 20));
    input.extend_from_slice(b"\nfive\n");
    let (output, _) = run_with(db.rowbus(&["publish", &q, "-"]), Some(&input), RUN_TIMEOUT);
    let error = assert_error(&output, "an over-long line");
    assert_mentions(
        &error,
        &["line 4 is 17825792 bytes", "max_allowed_packet", "published 3 messages", "first 3 lines"],
        "the over-long line",
    );
    assert_eq!(db.depth(&q, ""), 3);
}
on_each_database!(an_over_long_line_says_what_was_published on mariadb);

/// Publishing on MySQL/MariaDB or SQLite without the notify table warns that consumers
/// elsewhere are not woken (the message itself is published).
fn publishing_without_the_notify_table_warns(kind: Kind) {
    let db = Db::new(kind, "nonotify");
    let q = db.queue("nonotify");
    db.deploy(&[&q]);
    let missing = unique("qcli_missing_notify");
    let mut cmd = rowbus();
    cmd.args(["--database-url", &db.database.url, "--notify-table", &missing, "publish", &q, "hello"]);
    let output = run(cmd);
    assert!(output.status.success(), "{}", show(&output));
    let stderr = text(&output.stderr);
    assert_mentions(
        &stderr,
        &["warning", &missing, "does not exist", "rowbus deploy"],
        "the missing notify table",
    );
    assert_eq!(db.depth(&q, ""), 1);
}
on_each_database!(publishing_without_the_notify_table_warns on mariadb, sqlite);

/// A failing `--exec` command's stderr reaches ours as it runs, and its last 2 KB go with
/// the failure into the dead letter's `last_error`, beside the exit status.
fn exec_stderr_is_kept_with_the_failure(kind: Kind) {
    let db = Db::new(kind, "stderr");
    let q = db.queue("stderr");
    db.deploy(&[&q]);
    db.publish(&q, &["resize 42.png"], 1);
    let script =
        "head -c 3000 /dev/zero | tr '\\0' x >&2; echo >&2; echo 'cannot resize: disk full' >&2; exit 3";
    let mut consumer = start_consumer(db.rowbus(&["consume", &q, "--exec", script, "--max-attempts", "1"]));
    db.wait_stats(&q, "", "dead-lettered", |g| g["dead"] == 1 && g["depth"] == 0);
    let stderr = stop_cleanly(&mut consumer, "INT");
    assert!(stderr.iter().any(|l| l == "cannot resize: disk full"), "passed through: {stderr:#?}");
    let output = Command::new("mariadb")
        .args(["-h127.0.0.1", "-P3306", "-uroot", "test", "-N", "-B", "-e"])
        .arg(format!("SELECT last_error FROM `{q}_dead`"))
        .output()
        .expect("running the mariadb client");
    let last_error = text(&output.stdout);
    assert_mentions(
        &last_error,
        &["exited with status 3", "cannot resize: disk full"],
        "the dead letter's error",
    );
    assert!(last_error.len() < 2400, "the last 2 KB of stderr, not all 3 KB: {} bytes", last_error.len());
}
on_each_database!(exec_stderr_is_kept_with_the_failure on mariadb);

/// `deploy --queue S.Q` with a schema that does not exist is refused in the flags' words
/// and creates nothing; with `--create-schema` PostgreSQL creates it (the cleanup drops it
/// with what is in it). On MariaDB the qualifier is a database, never created.
fn a_missing_schema_is_refused_unless_asked(kind: Kind) {
    let db = Db::new(kind, "schema");
    let schema = unique("qcli_typo");
    if kind == Kind::Postgres {
        db.database.cleanup.schema(&schema);
    }
    let queue = format!("{schema}.jobs");
    let exists = || {
        let sql = format!("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = '{schema}'");
        db.database.exec(&sql).trim() == "1"
    };
    // The notify table is deployed before the queues (its line on stdout): the error is
    // the queue's, one line.
    let failed = |args: &[&str], what: &str| {
        let output = run(db.rowbus(args));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{what}\n{}", show(&output));
        assert_eq!(stderr.lines().count(), 1, "{what}\n{}", show(&output));
        assert!(stderr.starts_with("rowbus: error: "), "{what}\n{}", show(&output));
        assert!(!text(&output.stdout).contains("queue table"), "{what}\n{}", show(&output));
        stderr
    };
    let line = failed(&["deploy", "--queue", &queue], "a missing schema");
    match kind {
        Kind::Postgres => assert_mentions(
            &line,
            &[
                &format!("the schema `{schema}` does not exist"),
                &format!("--queue {queue}"),
                "--create-schema",
            ],
            "a missing schema",
        ),
        _ => assert_mentions(
            &line,
            &[&format!("the database `{schema}` does not exist"), "CREATE DATABASE"],
            "a missing database",
        ),
    }
    assert!(!line.contains("DeployOptions"), "library words on the command line: {line}");
    assert!(!exists(), "the refused deploy made `{schema}`");

    match kind {
        Kind::Postgres => {
            let asked = run(db.rowbus(&["deploy", "--queue", &queue, "--create-schema"]));
            assert!(asked.status.success(), "deploy --create-schema\n{}", show(&asked));
            assert!(exists());
            db.ok(&["publish", &queue, "in the new schema"]);
            db.ok(&["deploy", "--queue", &queue]);
        }
        _ => {
            let line =
                failed(&["deploy", "--queue", &queue, "--create-schema"], "--create-schema on MariaDB");
            assert_mentions(&line, &["does not create databases"], "--create-schema on MariaDB");
            assert!(!exists());
        }
    }
}
on_each_database!(a_missing_schema_is_refused_unless_asked on postgres, mariadb);

/// `publish --header a=1 --header a=2` is refused, naming the header: a message holds one
/// value per name, and keeping one of the two silently would lose the other.
fn a_header_given_twice_is_refused(kind: Kind) {
    let db = Db::new(kind, "hdr2");
    let q = db.queue("hdr2");
    db.deploy(&[&q]);
    let line = db.fail(&["publish", &q, "--header", "a=1", "--header", "a=2", "x"], "a header given twice");
    assert_mentions(&line, &["--header \"a\" is given twice"], "the refusal");
    assert_eq!(db.depth(&q, ""), 0, "nothing published");
    db.publish(&q, &["--header", "a=1", "--header", "b=2", "x"], 1);
}
on_each_database!(a_header_given_twice_is_refused);

/// `publish -` stopped by SIGINT exits with status 1, its one error line saying what was
/// published: a script must not take an interrupted run for a complete one.
fn an_interrupted_publish_dash_exits_1_saying_what_it_published(kind: Kind) {
    use std::io::Write as _;
    let db = Db::new(kind, "pubint");
    let q = db.queue("pubint");
    db.deploy(&[&q]);
    let mut cmd = db.rowbus(&["publish", &q, "-"]);
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("rowbus publish -");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(b"one\ntwo\nthree\n").unwrap();
    stdin.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while db.depth(&q, "") < 3 {
        assert!(Instant::now() < deadline, "the three lines were not published within 20 s");
        thread::sleep(Duration::from_millis(50));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let stdout = common::read_all(child.stdout.take().unwrap());
    let stderr = common::read_all(child.stderr.take().unwrap());
    let status = common::wait_timeout(&mut child, EXIT_TIMEOUT).expect("exits after SIGINT");
    drop(stdin);
    let output =
        std::process::Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() };
    let line = assert_error(&output, "an interrupted `publish -`");
    assert_mentions(
        &line,
        &[&format!("interrupted: published 3 messages to `{q}` from the first 3 lines of stdin")],
        "the interruption",
    );
}
on_each_database!(an_interrupted_publish_dash_exits_1_saying_what_it_published);

/// `consume | head -1` ends quietly with status 0 once `head` has gone, as `listen` does:
/// no error line, and the message it could not write is given back.
fn a_closed_pipe_ends_consume_quietly(kind: Kind) {
    let db = Db::new(kind, "cpipe");
    let q = db.queue("cpipe");
    db.deploy(&[&q]);
    // More than a pipe holds, so that the consumer still writes when `head` is gone.
    let filler = "x".repeat(4000);
    let input: String = (0..50).map(|i| format!("m{i} {filler}\n")).collect();
    assert_eq!(
        db.ok_with(&["publish", &q, "-"], Some(input.as_bytes())),
        format!("published 50 messages to `{q}`\n")
    );
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        "set -o pipefail; \"$@\" | head -1; echo \"rc=$?\"",
        "bash",
        env!("CARGO_BIN_EXE_rowbus"),
    ])
    .args(["--database-url", &db.database.url, "--notify-table", &db.notify_table, "consume", &q])
    .env_remove("DATABASE_URL")
    .env_remove("RUST_LOG");
    let output = run(cmd);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{}", show(&output));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", show(&output));
    assert!(lines[0].contains(" - m0 x"), "{}", show(&output));
    assert_eq!(lines[1], "rc=0", "consume exited non-zero on a closed pipe\n{}", show(&output));
    assert!(!stderr.contains("error"), "{}", show(&output));
    let left = db.depth(&q, "");
    assert!(
        (1..50).contains(&left),
        "{left} left: the one it could not write was given back\n{}",
        show(&output)
    );
}
on_each_database!(a_closed_pipe_ends_consume_quietly);

/// One rule for the default group and for payloads in every listing: plain text shows the
/// default group as `-` (`consume`, `stats`, `history`, `dead list`, `schedule --list`),
/// JSON as ""; a payload that is not UTF-8 is `"payload": null` with its bytes in
/// `"payload_hex"` in every `--json` (`consume`, `history`, `dead list`), and plain
/// `consume` writes its bytes that are not UTF-8 as `\xNN`.
fn the_default_group_and_binary_payloads_read_alike_everywhere(kind: Kind) {
    let db = Db::new(kind, "dflt");
    let q = db.queue("dflt");
    db.deploy(&[&q]);
    db.ok(&["deploy", "--queue", &q, "--keep", "1h"]);
    db.ok_with(&["publish", &q, "-"], Some(b"\xff\xfeok \"q\"\n"));
    let mut consumer = start_consumer(db.rowbus(&["consume", &q]));
    let line = consumer.next_line("the binary payload");
    assert!(line.ends_with(" - \\xff\\xfeok \"q\""), "{line}");
    stop_cleanly(&mut consumer, "INT");

    // Dead-lettered (and kept) at its first failure.
    db.ok_with(&["publish", &q, "-"], Some(b"\xff\n"));
    let args = ["consume", &q, "--exec", "exit 3", "--max-attempts", "1"];
    let mut consumer = start_consumer(db.rowbus(&args));
    let deadline = Instant::now() + Duration::from_secs(20);
    while db.ok(&["dead", "list", &q]).is_empty() {
        assert!(Instant::now() < deadline, "not dead-lettered within 20 s");
        thread::sleep(Duration::from_millis(100));
    }
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "{stderr:#?}");

    let dead = db.ok(&["dead", "list", &q]);
    assert!(dead.contains("  group -  "), "{dead}");
    let history = db.ok(&["history", &q]);
    assert_eq!(history.lines().filter(|l| l.contains("  group -  ")).count(), 2, "{history}");
    let stats = db.ok(&["stats", &q]);
    assert!(stats.lines().any(|l| l.split_whitespace().nth(1) == Some("-")), "{stats}");
    db.ok(&["schedule", &q, "tick", "--every", "1h"]);
    let schedules = db.ok(&["schedule", "--list", &q]);
    assert_eq!(schedules.lines().nth(1).and_then(|l| l.split('\t').nth(3)), Some("-"), "{schedules}");
    let schedule: Value = serde_json::from_str(&db.ok(&["schedule", "--list", &q, "--json"])).unwrap();
    assert_eq!(schedule["group"], "");

    let binary = |line: &Value| (line["group"].clone(), line["payload"].clone(), line["payload_hex"].clone());
    let expected = (Value::from(""), Value::Null, Value::from("ff"));
    let dead: Value = serde_json::from_str(&db.ok(&["dead", "list", &q, "--json"])).unwrap();
    assert_eq!(binary(&dead), expected, "dead list --json: {dead}");
    let history: Value =
        serde_json::from_str(db.ok(&["history", &q, "--json", "--limit", "1"]).trim()).unwrap();
    assert_eq!(binary(&history), expected, "history --json: {history}");
    db.ok(&["dead", "requeue", &q, "--all"]);
    let mut consumer = start_consumer(db.rowbus(&["consume", &q, "--json"]));
    let line = consumer.next_line("the requeued binary payload");
    let value: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(binary(&value), expected, "consume --json: {line}");
    stop_cleanly(&mut consumer, "INT");
}
on_each_database!(the_default_group_and_binary_payloads_read_alike_everywhere);

/// A login role of the test's own, dropped at the end (also when the test fails) with
/// whatever it was granted.
struct Role {
    kind: Kind,
    name: String,
}

impl Role {
    /// Creates the role (password `pw`).
    fn new(db: &Db, name: &str) -> Role {
        let role = Role { kind: db.database.kind, name: unique(name) };
        match role.kind {
            Kind::Postgres => db.database.exec(&format!("CREATE ROLE \"{}\" LOGIN PASSWORD 'pw'", role.name)),
            _ => db.database.exec(&format!("CREATE USER '{}'@'%' IDENTIFIED BY 'pw'", role.name)),
        };
        role
    }

    /// The role, as a GRANT or REVOKE names it.
    fn grantee(&self) -> String {
        match self.kind {
            Kind::Postgres => format!("\"{}\"", self.name),
            _ => format!("'{}'@'%'", self.name),
        }
    }

    /// The test server's URL, connecting as this role.
    fn url(&self) -> String {
        match self.kind {
            Kind::Postgres => format!("postgres://{}:pw@127.0.0.1:5432/test", self.name),
            _ => format!("mysql://{}:pw@127.0.0.1:3306/test", self.name),
        }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let database = Database::new(self.kind, &self.name);
        let sql = match self.kind {
            Kind::Postgres => format!("DROP OWNED BY \"{0}\"; DROP ROLE IF EXISTS \"{0}\"", self.name),
            _ => format!("DROP USER IF EXISTS '{}'@'%'", self.name),
        };
        if let Err(e) = database.client(&sql) {
            eprintln!("cannot drop the role {}, drop it by hand: {e}", self.name);
        }
    }
}

/// A role that may read a queue's tables but not the notify table, the durable
/// listeners' positions nor the queue's counts table gets the queue's figures from `stats`
/// and a line for each part it may not read (the counts once granted), and exit 0 (the whole command failed on the first refusal); a queue
/// it may not read is said too, and fails the command.
fn stats_shows_what_a_role_may_read(kind: Kind) {
    let db = Db::new(kind, "monitor");
    let queue = db.queue("monitor");
    db.ok(&["deploy", "--queue", &queue, "--durable"]);
    db.publish(&queue, &["one"], 1);
    db.publish(&queue, &["two"], 1);
    let role = Role::new(&db, "qcli_mon");
    let to = role.grantee();
    if kind == Kind::Postgres {
        db.database.exec(&format!("GRANT USAGE ON SCHEMA public TO {to}"));
    }
    for table in [queue.clone(), format!("{queue}_dead"), format!("{queue}_pause")] {
        db.database.exec(&format!("GRANT SELECT ON {table} TO {to}"));
    }
    let as_role = |args: &[&str]| {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &role.url(), "--notify-table", &db.notify_table]).args(args);
        run(cmd)
    };
    let not_readable = "not readable by this role (permission denied)";

    let plain = as_role(&["stats", &queue]);
    assert!(plain.status.success(), "stats as a role that may not read the notify table\n{}", show(&plain));
    let stdout = text(&plain.stdout);
    let figures = stdout
        .lines()
        .find(|l| l.starts_with(&queue))
        .unwrap_or_else(|| panic!("no line of `{queue}`:\n{stdout}"));
    assert_eq!(figures.split_whitespace().nth(2), Some("2"), "the depth: {stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    let notify_line = format!("notify table `{}`: {not_readable}", db.notify_table);
    assert_eq!(lines.iter().filter(|l| **l == notify_line).count(), 1, "said once:\n{stdout}");
    assert_eq!(
        lines.iter().filter(|l| **l == format!("durable listeners: {not_readable}")).count(),
        1,
        "{stdout}"
    );

    let json = as_role(&["stats", &queue, "--json"]);
    assert!(json.status.success(), "stats --json\n{}", show(&json));
    let report: Value = serde_json::from_str(&text(&json.stdout))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", show(&json)));
    assert_eq!(report["queues"][0]["table"], queue.as_str(), "{report}");
    assert_eq!(report["queues"][0]["depth"], 2, "{report}");
    assert_eq!(report["notify_table"]["table"], db.notify_table.as_str(), "{report}");
    assert_eq!(report["notify_table"]["error"], not_readable, "{report}");
    assert_eq!(report["durable_listeners"], Value::Null, "{report}");
    assert_eq!(report["durable_listeners_error"], not_readable, "{report}");
    // The queue's counts table, not granted: one part not readable, the rest shown.
    assert_eq!(report["counts"][queue.as_str()]["error"], not_readable, "{report}");
    let events = format!("events of `{queue}`: {not_readable}");
    assert!(stdout.lines().any(|l| l == events), "{stdout}");
    db.database.exec(&format!("GRANT SELECT ON {queue}_count TO {to}"));
    let granted = as_role(&["stats", &queue, "--json"]);
    let report: Value = serde_json::from_str(&text(&granted.stdout)).expect("JSON");
    assert_eq!(report["counts"][queue.as_str()]["snoozed"], 0, "{report}");

    // Every claim reads the pause table, and so does stats: without it the queue itself
    // is not readable, which fails the command once it has said what it could.
    db.database.exec(&format!("REVOKE SELECT ON {queue}_pause FROM {to}"));
    let refused = as_role(&["stats", &queue]);
    assert_eq!(refused.status.code(), Some(1), "a queue it may not read\n{}", show(&refused));
    let stdout = text(&refused.stdout);
    assert!(stdout.lines().any(|l| l == format!("queue table `{queue}`: {not_readable}")), "{stdout}");
    assert!(stdout.lines().any(|l| l == notify_line), "{stdout}");
    assert!(!stdout.contains("no queue tables"), "{stdout}");
    let stderr = text(&refused.stderr);
    assert_eq!(stderr.lines().count(), 1, "one error line\n{}", show(&refused));
    assert_mentions(
        &stderr,
        &["rowbus: error: ", "1 of 1 queue tables", "permission denied"],
        "stats of a queue it may not read",
    );
}
on_each_database!(stats_shows_what_a_role_may_read on postgres, mariadb);
