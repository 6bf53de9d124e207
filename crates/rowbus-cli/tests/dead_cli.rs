//! End-to-end tests of `rowbus dead list|requeue|purge`: real processes against real
//! PostgreSQL, MariaDB and SQLite. The dead letters are made by `rowbus consume --exec`
//! with a failing command, so what they keep is what an operator would find.
//!
//! The servers must be up (`scripts/services.sh` starts them); a test fails, never skips,
//! when one is unreachable. Every test uses its own tables, dropped at the end.

mod common;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    Database, Kind, LINE_TIMEOUT, Running, assert_error, on_each_database, rowbus, run, run_quietly, show,
    unique,
};
use serde_json::Value;

/// One test's database, notify table and queue table, the tables dropped at the end.
struct Db {
    database: Database,
    notify_table: String,
    queue: String,
}

impl Db {
    fn new(kind: Kind) -> Db {
        let notify_table = unique("dcli_notify");
        let queue = unique("dcli");
        Db { database: Database::new(kind, &notify_table), notify_table, queue }
    }

    /// `rowbus --database-url URL --notify-table T ARGS...`
    fn rowbus(&self, args: &[&str]) -> Command {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &self.database.url, "--notify-table", &self.notify_table]).args(args);
        cmd
    }

    /// Runs a command that must succeed without a word on stderr; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        run_quietly(self.rowbus(args), None, self.database.server())
    }

    /// `rowbus dead list QUEUE --json ARGS...`, each line parsed.
    fn list(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["dead", "list", &self.queue, "--json"];
        all.extend(args);
        self.ok(&all)
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
            .collect()
    }

    /// `group`'s line of `stats --json QUEUE`.
    fn stats(&self, group: &str) -> Value {
        let stats: Value = serde_json::from_str(&self.ok(&["stats", "--json", &self.queue])).unwrap();
        let groups = stats["queues"].as_array().expect("a queues array");
        groups.iter().find(|g| g["group"] == group).cloned().unwrap_or(Value::Null)
    }

    /// Publishes `payloads` to `group`, and has `consume --exec` fail each once (one
    /// attempt allowed): they die, keeping the command's exit status and stderr.
    fn kill(&self, group: &str, payloads: &[&str]) {
        for payload in payloads {
            self.ok(&["publish", &self.queue, "--group", group, payload]);
        }
        let script = r#"echo "cannot open $(cat)" >&2; exit 3"#;
        let args = ["consume", &self.queue, "--group", group, "--exec", script, "--max-attempts", "1"];
        let mut consumer = Running::spawn(self.rowbus(&args), Duration::from_secs(15));
        consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.list(&["--group", group]).len() < payloads.len() {
            assert!(Instant::now() < deadline, "{payloads:?} not dead-lettered within 20 s");
            thread::sleep(Duration::from_millis(100));
        }
        let (status, _, stderr) = consumer.stop("INT");
        assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
    }
}

impl Drop for Db {
    /// Hands the queue (with its dead-letter and pause tables) and the notify table to
    /// the database's cleanup guard, which drops them right after.
    fn drop(&mut self) {
        self.database.cleanup.queue(&self.queue);
        if self.database.kind == Kind::MariaDb {
            self.database.cleanup.notify_table(&self.notify_table);
        }
    }
}

/// `dead list` prints each dead letter, newest first, with its id, group, payload,
/// attempts, error (the command's exit status and stderr) and times; `--group`, `--limit`
/// and `--offset` narrow it. `dead requeue --id` puts one back (once: again, it moves
/// nothing), `--delay` keeps it from being ready; `dead purge --id`, `--older-than` and
/// `--all`, and `dead requeue --all`, say how many they moved.
fn dead_commands_list_requeue_and_purge(kind: Kind) {
    let db = Db::new(kind);
    let q = db.queue.clone();
    db.ok(&["deploy", "--queue", &q]);
    db.kill("a", &["p1", "p2"]);
    db.kill("b", &["p3"]);

    let all = db.list(&[]);
    let payloads: Vec<&str> = all.iter().map(|l| l["payload"].as_str().unwrap()).collect();
    assert_eq!(payloads, ["p3", "p2", "p1"], "newest first: {all:#?}");
    let p1 = &all[2];
    for key in ["id", "group", "payload", "attempts", "last_error", "published_at", "died_at"] {
        assert!(p1.get(key).is_some(), "{key} missing: {p1}");
    }
    assert_eq!((p1["group"].as_str(), p1["attempts"].as_i64()), (Some("a"), Some(1)));
    let error = p1["last_error"].as_str().unwrap();
    assert!(error.contains("exited with status 3") && error.contains("cannot open p1"), "{error}");
    let (published, died) = (p1["published_at"].as_str().unwrap(), p1["died_at"].as_str().unwrap());
    assert!(published.ends_with('Z') && published.len() == 27 && published <= died, "{published} {died}");

    assert_eq!(db.list(&["--group", "a"]).len(), 2);
    assert_eq!(db.list(&["--limit", "1", "--offset", "1"])[0]["payload"], "p2");
    let human = db.ok(&["dead", "list", &q, "--group", "b"]);
    assert_eq!(human.lines().count(), 1, "{human}");
    assert!(human.contains("group \"b\"") && human.contains("payload \"p3\""), "{human}");

    let id = p1["id"].as_i64().unwrap().to_string();
    let requeue = ["dead", "requeue", q.as_str(), "--id", id.as_str(), "--delay", "1h"];
    assert_eq!(db.ok(&requeue), format!("requeued 1 dead letter to `{q}`\n"));
    assert_eq!(db.ok(&requeue), format!("requeued 0 dead letters to `{q}`\n"));
    let a = db.stats("a");
    assert_eq!(
        (a["depth"].as_i64(), a["ready"].as_i64(), a["dead"].as_i64()),
        (Some(1), Some(0), Some(1)),
        "{a}"
    );

    assert_eq!(
        db.ok(&["dead", "purge", &q, "--older-than", "1h"]),
        format!("purged 0 dead letters from `{q}_dead`\n")
    );
    let p2 = all[1]["id"].as_i64().unwrap().to_string();
    assert_eq!(db.ok(&["dead", "purge", &q, "--id", &p2]), format!("purged 1 dead letter from `{q}_dead`\n"));
    assert_eq!(db.ok(&["dead", "requeue", &q, "--all"]), format!("requeued 1 dead letter to `{q}`\n"));
    assert_eq!(db.stats("b")["ready"].as_i64(), Some(1), "p3 back and ready");
    assert_eq!(db.ok(&["dead", "purge", &q, "--all"]), format!("purged 0 dead letters from `{q}_dead`\n"));
    assert!(db.list(&[]).is_empty());
}
on_each_database!(dead_commands_list_requeue_and_purge);

/// What the dead commands refuse: no selection, two selections, a missing queue table;
/// each a one-line error and a non-zero exit.
fn dead_commands_refuse_what_they_cannot_do(kind: Kind) {
    let db = Db::new(kind);
    let q = db.queue.clone();
    db.ok(&["deploy", "--queue", &q]);
    // No selection: one line naming the flags that make one.
    let line = assert_error(&run(db.rowbus(&["dead", "requeue", &q])), "requeue without a selection");
    assert!(line.contains("dead requeue needs --all") && line.contains("--id ID"), "{line}");
    let line = assert_error(&run(db.rowbus(&["dead", "purge", &q])), "purge without a selection");
    assert!(line.contains("--all") && line.contains("--id ID") && line.contains("--older-than"), "{line}");
    // An id out of range is named as given.
    for id in ["100000000000000000000", "0", "1e20"] {
        let output = run(db.rowbus(&["dead", "requeue", &q, "--id", id]));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.code() == Some(2)
                && stderr.contains(&format!("'{id}' for '--id <ID>': not a whole number from 1 to")),
            "{}",
            show(&output)
        );
    }
    for args in [
        &["dead", "purge", q.as_str(), "--all", "--id", "1"],
        &["dead", "requeue", q.as_str(), "--all", "--delay", "soon"],
    ] {
        let output = run(db.rowbus(args));
        assert!(!output.status.success() && output.stdout.is_empty(), "{args:?}: {}", show(&output));
    }
    let missing = unique("dcli_missing");
    let line = assert_error(&run(db.rowbus(&["dead", "list", &missing])), "a missing queue table");
    assert!(
        line.contains("does not exist") && line.contains(&format!("rowbus deploy --queue {missing}")),
        "{line}"
    );
}
on_each_database!(dead_commands_refuse_what_they_cannot_do);

/// A message that uses its attempts while its queue's dead-letter table is gone (dropped
/// by hand) is not reported dead-lettered: `consume` says it could not be dead-lettered,
/// naming the table, and runs it again after the retry delay, its attempt staying the last
/// (never "attempt 2 of 1"); once `deploy` brings the table back it is dead-lettered, and
/// the summary counts the failures apart from the dead letters.
fn a_failed_dead_letter_is_reported_not_counted(kind: Kind) {
    let db = Db::new(kind);
    let q = db.queue.clone();
    db.ok(&["deploy", "--queue", &q]);
    let dead = format!("{q}_dead");
    match kind {
        Kind::MariaDb => db.database.exec(&format!("DROP TABLE `{dead}`")),
        _ => db.database.exec(&format!("DROP TABLE \"{dead}\"")),
    };
    db.ok(&["publish", &q, "doomed"]);
    let args =
        ["consume", &q, "--exec", "exit 1", "--max-attempts", "1", "--retry-delay", "500ms", "--lease", "1m"];
    let mut consumer = Running::spawn(db.rowbus(&args), Duration::from_secs(15));
    consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    for time in ["first", "second"] {
        let line = consumer.await_stderr("could not be dead-lettered", LINE_TIMEOUT, |line| {
            line.contains("(attempt ") || line.contains("could not be dead-lettered")
        });
        assert!(line.contains("(attempt 1 of 1)"), "the {time} attempt: {line}");
        assert!(line.contains("could not be dead-lettered"), "the {time} failure: {line}");
        assert!(line.contains(&format!("`{dead}`")) && !line.ends_with("; dead-lettered"), "{line}");
    }
    db.ok(&["deploy", "--queue", &q]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while db.list(&[]).is_empty() {
        assert!(Instant::now() < deadline, "not dead-lettered within 20 s of the redeploy");
        thread::sleep(Duration::from_millis(100));
    }
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
    let summary = stderr.iter().find(|l| l.starts_with("rowbus: stopped: ")).expect("a summary");
    assert!(summary.contains(" 1 dead-lettered,"), "{summary}");
    let failed: u64 = summary
        .split(", ")
        .find_map(|part| part.strip_suffix(" failed to dead-letter"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of failed dead letters in: {summary}"));
    assert!(failed >= 2, "{summary}");
}
on_each_database!(a_failed_dead_letter_is_reported_not_counted);
