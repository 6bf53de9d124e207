//! End to end, in child processes against the real PostgreSQL and MariaDB and a SQLite
//! file: `rowbus stats` (text and `--json`) shows each queue's health, names a
//! transaction held open by another client as what holds the horizon and warns of it past
//! `--horizon-warn`; a MariaDB user without PROCESS gets a line saying what it lacks.
//! The servers are shared: another program's transaction may be older than the test's,
//! in which case it is the one named.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Database, Kind, on_each_database, rowbus, run, show, text, unique};
use serde_json::Value;

/// `rowbus --database-url URL ARGS...`, which must succeed quietly; its stdout.
fn ok(url: &str, args: &[&str]) -> String {
    let mut cmd = rowbus();
    cmd.args(["--database-url", url]).args(args);
    let output = run(cmd);
    assert!(
        output.status.success() && output.stderr.is_empty(),
        "`rowbus {}` did not succeed quietly\n{}",
        args.join(" "),
        show(&output)
    );
    text(&output.stdout)
}

/// A client of the database holding a transaction open (PostgreSQL: REPEATABLE READ and a
/// read of the catalog, as `application_name` `app`, no lock on the queue's table that would
/// hold up dropping it; MariaDB: a consistent snapshot; SQLite: a read transaction) for
/// `secs`, killed when dropped.
struct Holder(Child);

impl Holder {
    fn start(database: &Database, queue: &str, app: &str, secs: u32) -> Holder {
        let mut cmd = match database.kind {
            Kind::Postgres => {
                let mut cmd = Command::new("psql");
                cmd.env("PGAPPNAME", app).args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-c"]).arg(
                    format!("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class; SELECT pg_sleep({secs})"),
                );
                cmd
            }
            Kind::MariaDb => {
                let mut cmd = Command::new("mariadb");
                cmd.args(["-h127.0.0.1", "-P3306", "-uroot", "test", "-e"])
                    .arg(format!("START TRANSACTION WITH CONSISTENT SNAPSHOT; SELECT SLEEP({secs})"));
                cmd
            }
            Kind::Sqlite => {
                let mut cmd = Command::new("sqlite3");
                cmd.arg(database.sqlite_file().unwrap())
                    .arg(format!("BEGIN; SELECT count(*) FROM \"{queue}\";"))
                    .arg(format!(".system sleep {secs}"));
                cmd
            }
        };
        Holder(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("the database's client"))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The queue's health in `rowbus stats --json`, once `ready` says it is what the test waits
/// for (within 10 s).
fn health_when(url: &str, queue: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let report: Value = serde_json::from_str(&ok(url, &["stats", "--json", queue])).expect("JSON");
        let health = report["health"][queue].clone();
        if ready(&health) || Instant::now() > deadline {
            assert_eq!(report["horizon_warn_s"], 300.0, "the default threshold: {report}");
            return health;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A held transaction named in the JSON and the text, the warning past the threshold and
/// none below it; the figures of size (and dead rows where kept).
fn stats_name_what_holds_the_horizon(kind: Kind) {
    let queue = unique("hcli");
    let database = Database::new(kind, &queue);
    database.cleanup.queue(&queue);
    let url = database.url.clone();
    ok(&url, &["deploy", "--queue", &queue]);
    ok(&url, &["publish", &queue, "one"]);
    let app = unique("hcli_app");
    let _holder = Holder::start(&database, &queue, &app, 20);
    if kind == Kind::Sqlite {
        // Writes after the reader's snapshot are what it holds in the WAL.
        std::thread::sleep(Duration::from_millis(500));
        ok(&url, &["publish", &queue, "two"]);
    }
    let ours = |h: &Value| match kind {
        Kind::Postgres => h["holder"]["application"] == app.as_str(),
        Kind::MariaDb => h["holder"]["kind"] == "transaction" && h["holder"]["age_s"].as_f64() >= Some(1.0),
        Kind::Sqlite => h["holder"]["kind"] == "WAL reader",
    };
    let health =
        health_when(&url, &queue, |h| ours(h) && h["holder"]["age_s"].as_f64().unwrap_or(1.0) >= 1.0);
    assert!(health["bytes"].as_u64() > Some(0), "{health}");
    let holder = &health["holder"];
    match kind {
        Kind::Postgres => {
            // Ours, or another program's older one.
            assert_eq!(holder["kind"], "session", "{health}");
            assert!(holder["pid"].as_i64().is_some() && holder["xid_age"].as_u64().is_some(), "{health}");
            assert!(health["dead_rows"].as_u64().is_some(), "{health}");
        }
        Kind::MariaDb => {
            assert_eq!(holder["kind"], "transaction", "{health}");
            assert!(holder["pid"].as_i64().is_some(), "{health}");
            assert_eq!(health["dead_rows_server_wide"], true, "{health}");
        }
        Kind::Sqlite => {
            assert!(health["wal"]["frames_left"].as_u64() > Some(0), "{health}");
            assert_eq!(health["dead_rows"], Value::Null, "{health}");
        }
    }
    let held = ours(&health) || holder["age_s"].as_f64() >= Some(1.0);
    assert!(held, "a holder a second old at least: {health}");

    let warned = ok(&url, &["stats", &queue, "--horizon-warn", "1s"]);
    let line = warned
        .lines()
        .find(|l| l.starts_with(&format!("health of `{queue}`: ")))
        .unwrap_or_else(|| panic!("no health line:\n{warned}"));
    assert!(line.contains("horizon held by "), "{line}");
    if kind == Kind::Postgres && ours(&health) {
        assert!(
            line.contains(&format!("of role postgres, application {app:?}, open ")),
            "the application named: {line}"
        );
    }
    assert!(
        warned.lines().any(|l| l.starts_with("WARNING: ") && l.contains(&format!("`{queue}`"))),
        "{warned}"
    );
    if kind != Kind::Sqlite {
        let calm = ok(&url, &["stats", &queue, "--horizon-warn", "1h"]);
        assert!(!calm.contains("WARNING"), "not past an hour:\n{calm}");
    }

    let mut cmd = rowbus();
    cmd.args(["--database-url", &url, "stats", &queue, "--horizon-warn", "soon"]);
    let refused = run(cmd);
    assert!(!refused.status.success(), "{}", show(&refused));
    let first = text(&refused.stderr).lines().next().unwrap_or_default().to_owned();
    assert!(first.contains("invalid value 'soon' for '--horizon-warn"), "{}", show(&refused));
}
on_each_database!(stats_name_what_holds_the_horizon);

/// A MariaDB user that may read the queue but lacks PROCESS: the dead rows and the holder
/// say what it lacks, the size is shown, and the command succeeds.
#[test]
fn stats_say_what_a_user_without_process_lacks() {
    let queue = unique("hcli_rights");
    let database = Database::new(Kind::MariaDb, &queue);
    database.cleanup.queue(&queue);
    ok(&database.url, &["deploy", "--queue", &queue]);
    let user = unique("hcli_user");
    database.exec(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"));
    struct Dropped<'a>(&'a Database, &'a str);
    impl Drop for Dropped<'_> {
        fn drop(&mut self) {
            let _ = self.0.client(&format!("DROP USER IF EXISTS '{}'@'%'", self.1));
        }
    }
    let _user = Dropped(&database, &user);
    for table in [queue.clone(), format!("{queue}_dead"), format!("{queue}_pause"), format!("{queue}_count")]
    {
        database.exec(&format!("GRANT SELECT ON `{table}` TO '{user}'@'%'"));
    }
    let url = format!("mysql://{user}:pw@127.0.0.1:3306/test");

    // The notify table is not granted either: said on a line of its own, not an error.
    let as_user = |args: &[&str]| {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &url]).args(args);
        let output = run(cmd);
        assert!(output.status.success(), "`rowbus {}`\n{}", args.join(" "), show(&output));
        text(&output.stdout)
    };
    let out = as_user(&["stats", &queue]);
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("health of `{queue}`: ")))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("dead rows not readable: needs the PROCESS privilege"), "{line}");
    assert!(line.contains("horizon not readable: needs the PROCESS privilege"), "{line}");
    assert!(line.contains(" on disk"), "the size is readable: {line}");

    let report: Value = serde_json::from_str(&as_user(&["stats", "--json", &queue])).unwrap();
    let health = &report["health"][queue.as_str()];
    assert!(health["holder"]["error"].as_str().is_some_and(|e| e.contains("PROCESS")), "{report}");
    assert!(health["dead_rows"]["error"].as_str().is_some_and(|e| e.contains("PROCESS")), "{report}");
}
