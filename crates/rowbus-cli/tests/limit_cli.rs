//! End to end, in child processes against the real PostgreSQL and MariaDB and a SQLite
//! file: `rowbus limit` sets, lists and clears limits and refuses bad values in one line;
//! three `rowbus consume --workers 8 --exec` processes under `--max-running 5` never run
//! more than five commands at once, and under `--rate 50/s` never start more than fifty in
//! a second; `rowbus stats` shows what a limit holds.

mod common;

use std::time::{Duration, Instant};

use common::{Database, Kind, LINE_TIMEOUT, Running, on_each_database, rowbus, run, show, text, unique};

/// `rowbus --database-url URL ARGS...`, which must succeed quietly; its stdout.
fn ok(database: &Database, args: &[&str]) -> String {
    let mut cmd = rowbus();
    cmd.args(["--database-url", &database.url]).args(args);
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

/// Messages held by a limit show in `rowbus stats` (text and JSON) and the dashboard's
/// sources: three ready under `--max-running 1`, none running, hold two.
fn stats_show_what_a_limit_holds(kind: Kind) {
    let (database, q) = fixture(kind, "lscli");
    ok(&database, &["deploy", "--queue", &q]);
    for n in 0..3 {
        ok(&database, &["publish", &q, &n.to_string()]);
    }
    let json = |database: &Database| -> serde_json::Value {
        serde_json::from_str(&ok(database, &["stats", "--json", &q])).unwrap()
    };
    assert_eq!(json(&database)["counts"][&q]["limited"], 0, "no limit, nothing held");
    ok(&database, &["limit", &q, "--max-running", "1"]);
    assert_eq!(json(&database)["counts"][&q]["limited"], 2);
    let text = ok(&database, &["stats", &q]);
    assert!(text.contains(&format!("events of `{q}`: ")) && text.contains("held by a limit now 2"), "{text}");
    // The limits themselves, in words, for the dashboard's queue line.
    ok(&database, &["limit", &q, "--rate", "20/s", "--burst", "2"]);
    assert_eq!(
        json(&database)["counts"][&q]["limits"],
        serde_json::json!(["whole queue: max running 1, rate 20/s, burst 2"])
    );
}
on_each_database!(stats_show_what_a_limit_holds);

/// `rowbus --database-url URL ARGS...`, which must fail; its first stderr line.
fn refused(database: &Database, args: &[&str]) -> String {
    let mut cmd = rowbus();
    cmd.args(["--database-url", &database.url]).args(args);
    let output = run(cmd);
    assert!(!output.status.success(), "`rowbus {}` succeeded\n{}", args.join(" "), show(&output));
    text(&output.stderr).lines().next().unwrap_or_default().to_owned()
}

fn fixture(kind: Kind, name: &str) -> (Database, String) {
    let q = unique(name);
    let database = Database::new(kind, &q);
    database.cleanup.queue(&q);
    (database, q)
}

fn set_list_clear(kind: Kind) {
    let (database, q) = fixture(kind, "lcli");
    ok(&database, &["deploy", "--queue", &q]);
    assert_eq!(
        ok(&database, &["limit", &q, "--max-running", "5", "--rate", "100/s"]),
        format!("limited queue `{q}`: at most 5 in flight, at most 100/s started\n")
    );
    assert_eq!(
        ok(&database, &["limit", &q, "--group", "g", "--per-key", "2"]),
        format!("limited group \"g\" of queue `{q}`: at most 2 of a key in flight\n")
    );
    ok(&database, &["publish", &q, "one"]);
    let listed = ok(&database, &["limit", &q, "--list"]);
    assert_eq!(
        listed,
        format!(
            "queue `{q}`: max running 5, rate 100/s; running 0, started 0 in the period, ready 1, limited 0\n\
             group \"g\" of queue `{q}`: per key 2; ready 0, limited 0\n"
        )
    );
    assert_eq!(
        ok(&database, &["limit", &q, "--group", "b", "--rate", "20/s", "--burst", "1"]),
        format!("limited group \"b\" of queue `{q}`: at most 20/s started, 1 at once\n")
    );
    assert!(
        ok(&database, &["limit", &q, "--list"])
            .contains(&format!("group \"b\" of queue `{q}`: rate 20/s, burst 1;"))
    );
    assert!(
        refused(&database, &["limit", &q, "--rate", "20/s", "--burst", "21"])
            .contains("from 1 to the rate's count (20)")
    );
    // clap: "the following required arguments were not provided:", then `--rate`.
    assert!(refused(&database, &["limit", &q, "--burst", "2"]).contains("required arguments"));
    ok(&database, &["limit", &q, "--group", "b", "--clear"]);
    // Without a queue: every queue found, this one among them.
    let all = ok(&database, &["limit", "--list"]);
    assert!(all.contains(&listed), "{all}");

    assert!(refused(&database, &["limit", &q, "--rate", "5/d"]).contains("N/s, N/m or N/h"));
    assert!(refused(&database, &["limit", &q, "--max-running", "0"]).contains("from 1"));
    assert!(refused(&database, &["limit", &q, "--per-key", "x"]).contains("whole number"));
    assert_eq!(
        refused(&database, &["limit", &q]),
        "rowbus: error: say what to do: --max-running N, --per-key N, --rate N/s, --clear or --list"
    );
    assert!(refused(&database, &["limit", &q, "--clear", "--max-running", "3"]).contains("cannot be used"));

    assert_eq!(
        ok(&database, &["limit", &q, "--group", "g", "--clear"]),
        format!("cleared the limits of group \"g\" of queue `{q}`\n")
    );
    assert_eq!(
        ok(&database, &["limit", &q, "--group", "g", "--clear"]),
        format!("group \"g\" of queue `{q}` had no limits\n")
    );
    ok(&database, &["limit", &q, "--clear"]);
    assert_eq!(ok(&database, &["limit", &q, "--list"]), format!("queue `{q}` has no limits\n"));
}
on_each_database!(set_list_clear);

/// Three consumer processes of eight workers each, every message a command that sleeps:
/// under `--max-running 5` no more than five commands run at once, and five do.
fn three_processes_keep_five_running(kind: Kind) {
    let (database, q) = fixture(kind, "lcli_run");
    ok(&database, &["deploy", "--queue", &q]);
    ok(&database, &["limit", &q, "--max-running", "5"]);
    let messages: String = (0..60).map(|i| format!("m{i}\n")).collect();
    let mut publish = rowbus();
    publish.args(["--database-url", &database.url, "publish", &q, "-"]);
    let (output, _) = common::run_with(publish, Some(messages.as_bytes()), common::RUN_TIMEOUT);
    assert!(output.status.success(), "{}", show(&output));

    let log = std::env::temp_dir().join(format!("{q}.times"));
    let _ = std::fs::remove_file(&log);
    let exec = format!(
        "echo \"S $(date +%s%N)\" >> {log}; sleep 0.1; echo \"E $(date +%s%N)\" >> {log}",
        log = log.display()
    );
    let mut consumers: Vec<Running> = (0..3)
        .map(|_| {
            let mut cmd = rowbus();
            cmd.args(["--database-url", &database.url, "consume", &q, "--workers", "8", "--exec", &exec]);
            cmd.args(["--poll-interval", "200ms"]);
            let mut consumer = Running::spawn(cmd, Duration::from_secs(15));
            consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
            consumer
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let events = loop {
        let events: Vec<(u128, bool)> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let (kind, at) = line.split_once(' ')?;
                Some((at.trim().parse().ok()?, kind == "S"))
            })
            .collect();
        if events.iter().filter(|(_, start)| !start).count() >= 60 {
            break events;
        }
        assert!(
            Instant::now() < deadline,
            "60 messages not handled within a minute: {} events",
            events.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    for consumer in &mut consumers {
        let (status, _, stderr) = consumer.stop("INT");
        assert!(status.success(), "{status} {stderr:?}");
    }
    let _ = std::fs::remove_file(&log);
    // In time order, an end before a start at the same instant.
    let mut events = events;
    events.sort_by_key(|&(at, start)| (at, start));
    let (mut running, mut most) = (0_i64, 0_i64);
    for (_, start) in events {
        running += if start { 1 } else { -1 };
        most = most.max(running);
    }
    assert_eq!(most, 5, "at most five commands at once, and five were reached");
}
on_each_database!(three_processes_keep_five_running);

/// Three `rowbus consume --workers 8 --exec` processes drain 600 messages under `--rate
/// 50/s`: the commands' start times never put more than 50 in any one-second window, and
/// the drain takes the twelve seconds the rate allows.
fn three_processes_keep_to_a_rate(kind: Kind) {
    const MESSAGES: usize = 600;
    let (database, q) = fixture(kind, "lcli_rate");
    ok(&database, &["deploy", "--queue", &q]);
    ok(&database, &["limit", &q, "--rate", "50/s"]);
    let messages: String = (0..MESSAGES).map(|i| format!("m{i}\n")).collect();
    let mut publish = rowbus();
    publish.args(["--database-url", &database.url, "publish", &q, "-"]);
    let (output, _) = common::run_with(publish, Some(messages.as_bytes()), common::RUN_TIMEOUT);
    assert!(output.status.success(), "{}", show(&output));

    let log = std::env::temp_dir().join(format!("{q}.starts"));
    let _ = std::fs::remove_file(&log);
    let exec = format!("echo \"$(date +%s%N)\" >> {}", log.display());
    let mut consumers: Vec<Running> = (0..3)
        .map(|_| {
            let mut cmd = rowbus();
            cmd.args(["--database-url", &database.url, "consume", &q, "--workers", "8", "--exec", &exec]);
            let mut consumer = Running::spawn(cmd, Duration::from_secs(15));
            consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
            consumer
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut starts = loop {
        let starts: Vec<u128> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect();
        if starts.len() >= MESSAGES {
            break starts;
        }
        assert!(Instant::now() < deadline, "{MESSAGES} messages not handled within 90 s: {}", starts.len());
        std::thread::sleep(Duration::from_millis(100));
    };
    for consumer in &mut consumers {
        let (status, _, stderr) = consumer.stop("INT");
        assert!(status.success(), "{status} {stderr:?}");
    }
    let _ = std::fs::remove_file(&log);
    starts.sort_unstable();
    const SECOND: u128 = 1_000_000_000;
    let most =
        (0..starts.len()).map(|i| starts[i..].iter().take_while(|&&t| t < starts[i] + SECOND).count()).max();
    assert!(most <= Some(50), "{most:?} commands started within one second under 50/s");
    let took = starts[starts.len() - 1] - starts[0];
    assert!(took >= 11 * SECOND, "{MESSAGES} starts at 50/s took only {} ms", took / 1_000_000);
}
on_each_database!(three_processes_keep_to_a_rate);
