//! End-to-end tests of job control: `rowbus cancel` reaching a `rowbus consume --exec`
//! in another process (at its next poll, or at once with --listen-notify), SIGTERM then
//! SIGKILL after --grace, `publish --timeout`, and `cancel --all`. Real processes against
//! real PostgreSQL, MariaDB and SQLite.
//!
//! The servers must be up (`scripts/services.sh` starts them); a test fails, never skips,
//! when one is unreachable. Every test uses its own tables, dropped at the end.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{Database, Kind, LINE_TIMEOUT, Running, on_each_database, rowbus, run_quietly, unique};
use serde_json::Value;

/// How long the test waits for what should happen well within it.
const WITHIN: Duration = Duration::from_secs(20);

/// One test's database, notify table, queue table and directory of marker files; the
/// tables and the directory removed at the end.
struct Db {
    database: Database,
    notify_table: String,
    queue: String,
    marks: PathBuf,
}

impl Db {
    fn new(kind: Kind) -> Db {
        let notify_table = unique("ccli_notify");
        let queue = unique("ccli");
        let marks = std::env::temp_dir().join(unique("rowbus_ccli_marks"));
        std::fs::create_dir_all(&marks).unwrap();
        let db = Db { database: Database::new(kind, &notify_table), notify_table, queue, marks };
        db.ok(&["deploy", "--queue", &db.queue]);
        db
    }

    /// `rowbus --database-url URL --notify-table T ARGS...`, with MARKS set to the marker
    /// directory.
    fn rowbus(&self, args: &[&str]) -> Command {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &self.database.url, "--notify-table", &self.notify_table]).args(args);
        cmd.env("MARKS", &self.marks);
        cmd
    }

    /// Runs a command that must succeed without a word on stderr; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        run_quietly(self.rowbus(args), None, self.database.server())
    }

    /// A consumer running `script` on each message, its extra `args` given; started.
    fn consumer(&self, script: &str, args: &[&str]) -> Running {
        let mut all = vec!["consume", &self.queue, "--exec", script];
        all.extend(args);
        let mut consumer = Running::spawn(self.rowbus(&all), Duration::from_secs(20));
        consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
        consumer
    }

    /// The marker file `name`.
    fn mark(&self, name: &str) -> PathBuf {
        self.marks.join(name)
    }

    /// Waits for a file whose name ends with `suffix`; its name without it.
    fn await_mark(&self, suffix: &str) -> String {
        let deadline = Instant::now() + WITHIN;
        loop {
            let found = std::fs::read_dir(&self.marks)
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .find_map(|name| name.strip_suffix(suffix).map(str::to_owned));
            if let Some(stem) = found {
                return stem;
            }
            assert!(Instant::now() < deadline, "no `*{suffix}` marker within {WITHIN:?}");
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `group`'s line of `stats --json QUEUE` (null when the group has no message).
    fn stats(&self, group: &str) -> Value {
        let stats: Value = serde_json::from_str(&self.ok(&["stats", "--json", &self.queue])).unwrap();
        let groups = stats["queues"].as_array().expect("a queues array");
        groups.iter().find(|g| g["group"] == group).cloned().unwrap_or(Value::Null)
    }

    /// The queue's depth in `group` (0 when stats has no line for it).
    fn depth(&self, group: &str) -> i64 {
        self.stats(group)["depth"].as_i64().unwrap_or(0)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.marks);
        self.database.cleanup.queue(&self.queue);
        if self.database.kind == Kind::MariaDb {
            self.database.cleanup.notify_table(&self.notify_table);
        }
    }
}

/// Waits until `path` exists.
fn await_file(path: &Path) {
    let deadline = Instant::now() + WITHIN;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} not written within {WITHIN:?}", path.display());
        thread::sleep(Duration::from_millis(50));
    }
}

/// The command of the cancel tests: says it started (`ID.started`), writes `ID.term` on
/// SIGTERM and exits 143; runs for 60 s otherwise.
const POLITE: &str = r#"trap 'touch "$MARKS/$ROWBUS_ID.term"; exit 143' TERM; touch "$MARKS/$ROWBUS_ID.started"; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"#;

/// `rowbus cancel --id` of a message a consumer in another process runs: the consumer's
/// command gets SIGTERM (at the consumer's next poll; with --listen-notify and a ten minutes'
/// poll interval, through the notification alone), the message is gone, and the consumer
/// goes on with the next one.
fn cancel_reaches_another_process(kind: Kind) {
    for listen in [false, true] {
        let db = Db::new(kind);
        let args: &[&str] = match listen {
            false => &["--poll-interval", "200ms", "--grace", "5s"],
            true => &["--poll-interval", "10m", "--listen-notify", "--grace", "5s"],
        };
        let mut consumer = db.consumer(POLITE, args);
        db.ok(&["publish", &db.queue, "job"]);
        let id = db.await_mark(".started");
        let said = db.ok(&["cancel", &db.queue, "--id", &id]);
        assert_eq!(
            said,
            format!("cancelled 1 message from `{}`: {id} (running: {id}; its consumer stops it)\n", db.queue)
        );
        await_file(&db.mark(&format!("{id}.term")));
        consumer.await_stderr("sending SIGTERM", WITHIN, |line| {
            line == format!("rowbus: message {id}: cancelled; sending SIGTERM to `{POLITE}`")
        });
        assert_eq!(db.depth(""), 0, "the cancelled message is gone");
        // The worker is free again: the next message runs.
        db.ok(&["publish", &db.queue, "next"]);
        let deadline = Instant::now() + WITHIN;
        while std::fs::read_dir(&db.marks)
            .unwrap()
            .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".started")))
            .count()
            < 2
        {
            assert!(Instant::now() < deadline, "the next message did not start");
            thread::sleep(Duration::from_millis(50));
        }
        let (status, _, stderr) = consumer.stop("INT");
        assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
    }
}
on_each_database!(cancel_reaches_another_process);

/// A command that traps SIGTERM and goes on is killed (SIGKILL to its process group) once
/// the --grace period has passed.
fn stubborn_command_killed_after_grace(kind: Kind) {
    let db = Db::new(kind);
    let stubborn = r#"trap 'touch "$MARKS/$ROWBUS_ID.term"' TERM; echo $$ > "$MARKS/$ROWBUS_ID.pid"; touch "$MARKS/$ROWBUS_ID.started"; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"#;
    let mut consumer = db.consumer(stubborn, &["--poll-interval", "200ms", "--grace", "1s"]);
    db.ok(&["publish", &db.queue, "job"]);
    let id = db.await_mark(".started");
    let pid = std::fs::read_to_string(db.mark(&format!("{id}.pid"))).unwrap().trim().to_owned();
    db.ok(&["cancel", &db.queue, "--id", &id]);
    await_file(&db.mark(&format!("{id}.term")));
    let deadline = Instant::now() + WITHIN;
    while Command::new("kill")
        .args(["-0", &pid])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "the command trapping SIGTERM was not killed after the grace period"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
}
on_each_database!(stubborn_command_killed_after_grace);

/// `publish --timeout`: a command still running then gets SIGTERM, and the attempt fails
/// with "timed out after ..." (here dead-lettered: one attempt allowed); `consume
/// --timeout` is the default for messages without their own.
fn timeouts_fail_the_attempt(kind: Kind) {
    let db = Db::new(kind);
    let mut consumer =
        db.consumer(POLITE, &["--poll-interval", "200ms", "--max-attempts", "1", "--timeout", "1h"]);
    db.ok(&["publish", &db.queue, "--timeout", "500ms", "job"]);
    let id = db.await_mark(".started");
    await_file(&db.mark(&format!("{id}.term")));
    let deadline = Instant::now() + WITHIN;
    let dead = loop {
        let out = db.ok(&["dead", "list", &db.queue, "--json"]);
        if let Some(line) = out.lines().next() {
            break serde_json::from_str::<Value>(line).unwrap();
        }
        assert!(Instant::now() < deadline, "not dead-lettered within {WITHIN:?}");
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(dead["last_error"], "timed out after 500ms", "{dead}");
    assert_eq!(dead["headers"]["rowbus-timeout-ms"], "500", "{dead}");
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
}
on_each_database!(timeouts_fail_the_attempt);

/// `cancel --all` takes the default group's messages, `--group G --all` that group's;
/// `--id` of nothing cancels nothing; neither --id nor --all is refused.
fn cancel_all_of_a_group(kind: Kind) {
    let db = Db::new(kind);
    let q = db.queue.clone();
    for (group, payload) in [("", "a"), ("", "b"), ("g", "c")] {
        db.ok(&["publish", &q, "--group", group, "--delay", "1h", payload]);
    }
    let said = db.ok(&["cancel", &q, "--group", "g", "--all"]);
    assert!(said.starts_with(&format!("cancelled 1 message from `{q}`: ")), "{said}");
    assert_eq!((db.depth(""), db.depth("g")), (2, 0));
    let said = db.ok(&["cancel", &q, "--all"]);
    assert!(said.starts_with(&format!("cancelled 2 messages from `{q}`: ")), "{said}");
    assert_eq!(db.depth(""), 0);
    assert_eq!(db.ok(&["cancel", &q, "--id", "999999999"]), format!("cancelled 0 messages from `{q}`\n"));
    let refused = db.rowbus(&["cancel", &q]).output().unwrap();
    assert!(!refused.status.success());
}
on_each_database!(cancel_all_of_a_group);

/// `publish --json` prints each stored message's id, which `cancel --id` takes; a
/// duplicate has none; with `-`, a line per stdin line.
fn publish_json_prints_ids(kind: Kind) {
    let db = Db::new(kind);
    let q = db.queue.clone();
    let line =
        |text: &str| serde_json::from_str::<Value>(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let one = line(&db.ok(&["publish", &q, "--json", "--dedup", "d1", "--delay", "1h", "x"]));
    let id = one["id"].as_i64().unwrap_or_else(|| panic!("no id: {one}"));
    let duplicate = line(&db.ok(&["publish", &q, "--json", "--dedup", "d1", "x"]));
    assert_eq!(duplicate, serde_json::json!({"id": null, "duplicate": "d1"}));
    let mut cmd = db.rowbus(&["publish", &q, "--json", "--delay", "1h", "-"]);
    cmd.stdin(std::process::Stdio::piped());
    let (out, _) = common::run_with(cmd, Some(b"a\nb\nc\n"), common::RUN_TIMEOUT);
    assert!(out.status.success(), "{}", common::show(&out));
    let ids: Vec<i64> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| line(l)["id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]) && ids[0] > id, "{ids:?}");
    let mut args = vec!["cancel".to_owned(), q.clone()];
    for id in std::iter::once(id).chain(ids) {
        args.extend(["--id".to_owned(), id.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(db.ok(&args).starts_with(&format!("cancelled 4 messages from `{q}`: ")));
    assert_eq!(db.depth(""), 0);
}
on_each_database!(publish_json_prints_ids);

/// `consume --heartbeat`: a command running three times its lease keeps the message (run
/// once, acknowledged); the consumer's runner extends the lease, not the command's own
/// extension.
fn heartbeat_keeps_a_long_command(kind: Kind) {
    let db = Db::new(kind);
    let script = r#"echo run >> "$MARKS/runs"; sleep 3"#;
    let mut consumer =
        db.consumer(script, &["--workers", "2", "--lease", "1s", "--heartbeat", "--poll-interval", "200ms"]);
    db.ok(&["publish", &db.queue, "job"]);
    let deadline = Instant::now() + WITHIN;
    while db.depth("") > 0 {
        assert!(Instant::now() < deadline, "not acknowledged within {WITHIN:?}");
        thread::sleep(Duration::from_millis(100));
    }
    let runs = std::fs::read_to_string(db.mark("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "run once: {runs:?}");
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
    assert!(!stderr.iter().any(|l| l.contains("warning")), "no lost lease said: {stderr:#?}");
}
on_each_database!(heartbeat_keeps_a_long_command);

/// Whether process `pid` is still running (not a zombie: a process whose parent exited
/// waits as one until whatever adopted it reaps it).
fn running(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits until process `pid` is gone, at most `within`; `what` names it in the message.
fn await_gone(pid: &str, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while running(pid) {
        assert!(Instant::now() < deadline, "{what} (pid {pid}) still running after {within:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// A command whose shell dies of SIGTERM while a process it forked ignores SIGTERM and
/// sleeps on: `ID.pid` holds the shell's pid, `ID.bg` the sleeper's (`N.bgN` also by
/// attempt). A process is looked up in /proc, where a zombie (dead, not yet reaped by
/// whatever adopted it) is told from a live one.
const FORKS_A_STUBBORN_SLEEPER: &str = r#"(trap '' TERM; exec sleep 30) & echo $! > "$MARKS/$ROWBUS_ID.bg"; echo $! > "$MARKS/attempt$ROWBUS_ATTEMPT.bg"; echo $$ > "$MARKS/$ROWBUS_ID.pid"; touch "$MARKS/$ROWBUS_ID.started"; wait"#;

/// A cancelled command's whole process group is stopped: what the shell forked and that
/// ignores SIGTERM is killed once --grace has passed, though the shell itself died of
/// SIGTERM at once.
fn a_cancel_stops_the_whole_process_group(kind: Kind) {
    let db = Db::new(kind);
    let mut consumer = db.consumer(FORKS_A_STUBBORN_SLEEPER, &["--poll-interval", "200ms", "--grace", "1s"]);
    db.ok(&["publish", &db.queue, "job"]);
    let id = db.await_mark(".started");
    let shell = std::fs::read_to_string(db.mark(&format!("{id}.pid"))).unwrap().trim().to_owned();
    let sleeper = std::fs::read_to_string(db.mark(&format!("{id}.bg"))).unwrap().trim().to_owned();
    db.ok(&["cancel", &db.queue, "--id", &id]);
    await_gone(&shell, Duration::from_secs(5), "the command's shell");
    // SIGKILL after the 1 s grace; the sleeper would otherwise run its 30 s.
    await_gone(&sleeper, Duration::from_secs(8), "the process the cancelled command forked");
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
}
on_each_database!(a_cancel_stops_the_whole_process_group);

/// `--timeout` with retries: each attempt's whole process group is gone before the next
/// attempt starts (each attempt's command checks that its predecessors' sleepers are gone),
/// and the message is dead-lettered as timed out.
fn a_timed_out_attempt_is_over_before_the_next_starts(kind: Kind) {
    let db = Db::new(kind);
    let script = format!(
        r#"for f in "$MARKS"/attempt*.bg; do [ -f "$f" ] || continue; s=$(cut -d' ' -f3 "/proc/$(cat "$f")/stat" 2>/dev/null); [ -n "$s" ] && [ "$s" != Z ] && echo "$ROWBUS_ATTEMPT: $f" >> "$MARKS/overlap"; done; {FORKS_A_STUBBORN_SLEEPER}"#
    );
    let mut consumer = db.consumer(
        &script,
        &[
            "--poll-interval",
            "200ms",
            "--grace",
            "1s",
            "--timeout",
            "1s",
            "--max-attempts",
            "3",
            "--retry-delay",
            "100ms",
        ],
    );
    db.ok(&["publish", &db.queue, "job"]);
    let deadline = Instant::now() + Duration::from_secs(40);
    let dead = loop {
        let out = db.ok(&["dead", "list", &db.queue, "--json"]);
        if let Some(line) = out.lines().next() {
            break serde_json::from_str::<Value>(line).unwrap();
        }
        assert!(Instant::now() < deadline, "not dead-lettered in time");
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(dead["last_error"], "timed out after 1s", "{dead}");
    assert_eq!(dead["attempts"], 3, "{dead}");
    let overlap = std::fs::read_to_string(db.mark("overlap")).unwrap_or_default();
    assert!(overlap.is_empty(), "an attempt started while an earlier one's process ran:\n{overlap}");
    for attempt in 1..=3 {
        let sleeper = std::fs::read_to_string(db.mark(&format!("attempt{attempt}.bg"))).unwrap();
        assert!(!running(sleeper.trim()), "attempt {attempt}'s sleeper outlived its message");
    }
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
}
on_each_database!(a_timed_out_attempt_is_over_before_the_next_starts);

/// A command that exits at once, leaving a process in its group that holds its stderr,
/// ends its attempt then: the message is acknowledged and the worker takes the next one
/// (not 30 s later), the process left is stopped, and a line says so.
fn an_attempt_ends_when_its_command_exits(kind: Kind) {
    let db = Db::new(kind);
    let script = r#"sleep 30 & echo $! > "$MARKS/$ROWBUS_ID.bg"; exit 0"#;
    let mut consumer = db.consumer(script, &["--poll-interval", "200ms", "--workers", "1"]);
    db.ok(&["publish", &db.queue, "one"]);
    db.ok(&["publish", &db.queue, "two"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.depth("") > 0 {
        assert!(Instant::now() < deadline, "both not acknowledged within 10s: a worker waited on a leftover");
        thread::sleep(Duration::from_millis(100));
    }
    let sleeper = db.await_mark(".bg");
    let sleeper = std::fs::read_to_string(db.mark(&format!("{sleeper}.bg"))).unwrap();
    await_gone(sleeper.trim(), Duration::from_secs(5), "the process the command left");
    let said = consumer.await_stderr("left 1 process", WITHIN, |l| l.contains("left 1 process running"));
    assert!(said.ends_with("stopped with SIGTERM"), "{said}");
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
}
on_each_database!(an_attempt_ends_when_its_command_exits);

/// A consumer killed with SIGKILL leaves no command running: neither the shell nor what it
/// forked (which ignores SIGTERM: SIGKILL after --grace).
fn commands_die_with_their_consumer(kind: Kind) {
    let db = Db::new(kind);
    let mut consumer = db.consumer(FORKS_A_STUBBORN_SLEEPER, &["--poll-interval", "200ms", "--grace", "1s"]);
    db.ok(&["publish", &db.queue, "job"]);
    let id = db.await_mark(".started");
    let shell = std::fs::read_to_string(db.mark(&format!("{id}.pid"))).unwrap().trim().to_owned();
    let sleeper = std::fs::read_to_string(db.mark(&format!("{id}.bg"))).unwrap().trim().to_owned();
    let killed = Command::new("kill").args(["-KILL", &consumer.id().to_string()]).status().unwrap();
    assert!(killed.success());
    await_gone(&shell, Duration::from_secs(5), "the command's shell");
    await_gone(&sleeper, Duration::from_secs(8), "the process the command forked");
    let _ = consumer.wait(WITHIN);
}
on_each_database!(commands_die_with_their_consumer);

/// Another session holding an exclusive lock on a table for 30 s, through the database's
/// own client (killed when dropped, which ends the lock; on PostgreSQL its session is
/// ended too, which would otherwise sleep on with the lock after its client is gone).
struct TableLock(std::process::Child, Option<String>);

impl TableLock {
    /// Locks `table` of `db` and waits a moment for the lock to be taken.
    fn take(db: &Db, table: &str) -> TableLock {
        let mut session = None;
        let mut cmd = match db.database.kind {
            Kind::Postgres => {
                let name = format!("rowbus-lock-{table}");
                let mut cmd = Command::new("psql");
                cmd.env("PGAPPNAME", &name);
                session = Some(name);
                cmd.args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-q", "-c"]);
                cmd.arg(format!(
                    "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(30); COMMIT;"
                ));
                cmd
            }
            Kind::MariaDb => {
                let mut cmd = Command::new("mariadb");
                cmd.args(["-h127.0.0.1", "-P3306", "-uroot", "test", "-e"]);
                cmd.arg(format!("LOCK TABLES `{table}` WRITE; DO SLEEP(30); UNLOCK TABLES;"));
                cmd
            }
            Kind::Sqlite => {
                let mut cmd = Command::new("sqlite3");
                cmd.arg(db.database.sqlite_file().expect("a SQLite file"));
                cmd.args([".timeout 5000", "BEGIN EXCLUSIVE;", ".shell sleep 30", "COMMIT;"]);
                cmd
            }
        };
        // No output kept: what the client starts (sqlite3's `.shell`) outlives it.
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting the database's client");
        thread::sleep(Duration::from_secs(1));
        TableLock(child, session)
    }
}

impl Drop for TableLock {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if let Some(name) = &self.1 {
            let _ = Command::new("psql")
                .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-q", "-c"])
                .arg(format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}'"
                ))
                .stdout(std::process::Stdio::null())
                .status();
        }
    }
}

/// One SIGINT stops a consumer within its shutdown timeout even while its claim waits
/// behind another session's lock on the queue table (which can last as long as that
/// session wants: a year by MariaDB's default lock wait for a table lock): the claim is
/// left to finish by itself. `mode` is the runner's: workers or batches.
fn one_signal_stops_a_consumer_whose_claim_waits(kind: Kind, mode: &[&str]) {
    let db = Db::new(kind);
    let mut args = vec!["consume", &db.queue, "--poll-interval", "200ms", "--shutdown-timeout", "1s"];
    args.extend(mode);
    // Exit within 1 s of shutdown timeout and a little more, never when the lock goes.
    let mut consumer = Running::spawn(db.rowbus(&args), Duration::from_secs(5));
    consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    let lock = TableLock::take(&db, &db.queue);
    // A claim or two now waits behind the lock.
    thread::sleep(Duration::from_secs(1));
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
    drop(lock);
}

fn one_signal_stops_a_worker_consumer_whose_claim_waits(kind: Kind) {
    one_signal_stops_a_consumer_whose_claim_waits(kind, &["--workers", "2"]);
}
on_each_database!(one_signal_stops_a_worker_consumer_whose_claim_waits);

fn one_signal_stops_a_batch_consumer_whose_claim_waits(kind: Kind) {
    one_signal_stops_a_consumer_whose_claim_waits(kind, &["--batch", "10"]);
}
on_each_database!(one_signal_stops_a_batch_consumer_whose_claim_waits);

/// A second SIGINT stops waiting for the handlers in flight: the consumer exits at once,
/// its command's process group killed, rather than after --shutdown-timeout.
fn a_second_signal_stops_at_once(kind: Kind) {
    let db = Db::new(kind);
    let args = ["consume", &db.queue, "--exec", FORKS_A_STUBBORN_SLEEPER, "--shutdown-timeout", "1m"];
    // Within 5 s of the second signal, not a minute after the first.
    let mut consumer = Running::spawn(db.rowbus(&args), Duration::from_secs(5));
    consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    db.ok(&["publish", &db.queue, "job"]);
    let id = db.await_mark(".started");
    let sleeper = std::fs::read_to_string(db.mark(&format!("{id}.bg"))).unwrap().trim().to_owned();
    let pid = consumer.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    thread::sleep(Duration::from_millis(500));
    let (status, _, stderr) = consumer.stop("INT");
    assert!(status.success(), "the consumer exited {status}: {stderr:#?}");
    assert!(stderr.iter().any(|l| l.starts_with("rowbus: interrupted again")), "{stderr:#?}");
    await_gone(&sleeper, Duration::from_secs(5), "the command's process");
}
on_each_database!(a_second_signal_stops_at_once);

/// An --exec command the shell cannot run (127: not found; 126: not executable) stops the
/// consumer with one error line, the message given back unattempted rather than retried
/// and dead-lettered.
fn a_command_that_cannot_run_stops_the_consumer(kind: Kind) {
    let db = Db::new(kind);
    let not_executable = db.mark("not-executable.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").unwrap();
    let not_executable = not_executable.display().to_string();
    for (command, status, what) in [
        ("rowbus-no-such-command --flag", 127, "command not found"),
        (not_executable.as_str(), 126, "command not executable"),
    ] {
        db.ok(&["publish", &db.queue, "job"]);
        let args =
            ["consume", &db.queue, "--exec", command, "--poll-interval", "200ms", "--retry-delay", "100ms"];
        let mut consumer = Running::spawn(db.rowbus(&args), Duration::from_secs(20));
        let (exit, stderr) = consumer.wait_exit(WITHIN);
        assert_eq!(exit.code(), Some(1), "{command}: {stderr:#?}");
        let last = stderr.last().expect("an error line");
        assert!(
            last.starts_with(&format!(
                "rowbus: error: --exec `{command}` cannot run ({what}, exit status {status}"
            )),
            "{last}"
        );
        assert!(last.ends_with("was given back, its attempt not counted"), "{last}");
        assert!(!stderr.iter().any(|l| l.starts_with("rowbus: message ")), "{stderr:#?}");
        let stats = db.stats("");
        assert_eq!((stats["ready"].as_i64(), stats["dead"].as_i64()), (Some(1), Some(0)), "{stats}");
        db.ok(&["cancel", &db.queue, "--all"]);
    }
}
on_each_database!(a_command_that_cannot_run_stops_the_consumer);

/// A message that ran more attempts than this consumer's --max-attempts (a larger one
/// elsewhere) is said to be past it, not "attempt 4 of 2", and is dead-lettered.
fn attempts_past_max_attempts_are_said_so(kind: Kind) {
    let db = Db::new(kind);
    db.ok(&["publish", &db.queue, "job"]);
    let args = ["--poll-interval", "100ms", "--retry-delay", "50ms"];
    let mut first = db.consumer("exit 1", &[&args[..], &["--max-attempts", "5"]].concat());
    first.await_stderr("attempt 3 of 5", WITHIN, |l| l.contains("(attempt 3 of 5)"));
    let (status, _, stderr) = first.stop("INT");
    assert!(status.success(), "{stderr:#?}");
    let mut second = db.consumer("exit 1", &[&args[..], &["--max-attempts", "2"]].concat());
    let said = second.await_stderr("dead-lettered", WITHIN, |l| l.ends_with("dead-lettered"));
    assert!(said.contains("(attempt 4, past --max-attempts 2)"), "{said}");
    let (status, _, stderr) = second.stop("INT");
    assert!(status.success(), "{stderr:#?}");
}
on_each_database!(attempts_past_max_attempts_are_said_so);
