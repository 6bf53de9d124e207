//! End-to-end tests of `rowbus deploy --keep` and `rowbus history`: real processes against
//! real PostgreSQL, MariaDB and SQLite. The history is made by `rowbus consume --exec`, so
//! what it keeps is what an operator would find.
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
        let notify_table = unique("hcli_notify");
        let queue = unique("hcli");
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

    /// `rowbus history QUEUE --json ARGS...`, each line parsed.
    fn history(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["history", &self.queue, "--json"];
        all.extend(args);
        self.ok(&all)
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
            .collect()
    }
}

impl Drop for Db {
    /// Hands the queue (with its dead-letter, pause and history tables) and the notify
    /// table to the database's cleanup guard, which drops them right after.
    fn drop(&mut self) {
        self.database.cleanup.queue(&self.queue);
        if self.database.kind == Kind::MariaDb {
            self.database.cleanup.notify_table(&self.notify_table);
        }
    }
}

/// `deploy --keep 7d` says the queue keeps; `consume --exec` then acknowledges one
/// message and dead-letters another (its command fails, one attempt allowed), and
/// `history` prints both, newest first, with their outcome, attempts, error and times;
/// `--limit` narrows it and the text form is one line each. `deploy --keep 0` turns it
/// off; `--keep` needs a queue and a duration; `history` of a missing queue says so.
fn deploy_keep_and_history(kind: Kind) {
    let db = Db::new(kind);
    let q = db.queue.clone();
    let deployed = db.ok(&["deploy", "--queue", &q, "--keep", "7d"]);
    assert!(
        deployed.contains(&format!("`{q}` keeps handled messages in `{q}_hist` for 7d 00h")),
        "{deployed}"
    );
    assert!(db.history(&[]).is_empty());

    let script = r#"test "$(cat)" = good || { echo "cannot take it" >&2; exit 3; }"#;
    let args = ["consume", &q, "--exec", script, "--max-attempts", "1"];
    let mut consumer = Running::spawn(db.rowbus(&args), Duration::from_secs(15));
    consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    // One after the other, so that "newest first" has one answer: handled side by side,
    // the dead letter (at once) could be recorded before the acknowledgement (batched).
    let deadline = Instant::now() + Duration::from_secs(20);
    for (payload, kept) in [("good", 1), ("bad", 2)] {
        db.ok(&["publish", &q, payload]);
        while db.history(&[]).len() < kept {
            assert!(Instant::now() < deadline, "{kept} messages kept within 20 s");
            thread::sleep(Duration::from_millis(100));
        }
    }
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");

    let all = db.history(&[]);
    let payloads: Vec<&str> = all.iter().map(|l| l["payload"].as_str().unwrap()).collect();
    assert_eq!(payloads, ["bad", "good"], "newest first: {all:#?}");
    let (bad, good) = (&all[0], &all[1]);
    for key in ["id", "group", "payload", "attempts", "outcome", "last_error", "published_at", "handled_at"] {
        assert!(good.get(key).is_some(), "{key} missing: {good}");
    }
    assert_eq!((good["outcome"].as_str(), good["attempts"].as_i64()), (Some("acked"), Some(1)));
    assert_eq!(good["last_error"], Value::Null);
    assert_eq!((bad["outcome"].as_str(), bad["attempts"].as_i64()), (Some("dead"), Some(1)));
    let error = bad["last_error"].as_str().unwrap();
    assert!(error.contains("exited with status 3") && error.contains("cannot take it"), "{error}");
    let (published, handled) = (good["published_at"].as_str().unwrap(), good["handled_at"].as_str().unwrap());
    assert!(
        published.ends_with('Z') && published.len() == 27 && published <= handled,
        "{published} {handled}"
    );
    assert_eq!(db.history(&["--limit", "1"]).len(), 1);
    let human = db.ok(&["history", &q]);
    assert_eq!(human.lines().count(), 2, "{human}");
    assert!(human.lines().nth(1).unwrap().contains("  acked  group -  attempts 1"), "{human}");

    let off = db.ok(&["deploy", "--queue", &q, "--keep", "0"]);
    assert!(off.contains(&format!("`{q}` keeps no history")), "{off}");

    // Refused by the flags' parser, before connecting.
    for (args, what) in [
        (vec!["deploy", "--keep", "1h"], "--queue"),
        (vec!["deploy", "--queue", q.as_str(), "--keep", "soon"], "`soon` is not a duration"),
    ] {
        let output = run(db.rowbus(&args));
        assert_eq!(output.status.code(), Some(2), "{args:?}: refused by clap\n{}", show(&output));
        assert!(String::from_utf8_lossy(&output.stderr).contains(what), "{args:?}: {}", show(&output));
    }
    let missing = unique("hcli_missing");
    let line = assert_error(&run(db.rowbus(&["history", &missing])), "a missing queue");
    assert!(line.contains("does not exist"), "{line}");
}
on_each_database!(deploy_keep_and_history);

/// `history` of a queue that keeps no history says so on stderr, and how to turn it on,
/// rather than print nothing.
fn history_of_a_queue_keeping_none_says_how_to_keep(kind: Kind) {
    let db = Db::new(kind);
    let q = db.queue.clone();
    db.ok(&["deploy", "--queue", &q]);
    let output = run(db.rowbus(&["history", &q]));
    assert!(output.status.success() && output.stdout.is_empty(), "{}", show(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("`{q}` keeps no history"))
            && stderr.contains(&format!("`rowbus deploy --queue {q} --keep DURATION`")),
        "{}",
        show(&output)
    );
    db.ok(&["deploy", "--queue", &q, "--keep", "1h"]);
    assert_eq!(db.ok(&["history", &q]), "", "a queue that keeps history says nothing of it");
}
on_each_database!(history_of_a_queue_keeping_none_says_how_to_keep);
