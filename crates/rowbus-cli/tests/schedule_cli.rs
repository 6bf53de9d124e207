//! End to end, in child processes against the real PostgreSQL and MariaDB and a SQLite
//! file: `rowbus schedule` adds, replaces, lists and removes a queue's schedules; a running
//! `rowbus consume` publishes their ticks (and one with `--no-schedules` does not); every
//! mistake is one `rowbus: error:` line naming it.

mod common;

use std::time::Duration;

use common::{
    Database, Kind, Running, assert_error, assert_mentions, on_each_database, rowbus, run, show, text, unique,
};
use serde_json::Value;

/// How long a consumer that must not see a tick is watched: several 200 ms ticks and
/// several of its 100 ms polls.
const QUIET: Duration = Duration::from_millis(1500);

/// One test's database and queue, with its own notify table.
struct Setup {
    database: Database,
    notify_table: String,
    q: String,
}

impl Setup {
    fn new(kind: Kind, name: &str) -> Setup {
        let notify_table = unique(&format!("{name}_nt"));
        let database = Database::new(kind, &notify_table);
        database.cleanup.notify_table(&notify_table);
        let q = database.cleanup.queue(&unique(name));
        let setup = Setup { database, notify_table, q };
        setup.ok(&["deploy", "--queue", &setup.q]);
        setup
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &self.database.url, "--notify-table", &self.notify_table]).args(args);
        cmd
    }

    /// Runs `rowbus ARGS`, which must succeed quietly; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = run(self.command(args));
        assert!(
            output.status.success() && output.stderr.is_empty(),
            "`rowbus {}` on {} did not succeed quietly\n{}",
            args.join(" "),
            self.database.server(),
            show(&output)
        );
        text(&output.stdout)
    }

    /// Runs `rowbus ARGS`, which must fail with one error line; the line.
    fn error(&self, args: &[&str]) -> String {
        assert_error(&run(self.command(args)), &args.join(" "))
    }
}

fn json(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"))
}

/// Add, again (unchanged), replace, list in text and JSON, remove.
fn schedules_are_added_listed_and_removed(kind: Kind) {
    let s = Setup::new(kind, "schcli");
    let q = s.q.as_str();
    let added = s.ok(&["schedule", q, "sweep", "--every", "5m", "--payload", "go", "--group", "g"]);
    assert!(
        added.starts_with(&format!("added schedule \"sweep\" of queue `{q}`: every 5m, next tick ")),
        "{added}"
    );
    let again = s.ok(&["schedule", q, "sweep", "--every", "5m", "--payload", "go", "--group", "g"]);
    assert!(again.contains("unchanged"), "{again}");
    let replaced = s.ok(&["schedule", q, "sweep", "--every", "10m", "--payload", "go", "--group", "g"]);
    assert!(replaced.starts_with("replaced schedule \"sweep\""), "{replaced}");
    let cron = s.ok(&["schedule", q, "nightly", "--cron", "0 3 * * *", "--payload", "report"]);
    assert_mentions(
        &cron,
        &["added schedule \"nightly\"", "cron \"0 3 * * *\" (UTC)", "T03:00:00.000000Z"],
        "cron",
    );

    let listed = s.ok(&["schedule", "--list", q]);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(lines[0].starts_with("QUEUE\tNAME\tWHEN"), "{listed}");
    assert!(
        lines[1].starts_with(&format!("{q}\tnightly\tcron \"0 3 * * *\" (UTC)\t-\t\"report\"\t-\t")),
        "{listed}"
    );
    assert!(lines[2].starts_with(&format!("{q}\tsweep\tevery 10m\tg\t\"go\"\t-\t")), "{listed}");
    // Without a queue: every queue's, this one's among them (other tests' queues come
    // and go on the same server, some made by other rowbus versions: a note on stderr each).
    let all = run(s.command(&["schedule", "--list"]));
    assert!(all.status.success() && text(&all.stdout).contains(&format!("{q}\tsweep\t")), "{}", show(&all));

    let json_lines: Vec<Value> = s.ok(&["schedule", "--list", q, "--json"]).lines().map(json).collect();
    assert_eq!(json_lines.len(), 2);
    let sweep = &json_lines[1];
    assert_eq!((sweep["queue"].as_str(), sweep["name"].as_str()), (Some(q), Some("sweep")));
    assert_eq!((sweep["every_ms"].as_u64(), sweep["cron"].is_null()), (Some(600_000), true));
    assert_eq!((sweep["group"].as_str(), sweep["payload"].as_str()), (Some("g"), Some("go")));
    assert!(sweep["last_tick"].is_null() && sweep["next_tick"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(json_lines[0]["cron"].as_str(), Some("0 3 * * *"));
    // Days, as every duration flag takes them.
    s.ok(&["schedule", q, "twice_weekly", "--every", "3.5d"]);
    let listed = s.ok(&["schedule", "--list", q, "--json"]);
    let days = listed.lines().map(json).find(|l| l["name"] == "twice_weekly").expect("the schedule in days");
    assert_eq!(days["every_ms"].as_u64(), Some(302_400_000));
    s.ok(&["schedule", q, "twice_weekly", "--remove"]);

    assert_eq!(
        s.ok(&["schedule", q, "sweep", "--remove"]),
        format!("removed schedule \"sweep\" of queue `{q}`\n")
    );
    s.ok(&["schedule", q, "nightly", "--remove"]);
    let output = run(s.command(&["schedule", "--list", q]));
    assert!(output.status.success() && output.stdout.is_empty(), "{}", show(&output));
    assert_eq!(text(&output.stderr), "rowbus: no schedules\n");
}
on_each_database!(schedules_are_added_listed_and_removed);

/// A running consumer publishes the ticks (here to another group, which a second
/// consumer prints); one with --no-schedules publishes none.
fn a_running_consumer_publishes_the_ticks(kind: Kind) {
    let s = Setup::new(kind, "schrun");
    let q = s.q.as_str();
    s.ok(&["schedule", q, "tick", "--every", "200ms", "--payload", "tock", "--group", "ticks"]);
    let printer = || {
        let args = ["consume", q, "--group", "ticks", "--json", "--no-schedules", "--poll-interval", "100ms"];
        Running::spawn(s.command(&args), Duration::from_secs(15))
    };
    let mut printing = printer();
    printing.no_line(QUIET, "no consumer runs the schedules: no tick");

    let args = ["consume", q, "--group", "idle", "--poll-interval", "100ms"];
    let mut ticking = Running::spawn(s.command(&args), Duration::from_secs(15));
    for _ in 0..3 {
        let line = json(&printing.next_line("a tick within 20 s"));
        assert_eq!((line["payload"].as_str(), line["group"].as_str()), (Some("tock"), Some("ticks")));
    }
    let (status, _, _) = ticking.stop("INT");
    assert!(status.success());
    printing.stop("INT");
    let listed = s.ok(&["schedule", "--list", q, "--json"]);
    assert!(json(listed.trim())["last_tick"].as_str().is_some(), "{listed}");
}
on_each_database!(a_running_consumer_publishes_the_ticks);

/// Each mistake is one error line that names it; clap's usage errors exit 2.
fn mistakes_are_named(kind: Kind) {
    let s = Setup::new(kind, "scherr");
    let q = s.q.as_str();
    let line = s.error(&["schedule", q, "x", "--cron", "0 3 * *"]);
    assert_mentions(&line, &["invalid cron expression \"0 3 * *\"", "five fields"], "bad cron");
    let line = s.error(&["schedule", q, "x", "--cron", "0 0 3 * * * 2030"]);
    assert_mentions(
        &line,
        &["invalid cron expression \"0 0 3 * * * 2030\": 7 fields", "five fields"],
        "a year",
    );
    let line = s.error(&["schedule", q, "x", "--cron", "0 0 30 2 *"]);
    assert_mentions(&line, &["\"0 0 30 2 *\"", "matches no date"], "impossible cron");
    let line = s.error(&["schedule", q, "x", "--every", "10ms"]);
    assert_mentions(&line, &["invalid schedule \"x\"", "100ms"], "too short");
    let line = s.error(&["schedule", q, "a b", "--every", "1s"]);
    assert_mentions(&line, &["invalid schedule \"a b\""], "bad name");
    let line = s.error(&["schedule", q, "gone", "--remove"]);
    assert_mentions(&line, &[&format!("queue `{q}` has no schedule \"gone\"")], "nothing to remove");
    let missing = unique("schnone");
    let line = s.error(&["schedule", &missing, "x", "--every", "1s"]);
    assert_mentions(&line, &[&format!("`{missing}` does not exist"), "rowbus deploy --queue"], "no queue");
    for args in [
        &["schedule", q, "x"][..],
        &["schedule", q, "x", "--every", "1s", "--cron", "* * * * *"],
        &["schedule", q, "x", "--remove", "--payload", "p"],
        &["schedule", q, "--every", "1s"],
    ] {
        let output = run(s.command(args));
        assert_eq!(output.status.code(), Some(2), "{args:?}\n{}", show(&output));
    }
    // A queue deployed before schedules: the command that adds their tables.
    s.database.exec(&format!("DROP TABLE {q}_sched"));
    let line = s.error(&["schedule", q, "x", "--every", "1s"]);
    assert_mentions(&line, &[&format!("{q}_sched"), &format!("rowbus deploy --queue {q}")], "old queue");
}
on_each_database!(mistakes_are_named);
