//! The short form of `rowbus-chaos` on each database (docs/reliability.md has the long
//! form and its figures), and the least-privilege script it relies on.
//!
//! Each run injects its faults for a few seconds per scenario (broker, broker-tx, notify)
//! under the roles of scripts/roles.sh, then drains and checks: lost 0, unexpected 0, no
//! unexplained redelivery, duplicated effects 0, rolled-back notifications delivered 0.
//! The servers must be up (`scripts/services.sh`); a test fails, never skips, without them.

#[path = "../../rowbus/tests/common/cleanup.rs"]
mod cleanup;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use cleanup::{Cleanup, MARIADB_URL, PG_URL};
use rowbus::Backend;
use serde_json::Value;

/// The harness names every table it makes with this prefix (and `_`).
const PREFIX: &str = "chaos_ci";

/// Faults per scenario: enough for several session kills, a SIGKILL and listener kills.
const DURATION: &str = "7s";
/// Three scenarios, each with its drain, on a loaded 2-core machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(150);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `command` for at most `timeout`, killing it after that.
fn run(mut command: Command, timeout: Duration) -> Output {
    let what = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
            panic!("{what} did not finish within {timeout:?}; stderr:\n{stderr}");
        }
        thread::sleep(Duration::from_millis(50));
    };
    Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}

/// `rowbus-chaos --json` on `url`; its JSON, checked for validity count by count. The
/// harness's tables are dropped at the end.
fn chaos(url: &str) -> Value {
    let cleanup = Cleanup::new(Backend::from_url(url).expect("a database URL"));
    cleanup.prefix(&format!("{PREFIX}_"));
    chaos_with(url, DURATION, &[])
}

fn chaos_with(url: &str, duration: &str, extra: &[&str]) -> Value {
    let server_faults = extra.contains(&"--server-faults");
    let mut command = Command::new(env!("CARGO_BIN_EXE_rowbus-chaos"));
    command
        .args(["--json", "--scenario", "all", "--duration", duration, "--prefix", PREFIX])
        .args(["--database-url", url])
        .args(extra)
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .current_dir(std::env::temp_dir());
    let output = run(command, RUN_TIMEOUT);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}); stdout:\n{stdout}\nstderr:\n{stderr}"));
    let scenarios = report["scenarios"].as_array().expect("scenarios");
    let names: Vec<&str> = scenarios.iter().map(|s| s["scenario"].as_str().unwrap_or("?")).collect();
    assert_eq!(names, ["broker", "broker-tx", "notify"], "{report:#}");
    for s in scenarios {
        let name = s["scenario"].as_str().unwrap_or("?");
        let count = |key: &str| {
            s["counts"][key].as_u64().unwrap_or_else(|| panic!("{name}: no count {key}: {report:#}"))
        };
        let zero = match name {
            "broker" => {
                &["lost", "unexpected", "redelivered_unexplained", "dead_lettered", "left_in_queue"][..]
            }
            "broker-tx" => &["lost", "unexpected", "duplicated", "duplicated_effects", "dead_lettered"][..],
            _ => &["lost", "duplicated", "rolled_back_delivered", "unexpected", "not_reconnected"][..],
        };
        for key in zero {
            assert_eq!(count(key), 0, "{name}: {key} must be 0: {report:#}\nstderr:\n{stderr}");
        }
        if name == "notify" {
            let faults = count("listener_faults") + if server_faults { count("server_crashes") } else { 0 };
            assert!(count("committed") > 0 && faults > 0, "{name}: {report:#}");
        } else {
            // With server faults, a slow restart (seconds, on a loaded machine) can fill a
            // short run: the crash is then the fault it survived.
            let faults = count("sigkills") + if server_faults { count("server_crashes") } else { 0 };
            assert!(count("acknowledged") > 0 && faults > 0, "{name}: {report:#}");
            assert_eq!(count("delivered"), count("acknowledged") + count("recovered"), "{name}: {report:#}");
            if !url.starts_with("sqlite") {
                assert!(count("sessions_killed") > 0, "{name}: {report:#}");
            }
        }
        if server_faults {
            assert!(count("server_crashes") > 0, "{name}: {report:#}");
            // Accepting connections again within 30 s, and working again 30 s after that.
            assert!(
                count("outage_ms_max") < 30_000 && count("recovery_ms_max") < 30_000,
                "{name}: {report:#}"
            );
        }
        assert_eq!(s["valid"], true, "{name}: {report:#}\nstderr:\n{stderr}");
    }
    assert!(output.status.success(), "exit {:?}; stderr:\n{stderr}", output.status);
    report
}

#[test]
fn chaos_on_postgres_loses_nothing() {
    chaos(PG_URL);
}

#[test]
fn chaos_on_mariadb_loses_nothing() {
    chaos(MARIADB_URL);
}

#[test]
fn chaos_on_sqlite_loses_nothing() {
    // The harness uses a scratch SQLite file of its own.
    chaos("sqlite:");
}

/// The harness's own throwaway server, crashed hard mid-run and started
/// again; the broker and the listeners recover by themselves and nothing acknowledged is lost.
#[test]
fn chaos_with_server_crashes_on_postgres_loses_nothing() {
    chaos_with("postgres://", "5s", &["--server-faults"]);
}

#[test]
fn chaos_with_server_crashes_on_mariadb_loses_nothing() {
    chaos_with("mysql://", "5s", &["--server-faults"]);
}

/// A client statement as `user` (the roles' password is `pw`; the admins have none); its
/// success.
fn sql_as(db: &str, user: &str, statement: &str) -> bool {
    let password = if user.starts_with("roles_ci_") { "pw" } else { "" };
    let command = match db {
        "postgres" => {
            let mut c = Command::new("psql");
            c.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", user, "-d", "test", "-c"])
                .arg(statement)
                .env("PGPASSWORD", password);
            c
        }
        _ => {
            let mut c = Command::new("mariadb");
            c.args(["-h", "127.0.0.1", "-u", user, "test", "-e"]).arg(statement).env("MYSQL_PWD", password);
            c
        }
    };
    run(command, Duration::from_secs(30)).status.success()
}

/// scripts/roles.sh creates the five roles, idempotently, with what each needs and
/// nothing more. The roles stay (the script keeps them up to date); the tables are dropped.
/// Then the monitor role at work: see [`monitor_reads_and_writes_nothing`].
fn roles_script(db: &str) {
    let (admin, backend) =
        if db == "postgres" { ("postgres", Backend::Postgres) } else { ("root", Backend::MySql) };
    let (queue, notify) = ("roles_ci_q", "roles_ci_nt");
    let cleanup = Cleanup::new(backend);
    cleanup.queue(queue);
    cleanup.notify_table(notify);
    let mut statements = vec![
        format!("CREATE TABLE IF NOT EXISTS {queue} (id BIGINT, msg_key TEXT, dedup_id TEXT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {queue}_dead (id BIGINT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {queue}_pause (id BIGINT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {queue}_hist (id BIGINT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {queue}_keep (id BIGINT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {queue}_sched (id BIGINT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {queue}_ticks (id BIGINT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {queue}_count (name VARCHAR(64), n BIGINT)"),
        format!("CREATE TABLE IF NOT EXISTS {queue}_limits (id BIGINT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {queue}_starts (id BIGINT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {notify} (id BIGINT, v TEXT)"),
        format!("CREATE TABLE IF NOT EXISTS {notify}_positions (id BIGINT, v TEXT)"),
    ];
    if db == "postgres" {
        // PostgreSQL's queue table is a ring of partitions, which consumers empty.
        statements
            .extend((0..4).map(|p| format!("CREATE TABLE IF NOT EXISTS {queue}_p{p} (id BIGINT, v TEXT)")));
    }
    if db == "mariadb" {
        // MySQL/MariaDB keeps deduplication ids and ordering keys in tables of their own.
        statements
            .push(format!("CREATE TABLE IF NOT EXISTS {queue}_dedup (dedup_id VARCHAR(255), id BIGINT)"));
        statements.push(format!("CREATE TABLE IF NOT EXISTS {queue}_keys (id BIGINT, msg_key VARCHAR(255))"));
    }
    for statement in statements {
        assert!(sql_as(db, admin, &statement), "{statement}");
    }
    for _ in 0..2 {
        let mut command = Command::new(repo().join("scripts/roles.sh"));
        command.args([db, "--password", "pw", "--prefix", "roles_ci_", "--queue", queue, "--listen-notify"]);
        command.args(["--notify-table", notify]);
        let output = run(command, Duration::from_secs(60));
        assert!(output.status.success(), "roles.sh: {}", String::from_utf8_lossy(&output.stderr));
    }
    let allowed = |user: &str, statement: String| (user.to_owned(), statement, true);
    let refused = |user: &str, statement: String| (user.to_owned(), statement, false);
    let mut checks = vec![
        allowed("roles_ci_publisher", format!("INSERT INTO {queue} (id) VALUES (1)")),
        refused("roles_ci_publisher", format!("DELETE FROM {queue}")),
        refused("roles_ci_publisher", format!("SELECT * FROM {queue}")),
        allowed("roles_ci_consumer", format!("UPDATE {queue} SET v = 'x'")),
        allowed("roles_ci_consumer", format!("DELETE FROM {queue} WHERE id = 2")),
        allowed("roles_ci_consumer", format!("INSERT INTO {queue}_dead (id) VALUES (1)")),
        // A failed transactional handler puts its rows back.
        allowed("roles_ci_consumer", format!("INSERT INTO {queue} (id) VALUES (1)")),
        refused("roles_ci_consumer", format!("DELETE FROM {queue}_dead")),
        // Claims read the pause table; pausing is an administrator's.
        allowed("roles_ci_consumer", format!("SELECT * FROM {queue}_pause")),
        refused("roles_ci_consumer", format!("INSERT INTO {queue}_pause (id) VALUES (1)")),
        // Subscriptions read the keep setting and move handled messages into the history.
        allowed("roles_ci_consumer", format!("SELECT * FROM {queue}_keep")),
        refused("roles_ci_consumer", format!("INSERT INTO {queue}_keep (id) VALUES (1)")),
        allowed("roles_ci_consumer", format!("INSERT INTO {queue}_hist (id) VALUES (1)")),
        allowed("roles_ci_consumer", format!("DELETE FROM {queue}_hist WHERE id = 2")),
        // Its broker runs the schedules: reads them, records and cleans up ticks.
        allowed("roles_ci_consumer", format!("SELECT * FROM {queue}_sched")),
        refused("roles_ci_consumer", format!("INSERT INTO {queue}_sched (id) VALUES (1)")),
        allowed("roles_ci_consumer", format!("INSERT INTO {queue}_ticks (id) VALUES (1)")),
        allowed("roles_ci_consumer", format!("DELETE FROM {queue}_ticks WHERE id = 2")),
        // It adds to the queue's event counts (an upsert: insert, or read and update).
        allowed("roles_ci_consumer", format!("INSERT INTO {queue}_count (name, n) VALUES ('snoozed', 1)")),
        allowed("roles_ci_consumer", format!("UPDATE {queue}_count SET n = n + 1 WHERE name = 'snoozed'")),
        refused("roles_ci_consumer", format!("DELETE FROM {queue}_count")),
        allowed("roles_ci_consumer", format!("SELECT * FROM {queue}_limits")),
        refused("roles_ci_consumer", format!("INSERT INTO {queue}_limits (id) VALUES (1)")),
        allowed("roles_ci_consumer", format!("INSERT INTO {queue}_starts (id) VALUES (1)")),
        allowed("roles_ci_consumer", format!("DELETE FROM {queue}_starts")),
        refused("roles_ci_listener", format!("SELECT * FROM {queue}")),
        refused("roles_ci_notifier", format!("INSERT INTO {queue} (id) VALUES (1)")),
        // The monitor reads what stats, dead list, history and schedule --list show.
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}")),
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}_dead")),
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}_pause")),
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}_hist")),
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}_keep")),
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}_sched")),
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}_ticks")),
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}_count")),
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}_limits")),
        allowed("roles_ci_monitor", format!("SELECT * FROM {queue}_starts")),
        // ... and writes nothing.
        refused("roles_ci_monitor", format!("INSERT INTO {queue} (id) VALUES (1)")),
        refused("roles_ci_monitor", format!("UPDATE {queue} SET v = 'x'")),
        refused("roles_ci_monitor", format!("DELETE FROM {queue}")),
        refused("roles_ci_monitor", format!("INSERT INTO {queue}_dead (id) VALUES (1)")),
        refused("roles_ci_monitor", format!("DELETE FROM {queue}_dead")),
        refused("roles_ci_monitor", format!("INSERT INTO {queue}_pause (id) VALUES (1)")),
        refused("roles_ci_monitor", format!("DELETE FROM {queue}_hist")),
        refused("roles_ci_monitor", format!("INSERT INTO {queue}_ticks (id) VALUES (1)")),
        refused("roles_ci_monitor", format!("INSERT INTO {queue}_count (name, n) VALUES ('x', 1)")),
    ];
    if db == "mariadb" {
        checks.extend([
            // A deduplicated publish: the id's row, and whether its message is still there.
            allowed(
                "roles_ci_publisher",
                format!("INSERT INTO {queue}_dedup (dedup_id, id) VALUES ('d', 1)"),
            ),
            allowed(
                "roles_ci_publisher",
                format!("SELECT id FROM {queue}_dedup WHERE dedup_id = 'd' FOR UPDATE"),
            ),
            allowed("roles_ci_publisher", format!("UPDATE {queue}_dedup SET id = 2 WHERE dedup_id = 'd'")),
            allowed("roles_ci_publisher", format!("DELETE FROM {queue}_dedup WHERE dedup_id = 'd'")),
            allowed("roles_ci_publisher", format!("SELECT 1 FROM {queue} WHERE id = 1 AND dedup_id = 'd'")),
            refused("roles_ci_publisher", format!("SELECT v FROM {queue}")),
            refused("roles_ci_consumer", format!("INSERT INTO {queue}_dedup (dedup_id, id) VALUES ('e', 1)")),
            // Keyed messages' rows: written with them, read by claims, deleted once settled.
            allowed(
                "roles_ci_publisher",
                format!("INSERT INTO {queue}_keys (id, msg_key) SELECT id, msg_key FROM {queue} WHERE id >= 1"),
            ),
            refused("roles_ci_publisher", format!("DELETE FROM {queue}_keys")),
            allowed("roles_ci_consumer", format!("SELECT * FROM {queue}_keys")),
            allowed(
                "roles_ci_consumer",
                format!(
                    "DELETE FROM {queue}_keys WHERE id IN (1) AND NOT EXISTS (SELECT 1 FROM {queue}_dead AS d WHERE d.id = {queue}_keys.id)"
                ),
            ),
            refused("roles_ci_consumer", format!("INSERT INTO {queue}_keys (id, msg_key) VALUES (1, 'k')")),
            refused("roles_ci_consumer", format!("SELECT v FROM {queue}_dead")),
            allowed("roles_ci_notifier", format!("INSERT INTO {notify} (id) VALUES (1)")),
            refused("roles_ci_notifier", format!("SELECT * FROM {notify}")),
            allowed("roles_ci_listener", format!("SELECT * FROM {notify}")),
            allowed("roles_ci_listener", format!("DELETE FROM {notify} WHERE id = 2")),
            refused("roles_ci_listener", format!("INSERT INTO {notify} (id) VALUES (1)")),
            allowed("roles_ci_publisher", format!("INSERT INTO {notify} (id) VALUES (1)")),
            allowed("roles_ci_monitor", format!("SELECT * FROM {notify}")),
            allowed("roles_ci_monitor", format!("SELECT * FROM {notify}_positions")),
            refused("roles_ci_monitor", format!("DELETE FROM {notify}")),
            refused("roles_ci_monitor", format!("SELECT * FROM {queue}_dedup")),
            refused("roles_ci_monitor", format!("SELECT * FROM {queue}_keys")),
        ]);
    } else {
        checks.push(allowed("roles_ci_notifier", "SELECT pg_notify('roles_ci', 'x')".to_owned()));
        checks.push(allowed("roles_ci_listener", "LISTEN roles_ci".to_owned()));
    }
    for (user, statement, expected) in checks {
        assert_eq!(sql_as(db, &user, &statement), expected, "{user}: {statement}");
    }
    monitor_reads_and_writes_nothing(db);
}

/// The `rowbus` command, built beside this test (`cargo build -p rowbus-cli`).
fn rowbus_command() -> Command {
    let exe = std::env::current_exe().expect("the test's path");
    let bin = exe.parent().and_then(Path::parent).expect("target/<profile>/deps").join("rowbus");
    assert!(bin.exists(), "{} is missing: build it first, `cargo build -p rowbus-cli`", bin.display());
    let mut command = Command::new(bin);
    command.env_remove("DATABASE_URL").env_remove("RUST_LOG").current_dir(std::env::temp_dir());
    command
}

/// The roles scripts/roles.sh made under `prefix`, dropped at the end, also when the test
/// fails.
struct Roles {
    db: String,
    prefix: String,
}

impl Drop for Roles {
    fn drop(&mut self) {
        for role in ["notifier", "listener", "publisher", "consumer", "monitor"] {
            let user = format!("{}{role}", self.prefix);
            let db = self.db.as_str();
            let dropped = if db == "postgres" {
                // Its grants first (a role that was never made has none: that may fail).
                sql_as(db, "postgres", &format!("DROP OWNED BY \"{user}\""));
                sql_as(db, "postgres", &format!("DROP ROLE IF EXISTS \"{user}\""))
            } else {
                sql_as(db, "root", &format!("DROP USER IF EXISTS '{user}'@'%'"))
            };
            if !dropped {
                eprintln!("cannot drop the role {user} on {}: drop it by hand", self.db);
            }
        }
    }
}

/// The monitor role of scripts/roles.sh, on a deployed queue (and, on MariaDB, notify
/// table): `rowbus stats Q --json` and `rowbus dead list Q` work, publishing and consuming
/// are refused. Roles and tables are this run's own, dropped at the end.
fn monitor_reads_and_writes_nothing(db: &str) {
    let (admin_url, backend) =
        if db == "postgres" { (PG_URL, Backend::Postgres) } else { (MARIADB_URL, Backend::MySql) };
    let tag = format!("roles_mon_{}{}", cleanup::run_tag(), std::process::id());
    let cleanup = Cleanup::new(backend);
    let queue = cleanup.queue(&format!("{tag}_q"));
    let notify = cleanup.notify_table(&format!("{tag}_nt"));
    let rowbus = |url: &str, args: &[&str]| {
        let mut command = rowbus_command();
        command.args(["--database-url", url, "--notify-table", &notify]).args(args);
        run(command, Duration::from_secs(60))
    };
    let ok = |output: Output, what: &str| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{what} on {db}: {stderr}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    ok(rowbus(admin_url, &["deploy", "--queue", &queue]), "deploy");
    ok(rowbus(admin_url, &["publish", &queue, "waiting"]), "publish as the administrator");
    let roles = Roles { db: db.to_owned(), prefix: format!("{tag}_") };
    let mut command = Command::new(repo().join("scripts/roles.sh"));
    command.args([db, "--password", "pw", "--prefix", &roles.prefix, "--queue", &queue]);
    if db == "mariadb" {
        command.args(["--notify-table", &notify]);
    }
    ok(run(command, Duration::from_secs(60)), "roles.sh");
    let monitor = match db {
        "postgres" => format!("postgres://{}monitor:pw@127.0.0.1:5432/test", roles.prefix),
        _ => format!("mysql://{}monitor:pw@127.0.0.1:3306/test", roles.prefix),
    };

    let stdout = ok(rowbus(&monitor, &["stats", &queue, "--json"]), "stats --json as the monitor");
    let report: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    assert_eq!(report["queues"][0]["table"], queue.as_str(), "{report}");
    assert_eq!(report["queues"][0]["depth"], 1, "{report}");
    assert!(report["queues"][0].get("error").is_none(), "{report}");
    if db == "mariadb" {
        assert_eq!(report["notify_table"]["table"], notify.as_str(), "{report}");
        assert!(
            report["notify_table"].get("error").is_none(),
            "the monitor reads the notify table: {report}"
        );
    }
    assert!(report["durable_listeners"].is_array(), "{report}");
    ok(rowbus(&monitor, &["dead", "list", &queue]), "dead list as the monitor");

    let published = rowbus(&monitor, &["publish", &queue, "not allowed"]);
    assert!(!published.status.success(), "the monitor published on {db}");
    let consumed = rowbus(&monitor, &["consume", &queue]);
    assert!(!consumed.status.success(), "the monitor consumed on {db}");
    let stderr = String::from_utf8_lossy(&consumed.stderr);
    assert!(stderr.contains("cannot claim"), "{db}: {stderr}");
    let depth = ok(rowbus(admin_url, &["stats", &queue, "--json"]), "stats as the administrator");
    let report: Value = serde_json::from_str(depth.trim()).expect("JSON");
    assert_eq!(report["queues"][0]["depth"], 1, "the monitor changed the queue: {report}");
}

#[test]
fn roles_script_grants_what_each_role_needs_and_no_more_on_postgres() {
    roles_script("postgres");
}

#[test]
fn roles_script_grants_what_each_role_needs_and_no_more_on_mariadb() {
    roles_script("mariadb");
}

/// `scripts/roles.sh --dry-run` prints the SQL with the roles' password masked, on both
/// databases (PostgreSQL's printed it in clear).
#[test]
fn the_roles_dry_run_masks_the_password() {
    for db in ["postgres", "mariadb"] {
        let mut command = Command::new(repo().join("scripts/roles.sh"));
        command.args([db, "--dry-run", "--password", "s3cret_pw", "--queue", "jobs", "--notify-table", "nt"]);
        let output = run(command, Duration::from_secs(30));
        let sql = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{db}: {}", String::from_utf8_lossy(&output.stderr));
        assert!(!sql.contains("s3cret_pw"), "{db} printed the password:\n{sql}");
        assert!(sql.contains("'***'"), "{db}: the masked password is shown:\n{sql}");
    }
}
