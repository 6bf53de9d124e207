//! End-to-end tests of the CLI through PgBouncer in transaction pooling mode
//! (`--database-url ...?pgbouncer=true`): a PgBouncer of the test's own in front of the
//! test PostgreSQL server, two server connections shared by every client. `deploy`,
//! `publish`, `consume`, `stats`, `dead list`, `notify` through it; `listen` and
//! `consume --listen-notify` on a direct `--listen-url`, and refused without one.
//!
//! PgBouncer must be installed (scripts/services.sh installs it): the tests fail without
//! it, they do not skip.

#[allow(unused_macros, unused_imports)]
mod common;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::bouncer::PgBouncer;
use common::{
    Cleanup, LINE_TIMEOUT, PG_URL, Running, assert_error, assert_mentions, rowbus, run, run_quietly, show,
    text, unique,
};
use rowbus::Backend;
use serde_json::Value;

/// The CLI on a PgBouncer of its own, and one queue table dropped at the end.
struct Pooled {
    queue: String,
    bouncer: PgBouncer,
    cleanup: Cleanup,
}

impl Pooled {
    fn new() -> Pooled {
        let cleanup = Cleanup::new(Backend::Postgres);
        let queue = cleanup.queue(&unique("bouncer_cli"));
        Pooled { queue, bouncer: PgBouncer::start(), cleanup }
    }

    fn url(&self) -> String {
        format!("{}?pgbouncer=true", self.bouncer.url())
    }

    /// `rowbus --database-url POOLED ARGS...`
    fn rowbus(&self, args: &[&str]) -> Command {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &self.url()]).args(args);
        cmd
    }

    /// `rowbus --database-url POOLED --listen-url DIRECT ARGS...`
    fn listening(&self, args: &[&str]) -> Command {
        let mut cmd = self.rowbus(&["--listen-url", PG_URL]);
        cmd.args(args);
        cmd
    }

    fn ok(&self, cmd: Command) -> String {
        run_quietly(cmd, None, "PostgreSQL through PgBouncer")
    }

    /// The queue's line of `stats --json` (its default group).
    fn stats(&self) -> Value {
        let stats: Value =
            serde_json::from_str(&self.ok(self.rowbus(&["stats", "--json", &self.queue]))).unwrap();
        stats["queues"].as_array().expect("a queues array").first().cloned().unwrap_or(Value::Null)
    }
}

#[test]
fn queue_commands_work_through_transaction_pooling() {
    let p = Pooled::new();
    p.ok(p.rowbus(&["deploy", "--queue", &p.queue]));

    // Without a direct URL, a publish works and says that it wakes no one.
    let out = run(p.rowbus(&["publish", &p.queue, "first"]));
    assert!(out.status.success(), "{}", show(&out));
    assert_mentions(&text(&out.stderr), &["not woken", "--listen-url"], "publish without --listen-url");
    // Publishes from several processes at once share the two server connections.
    let publishers: Vec<_> = (0..4)
        .map(|i| {
            let cmd = p.listening(&["publish", &p.queue, &format!("m{i}")]);
            thread::spawn(move || run(cmd))
        })
        .collect();
    for publisher in publishers {
        let out = publisher.join().unwrap();
        assert!(out.status.success() && out.stderr.is_empty(), "{}", show(&out));
    }
    let stats = p.stats();
    assert_eq!((stats["ready"].as_i64(), stats["depth"].as_i64()), (Some(5), Some(5)), "{stats}");

    // Two consumers drain it.
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let mut c =
                Running::spawn(p.rowbus(&["consume", &p.queue, "--workers", "2"]), Duration::from_secs(15));
            c.await_stderr("consuming", LINE_TIMEOUT, |l| l.starts_with("rowbus: consuming "));
            c
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.stats()["depth"].as_i64() != Some(0) {
        assert!(Instant::now() < deadline, "not drained within 20 s: {}", p.stats());
        thread::sleep(Duration::from_millis(100));
    }
    let mut handled = Vec::new();
    for mut consumer in consumers {
        let (status, rest, stderr) = consumer.stop("INT");
        assert!(status.success(), "{stderr:#?}");
        handled.extend(rest);
    }
    let mut payloads: Vec<_> = handled.iter().map(|l| l.rsplit(' ').next().unwrap().to_owned()).collect();
    payloads.sort();
    assert_eq!(payloads, ["first", "m0", "m1", "m2", "m3"], "{handled:#?}");

    // A failing handler's message goes to the dead letters, listed through the pool.
    p.ok(p.listening(&["publish", &p.queue, "doomed"]));
    let failing = ["consume", &p.queue, "--exec", "exit 3", "--max-attempts", "1"];
    let mut consumer = Running::spawn(p.rowbus(&failing), Duration::from_secs(15));
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let list = p.ok(p.rowbus(&["dead", "list", &p.queue, "--json"]));
        if !list.is_empty() {
            break list;
        }
        assert!(Instant::now() < deadline, "not dead-lettered within 20 s");
        thread::sleep(Duration::from_millis(100));
    };
    consumer.stop("INT");
    let dead: Value = serde_json::from_str(dead.lines().next().unwrap()).unwrap();
    assert_eq!(dead["payload"], "doomed", "{dead}");
    assert_eq!(p.stats()["dead"].as_i64(), Some(1));
    drop(p.cleanup);
}

#[test]
fn listening_takes_the_direct_url() {
    let p = Pooled::new();
    p.ok(p.rowbus(&["deploy", "--queue", &p.queue]));
    let channel = unique("bouncer_ch");

    // Refused through the pool, naming the flag that fixes it.
    let line = assert_error(&run(p.rowbus(&["listen", &channel])), "listen through PgBouncer");
    assert_mentions(&line, &["session", "--listen-url", "ROWBUS_LISTEN_URL"], "listen through PgBouncer");
    let line = assert_error(
        &run(p.rowbus(&["consume", &p.queue, "--listen-notify"])),
        "consume --listen-notify through PgBouncer",
    );
    assert_mentions(&line, &["session", "--listen-url"], "consume --listen-notify through PgBouncer");

    // `notify` through the pool reaches a `listen` on the direct URL.
    let mut listener = Running::spawn(p.listening(&["listen", &channel]), Duration::from_secs(15));
    listener.await_stderr("listening", LINE_TIMEOUT, |l| l.starts_with("rowbus: listening on"));
    p.ok(p.rowbus(&["notify", &channel, "hello"]));
    let line = listener.next_line("the notification");
    assert!(line.ends_with("hello"), "{line}");
    listener.stop("INT");

    // A consumer that polls every ten minutes gets a publish at once: woken through the direct URL,
    // by a publish that sent its wake-up through the pool.
    let mut env = p.rowbus(&["consume", &p.queue, "--listen-notify", "--poll-interval", "10m"]);
    env.env("ROWBUS_LISTEN_URL", PG_URL);
    let mut consumer = Running::spawn(env, Duration::from_secs(15));
    consumer.await_stderr("consuming", LINE_TIMEOUT, |l| l.starts_with("rowbus: consuming "));
    // Its first claim (which found nothing) is behind it.
    thread::sleep(Duration::from_millis(500));
    p.ok(p.listening(&["publish", &p.queue, "wake"]));
    let line = consumer.next_line("the woken consumer's message");
    assert!(line.ends_with("wake"), "{line}");
    consumer.stop("INT");
}

/// Without `?pgbouncer=true`, the driver's prepared statements of one client meet another's
/// on the shared server connections, and PostgreSQL refuses them (`prepared statement
/// "sqlx_s_1" already exists`): the error line says which parameter fixes the URL.
#[test]
fn a_url_without_the_parameter_is_told_how_to_fix_it() {
    let p = Pooled::new();
    p.ok(p.rowbus(&["deploy", "--queue", &p.queue]));
    let bare = p.bouncer.url();
    let mut failures = Vec::new();
    // Two server connections: by the third process, every one of them holds the first
    // prepared statement of an earlier client.
    for i in 0..6 {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &bare, "publish", &p.queue, &format!("m{i}")]);
        let out = run(cmd);
        if !out.status.success() {
            failures.push(assert_error(&out, "publish through PgBouncer without pgbouncer=true"));
        }
    }
    assert!(!failures.is_empty(), "every publish through the pool without the parameter succeeded");
    for line in &failures {
        assert_mentions(line, &["sqlx_s_", "?pgbouncer=true"], "publish without pgbouncer=true");
    }
}

/// The warning that consumers elsewhere are not woken comes from the commands whose work
/// needed a wake-up, not from those that never send one: `limit --list`, a `cancel` of
/// messages nobody runs.
#[test]
fn commands_that_wake_no_one_do_not_warn() {
    let p = Pooled::new();
    p.ok(p.rowbus(&["deploy", "--queue", &p.queue]));
    p.ok(p.listening(&["publish", &p.queue, "waiting"]));
    for args in [&["limit", "--list"][..], &["limit", &p.queue, "--list"], &["cancel", &p.queue, "--all"]] {
        let out = run(p.rowbus(args));
        assert!(out.status.success() && out.stderr.is_empty(), "`rowbus {}`\n{}", args.join(" "), show(&out));
    }
    // One that changes what consumers may take still says so.
    let out = run(p.rowbus(&["limit", &p.queue, "--max-running", "2"]));
    assert!(out.status.success(), "{}", show(&out));
    assert_mentions(&text(&out.stderr), &["not woken", "--listen-url"], "limit --max-running");
}
