//! End-to-end tests of the `rowbus` binary: real processes against real PostgreSQL, MariaDB and SQLite.
//!
//! The servers must be up (`scripts/services.sh` starts them); a test fails, never skips, when one
//! is unreachable. Every test uses its own notify table and channel names, so they run in parallel.

mod common;

use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    Database, Kind, PG_URL, RUN_TIMEOUT, Running, assert_error, assert_mentions, on_each_database, read_all,
    rowbus, run, run_with, show, text, unique,
};
use serde_json::Value;

/// How long a listener may take to print `listening on`.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a listener may take to exit after SIGINT/SIGTERM.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// One test's database and its own notify table, dropped (MariaDB) or deleted with the
/// SQLite file at the end, also when the test fails.
struct Db {
    database: Database,
    table: String,
}

impl Db {
    fn new(kind: Kind, test: &str) -> Db {
        let table = unique(&format!("cli_{test}"));
        let database = Database::new(kind, &table);
        database.cleanup.notify_table(&table);
        Db { database, table }
    }

    /// The notify-table flags of this test (a fast poll).
    fn table_args(&self) -> Vec<String> {
        ["--notify-table", &self.table, "--poll-interval", "0.05"].map(str::to_owned).to_vec()
    }

    /// `rowbus --database-url URL <notify-table flags> ARGS...`
    fn rowbus(&self, args: &[&str]) -> Command {
        let mut cmd = rowbus();
        cmd.arg("--database-url").arg(&self.database.url).args(self.table_args()).args(args);
        cmd
    }

    /// Runs `rowbus deploy` and asserts it succeeded; returns its stdout.
    fn deploy(&self) -> String {
        let output = run(self.rowbus(&["deploy"]));
        assert!(
            output.status.success(),
            "`rowbus deploy` failed on {} (is the server up? scripts/services.sh starts it)\n{}",
            self.database.server(),
            show(&output)
        );
        assert!(output.stderr.is_empty(), "`rowbus deploy` wrote to stderr\n{}", show(&output));
        let stdout = text(&output.stdout);
        match self.database.kind {
            Kind::Postgres => {
                assert_eq!(
                    stdout,
                    "PostgreSQL has LISTEN/NOTIFY built in: no notify table needed, nothing to do \
                     (durable listeners need one: `rowbus deploy --durable`)\n"
                );
            }
            Kind::MariaDb | Kind::Sqlite => {
                assert_eq!(stdout, format!("notify table `{}` is ready\n", self.table))
            }
        }
        stdout
    }

    /// Runs `rowbus notify CHANNEL [PAYLOAD]`, asserts it succeeded silently, returns its pid.
    fn notify(&self, channel: &str, payload: Option<&str>) -> u32 {
        let mut args = vec!["notify", channel];
        args.extend(payload);
        let (output, pid) = run_with(self.rowbus(&args), None, RUN_TIMEOUT);
        assert!(
            output.status.success() && output.stdout.is_empty() && output.stderr.is_empty(),
            "`rowbus notify {channel} {payload:?}` on {} did not succeed silently\n{}",
            self.database.server(),
            show(&output)
        );
        pid
    }

    /// Runs a command expected to fail; returns the error line.
    fn fail(&self, args: &[&str], what: &str) -> String {
        let output = run(self.rowbus(args));
        assert_error(&output, &format!("{what} on {}", self.database.server()))
    }
}

/// Starts `rowbus listen` and waits until it says `rowbus: listening on CHANNELS`.
fn listen(cmd: Command, channels: &[&str]) -> Running {
    let mut listener = Running::spawn(cmd, EXIT_TIMEOUT);
    let line = listener.await_stderr("listening on", LISTEN_TIMEOUT, |line| line.contains("listening on"));
    let expected = format!("rowbus: listening on {}", channels.join(", "));
    assert_eq!(line, expected, "`{}`: unexpected announcement", listener.what);
    listener
}

/// Asserts a listener that was stopped by a signal exited 0, printed nothing more and
/// nothing but its announcement on stderr.
fn assert_clean_exit(stopped: (ExitStatus, Vec<String>, Vec<String>), signal: &str) {
    let (status, rest, stderr) = stopped;
    assert!(
        status.success(),
        "the listener exited with {status} after SIG{signal}; stderr:\n{}",
        stderr.join("\n")
    );
    assert!(rest.is_empty(), "unexpected stdout lines (a channel not listened on?): {rest:#?}");
    assert_eq!(stderr.len(), 1, "unexpected stderr lines: {stderr:#?}");
}

/// A payload with a newline, both quotes, a backslash, a tab and non-ASCII text.
const TRICKY: &str = "line one\nline \"two\" isn't \\ done\tyet: héllo ✓";

/// Deploy, `listen --json CH1 CH2`, notifications on both channels and on one not listened
/// on, SIGINT.
fn listen_json_prints_one_object_per_notification(kind: Kind) {
    let db = Db::new(kind, "json");
    db.deploy();
    // Deploying twice is fine.
    db.deploy();
    let ch1 = unique("json_ch1");
    let ch2 = unique("json_ch2");
    let other = unique("json_other");
    let mut listener = listen(db.rowbus(&["listen", "--json", &ch1, &ch2]), &[&ch1, &ch2]);

    let sends: [(&str, Option<&str>); 6] = [
        (&ch1, Some("hello")),
        (&ch2, Some("two words")),
        (&ch1, Some(TRICKY)),
        (&other, Some("x")),
        (&ch2, None),
        (&ch1, Some("last")),
    ];
    let mut expected = Vec::new();
    for (channel, payload) in sends {
        let pid = db.notify(channel, payload);
        if channel != other {
            expected.push((channel, payload.unwrap_or(""), pid));
        }
    }

    for (channel, payload, notifier_pid) in expected {
        let line = listener.next_line(&format!("{channel}: {payload:?}"));
        let value: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        let object = value.as_object().unwrap_or_else(|| panic!("not a JSON object: {line}"));
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["channel", "payload", "pid"], "{line}");
        assert_eq!(object["channel"], channel, "{line}");
        assert_eq!(object["payload"], payload, "{line}");
        let pid = object["pid"].as_u64().unwrap_or_else(|| panic!("pid is not a number: {line}"));
        assert!(pid > 0, "{line}");
        if kind == Kind::Sqlite {
            // On SQLite the pid is the notifying process's id.
            assert_eq!(pid, u64::from(notifier_pid), "{line}");
        }
        assert!(!line.contains('\n'));
    }

    assert_clean_exit(listener.stop("INT"), "INT");
}
on_each_database!(listen_json_prints_one_object_per_notification);

/// The plain format: `channel: payload`, the payload as sent (quotes, backslashes and tabs
/// too) but for its line breaks and control characters, escaped onto one line; SIGTERM.
fn listen_prints_each_payload_as_sent_on_one_line(kind: Kind) {
    let db = Db::new(kind, "plain");
    db.deploy();
    let ch = unique("plain");
    let other = unique("plain_other");
    let mut listener = listen(db.rowbus(&["listen", &ch]), &[&ch]);
    for (channel, payload) in [
        (&ch, Some("hello world")),
        (&other, Some("x")),
        (&ch, Some(TRICKY)),
        (&ch, Some("a\r\u{1b}b")),
        (&ch, None),
    ] {
        db.notify(channel, payload);
    }
    assert_eq!(listener.next_line("hello world"), format!("{ch}: hello world"));
    let escaped = listener.next_line("the tricky payload");
    assert_eq!(escaped, format!("{ch}: line one\\nline \"two\" isn't \\ done\tyet: héllo ✓"));
    assert_eq!(listener.next_line("the control characters"), format!("{ch}: a\\r\\u{{1b}}b"));
    assert_eq!(listener.next_line("the empty payload"), format!("{ch}: "));
    assert_clean_exit(listener.stop("TERM"), "TERM");
}
on_each_database!(listen_prints_each_payload_as_sent_on_one_line);

/// `bash -c SCRIPT`, whose `"$@"` is `rowbus --database-url PG_URL listen CHANNEL`, with
/// none of the caller's DATABASE_URL or RUST_LOG.
fn bash_around_listen(script: &str, channel: &str) -> Command {
    let rowbus = env!("CARGO_BIN_EXE_rowbus");
    let mut cmd = Command::new("bash");
    cmd.args(["-c", script, "bash", rowbus, "--database-url", PG_URL, "listen", channel])
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    cmd
}

/// SIGINT sent the moment `listening on` shows must still end the listener with status 0:
/// the signal handlers must be in place before the announcement. The window is narrow, so
/// bash (which reacts faster than spawning `kill` from here) runs many rounds.
#[test]
fn sigint_right_after_listening_exits_0() {
    const ROUNDS: usize = 80;
    let ch = unique("early");
    let script = r#"
        for _ in $(seq 1 "$ROUNDS"); do
            coproc LISTENER { exec "$@" 2>&1; }
            pid=$LISTENER_PID
            IFS= read -r line <&"${LISTENER[0]}"
            kill -INT "$pid"
            wait "$pid"
            echo "rc=$? $line"
        done
    "#;
    let mut cmd = bash_around_listen(script, &ch);
    cmd.env("ROUNDS", ROUNDS.to_string());
    let (output, _) = run_with(cmd, None, Duration::from_secs(50));
    assert!(output.status.success(), "the bash driver failed\n{}", show(&output));
    let stdout = text(&output.stdout);
    let rounds: Vec<&str> = stdout.lines().collect();
    assert_eq!(rounds.len(), ROUNDS, "{}", show(&output));
    let announced = format!("rowbus: listening on {ch}");
    for round in &rounds {
        assert!(round.ends_with(&announced), "a round did not start listening (is PostgreSQL up?): {round}");
    }
    let failed: Vec<&&str> = rounds.iter().filter(|r| !r.starts_with("rc=0 ")).collect();
    assert!(
        failed.is_empty(),
        "{} of {ROUNDS} listeners did not exit 0 on SIGINT: {failed:#?}",
        failed.len()
    );
}

/// `rowbus listen | head -1` ends quietly with status 0 once `head` has gone: a closed
/// pipe is the reader's way to say "enough", not an error.
#[test]
fn a_closed_pipe_ends_listen_quietly() {
    let ch = unique("piped");
    let script = r#"
        set -o pipefail
        "$@" 2>listen.err | head -1
        echo "rc=$?"
        grep -v "listening on" listen.err || true
    "#;
    let dir = std::env::temp_dir().join(unique("pipe_dir"));
    let db = Db::new(Kind::Postgres, "piped");
    db.database.cleanup.dir(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = bash_around_listen(script, &ch);
    cmd.current_dir(&dir).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("bash");
    let stdout = read_all(child.stdout.take().unwrap());
    let stderr = read_all(child.stderr.take().unwrap());
    // Notify until the pipeline is over: the first line satisfies head, a later one finds
    // the pipe closed.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the pipeline did not end");
        db.notify(&ch, Some("one"));
        thread::sleep(Duration::from_millis(100));
    };
    let (out, err) = (text(&stdout.join().unwrap()), text(&stderr.join().unwrap()));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "bash: {status:?}\n{out}\n{err}");
    assert_eq!(out, format!("{ch}: one\nrc=0\n"), "stderr: {err}");
}

/// `DATABASE_URL` in the environment instead of `--database-url`; the flag wins over it.
#[test]
fn database_url_in_the_environment_works_and_the_flag_wins() {
    let db = Db::new(Kind::MariaDb, "env");
    let env_cmd = |args: &[&str]| {
        let mut cmd = rowbus();
        cmd.env("DATABASE_URL", &db.database.url).args(db.table_args()).args(args);
        cmd
    };
    let deployed = run(env_cmd(&["deploy"]));
    assert!(
        deployed.status.success(),
        "deploy with DATABASE_URL failed (is MariaDB up?)\n{}",
        show(&deployed)
    );
    assert_eq!(text(&deployed.stdout), format!("notify table `{}` is ready\n", db.table));

    let ch = unique("env");
    let mut listener = listen(env_cmd(&["listen", "--json", &ch]), &[&ch]);

    let sent = run(env_cmd(&["notify", &ch, "from the environment"]));
    assert!(sent.status.success() && sent.stderr.is_empty(), "notify with DATABASE_URL\n{}", show(&sent));
    // A bad DATABASE_URL is overridden by the flag.
    let mut flagged = db.rowbus(&["notify", &ch, "from the flag"]);
    flagged.env("DATABASE_URL", "foo://not-used");
    let sent = run(flagged);
    assert!(
        sent.status.success() && sent.stderr.is_empty(),
        "--database-url over DATABASE_URL\n{}",
        show(&sent)
    );

    for payload in ["from the environment", "from the flag"] {
        let line = listener.next_line(payload);
        let value: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(value["channel"], ch.as_str(), "{line}");
        assert_eq!(value["payload"], payload, "{line}");
        assert!(value["pid"].is_u64(), "{line}");
    }
    assert_clean_exit(listener.stop("INT"), "INT");

    // And a bad DATABASE_URL alone is reported.
    let mut bad = rowbus();
    bad.env("DATABASE_URL", "foo://from-env").args(["notify", "x", "y"]);
    let output = run(bad);
    let line = assert_error(&output, "a bad DATABASE_URL");
    assert_mentions(&line, &["foo://from-env"], "a bad DATABASE_URL");
}

#[test]
fn a_url_of_an_unknown_scheme_is_refused_in_one_line() {
    for args in [&["deploy"][..], &["notify", "ch", "x"], &["listen", "ch"], &["listen", "--json", "a", "b"]]
    {
        let mut cmd = rowbus();
        cmd.args(["--database-url", "foo://x"]).args(args);
        let what = format!("foo://x, {args:?}");
        let output = run(cmd);
        let line = assert_error(&output, &what);
        assert_mentions(&line, &["invalid database URL", "foo://x"], &what);
    }
}

/// Runs `rowbus --database-url URL ARGS...` against a port nobody listens on and checks the
/// error; returns it and how long it took.
fn unreachable(url: &str, args: &[&str]) -> (String, Duration) {
    let mut cmd = rowbus();
    cmd.args(["--database-url", url]).args(args);
    let what = format!("{url}, {args:?}");
    let started = Instant::now();
    let output = run(cmd);
    let took = started.elapsed();
    let line = assert_error(&output, &what);
    assert_mentions(&line, &["cannot connect to", "127.0.0.1:1"], &what);
    (line, took)
}

#[test]
fn an_unreachable_server_fails_fast_and_names_it() {
    let cases: [(&str, &[&str]); 6] = [
        ("mysql://root@127.0.0.1:1/test", &["deploy"]),
        ("mysql://root@127.0.0.1:1/test", &["notify", "ch", "x"]),
        ("mysql://root@127.0.0.1:1/test", &["listen", "ch"]),
        ("postgres://postgres@127.0.0.1:1/test", &["deploy"]),
        ("postgres://postgres@127.0.0.1:1/test", &["notify", "ch", "x"]),
        ("postgres://postgres@127.0.0.1:1/test", &["listen", "ch"]),
    ];
    for (url, args) in cases {
        let (line, took) = unreachable(url, args);
        // The real cause, at once: not a pool's timeout after retrying.
        assert_mentions(&line, &["Connection refused"], &format!("{url}, {args:?}"));
        assert!(took < Duration::from_secs(10), "{url}, {args:?}: took {took:?}");
    }
}

/// Invalid channels, and payloads at and over the limit, on `kind`.
fn invalid_channels_and_oversized_payloads_are_refused(kind: Kind) {
    let db = Db::new(kind, "limits");
    db.deploy();

    // The empty channel.
    for args in [&["notify", "", "x"][..], &["listen", ""], &["listen", "ok", ""]] {
        let what = format!("an empty channel, {args:?}");
        let line = db.fail(args, &what);
        assert_mentions(&line, &["invalid channel", "empty"], &what);
    }

    // Too long a channel.
    let (fits, too_long, mention) = match kind {
        Kind::Postgres => ("c".repeat(63), "c".repeat(64), "64 bytes"),
        Kind::MariaDb | Kind::Sqlite => ("c".repeat(255), "c".repeat(256), "256 characters"),
    };
    for args in [&["notify", &too_long, "x"][..], &["listen", &too_long]] {
        let what = format!("a {}-character channel, {}", too_long.len(), args[0]);
        let line = db.fail(args, &what);
        assert_mentions(&line, &["invalid channel", mention], &what);
    }
    db.notify(&fits, Some("x"));
    if kind == Kind::Postgres {
        // Bytes, not characters: 32 two-byte characters are 64 bytes.
        let line = db.fail(&["notify", &"é".repeat(32), "x"], "a 64-byte channel");
        assert_mentions(&line, &["invalid channel", "64 bytes"], "a 64-byte channel");
    } else {
        // Characters, not bytes: 255 two-byte characters fit.
        db.notify(&"é".repeat(255), Some("x"));
    }

    // Payloads.
    let (fits, too_large, mention) = match kind {
        Kind::Postgres => ("p".repeat(7999), "p".repeat(8000), "8000 bytes"),
        Kind::MariaDb | Kind::Sqlite => ("p".repeat(65535), "p".repeat(65536), "65536 bytes"),
    };
    let ch = unique("limits");
    let line = db.fail(&["notify", &ch, &too_large], "too large a payload");
    assert_mentions(&line, &["payload too large", mention], "too large a payload");
    // The line names the size, not the payload.
    assert!(line.len() < 300, "the error line repeats the payload: {} bytes", line.len());
    db.notify(&ch, Some(&fits));
}
on_each_database!(invalid_channels_and_oversized_payloads_are_refused);

/// `listen --durable NAME` with an empty name or one too long: refused as the name, in
/// the flag's words, before connecting.
#[test]
fn a_bad_durable_name_is_refused_as_the_name() {
    let db = Db::new(Kind::Sqlite, "durname");
    db.deploy();
    let cases: [(String, &[&str]); 2] = [
        (String::new(), &["listen --durable NAME", "the name is empty"]),
        ("n".repeat(300), &["listen --durable NAME", "300 characters", "at most 255"]),
    ];
    for (name, mentions) in cases {
        let what = format!("listen --durable with a {}-character name", name.len());
        let line = db.fail(&["listen", "ch", "--durable", &name], &what);
        assert_mentions(&line, mentions, &what);
        assert!(!line.contains("channel") && line.len() < 200, "{what}: {line}");
    }
}

/// `listen` and `notify` before `deploy`.
fn listen_and_notify_before_deploy_say_to_deploy(kind: Kind) {
    let db = Db::new(kind, "missing");
    if let Some(file) = db.database.sqlite_file() {
        // An empty database: the file is there, the notify table is not.
        std::fs::File::create(file).expect("create an empty SQLite file");
    }
    let ch = unique("missing");
    for args in [&["notify", &ch, "x"][..], &["listen", &ch], &["listen", "--json", &ch]] {
        let what = format!("no notify table, {args:?}");
        let line = db.fail(args, &what);
        assert_mentions(&line, &["does not exist", "rowbus deploy", &format!("`{}`", db.table)], &what);
    }
}
on_each_database!(listen_and_notify_before_deploy_say_to_deploy on mariadb, sqlite);

/// On a missing SQLite file, every command but `deploy` (and `demo`) fails in one line that
/// names the file and `rowbus deploy`, and leaves no file behind; `deploy` creates it.
#[test]
fn only_deploy_creates_a_missing_sqlite_file() {
    let db = Db::new(Kind::Sqlite, "nofile");
    let path = db.database.sqlite_file().expect("a SQLite file").display().to_string();
    let q = unique("nofile_q");
    let commands: [&[&str]; 10] = [
        &["stats"],
        &["stats", "--json", &q],
        &["listen", "ch"],
        &["listen", "--json", "a", "b"],
        &["notify", "ch", "x"],
        &["publish", &q, "x"],
        &["consume", &q],
        &["consume", &q, "--listen-notify"],
        &["bench", "notify", "--samples", "1", "--duration", "0.1"],
        &["bench", "broker", "--messages", "10", "--rounds", "1", "--only", "publish1"],
    ];
    for args in commands {
        let what = format!("{args:?} on a missing file");
        let line = db.fail(args, &what);
        assert_mentions(&line, &[&path, "does not exist", "rowbus deploy"], &what);
        for file in db.database.sqlite_files() {
            assert!(!file.exists(), "{what}: {} was created", file.display());
        }
    }
    db.deploy();
    assert!(db.database.sqlite_file().unwrap().exists(), "deploy did not create {path}");
    let output = run(db.rowbus(&["stats", "--json"]));
    assert!(output.status.success(), "stats after deploy\n{}", show(&output));
}

#[test]
fn invalid_settings_are_refused_naming_the_setting() {
    let db = Db::new(Kind::Sqlite, "settings");
    let cases: [(&[&str], &str, &str); 7] = [
        (&["--poll-interval", "0"], "poll_interval", "0"),
        (&["--poll-interval", "soon"], "poll_interval", "soon"),
        (&["--lookback", "0"], "lookback", "0"),
        (&["--retention", "10"], "retention", "10"),
        (&["--cleanup-limit", "0"], "cleanup_limit", "0"),
        (&["--notify-table", "a;b"], "table", "a;b"),
        (&["--notify-table", ""], "table", ""),
    ];
    for (flags, setting, value) in cases {
        for command in [&["deploy"][..], &["notify", "ch", "x"], &["listen", "ch"]] {
            let mut cmd = rowbus();
            cmd.args(["--database-url", &db.database.url]).args(flags).args(command);
            let what = format!("{flags:?} {command:?}");
            let output = run(cmd);
            let line = assert_error(&output, &what);
            assert_mentions(&line, &[&format!("invalid `{setting}` = {value}")], &what);
        }
    }
    // Checked on PostgreSQL too, where the notify table is not used.
    let mut cmd = rowbus();
    cmd.args(["--database-url", PG_URL, "--retention", "10", "notify", "ch", "x"]);
    let output = run(cmd);
    let line = assert_error(&output, "--retention 10 on PostgreSQL");
    assert_mentions(&line, &["invalid `retention` = 10"], "--retention 10 on PostgreSQL");
}

/// `--help` lists the commands in the order a user meets them, and the notify table's
/// global flags under a heading of their own rather than among a command's flags.
#[test]
fn help_lists_commands_as_a_user_meets_them() {
    let mut cmd = rowbus();
    cmd.arg("--help");
    let output = run(cmd);
    assert!(output.status.success(), "{}", show(&output));
    let help = text(&output.stdout);
    let order = ["deploy", "publish", "consume", "listen", "notify", "stats", "demo", "bench"];
    let at: Vec<usize> = order
        .iter()
        .map(|c| help.find(&format!("\n  {c} ")).unwrap_or_else(|| panic!("{c} is listed:\n{help}")))
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "in the order {order:?}:\n{help}");

    let mut cmd = rowbus();
    cmd.args(["consume", "--help"]);
    let consume = text(&run(cmd).stdout);
    let heading = consume.find("Notify table (").expect("the notify table's heading");
    let own = consume.find("--workers").expect("consume's own flags");
    let notify_flag = consume.find("--poll-interval").expect("the notify table's flags");
    assert!(own < heading && heading < notify_flag, "{consume}");
}

/// What a missing table or file says names the command that makes it, never a library
/// function (`DbPool::connect_creating`, `DbPool::deploy_notify_table`, `Queue::deploy`).
fn errors_name_commands_not_library_functions(kind: Kind) {
    let db = Db::new(kind, "words");
    let ch = unique("words");
    let mut lines = Vec::new();
    match kind {
        // The positions table of durable listeners is made by `deploy --durable`.
        Kind::Postgres => {
            lines.push(db.fail(&["listen", "--durable", "n", &ch], "listen --durable before deploy"))
        }
        Kind::MariaDb | Kind::Sqlite => {
            if kind == Kind::Sqlite {
                lines.push(db.fail(&["stats"], "stats without the SQLite file"));
                std::fs::File::create(db.database.sqlite_file().unwrap()).unwrap();
            }
            lines.push(db.fail(&["listen", &ch], "listen before deploy"));
            lines.push(db.fail(&["notify", &ch, "x"], "notify before deploy"));
        }
    }
    for line in lines {
        assert!(line.contains("create it with `rowbus deploy"), "{line}");
        for library in ["DbPool", "Queue::", "connect_creating", "deploy_notify_table"] {
            assert!(!line.contains(library), "a library function named to a CLI user: {line}");
        }
    }
}
on_each_database!(errors_name_commands_not_library_functions);

/// `bench notify` measures at the broker's poll interval (50 ms) unless told otherwise,
/// says that the poll interval sets the latency, and works on a notify table of its own,
/// dropped at the end: nothing of it is left in the shared default table `rowbus_notify`.
/// On PostgreSQL, whose LISTEN needs no table, `--durable` uses one.
fn bench_notify_uses_a_table_of_its_own_at_the_broker_poll(kind: Kind) {
    let db = Db::new(kind, "bench");
    if kind == Kind::Sqlite {
        db.deploy(); // makes the file
    }
    let mut args = vec!["--database-url", db.database.url.as_str(), "bench", "notify"];
    args.extend(["--samples", "5", "--notifiers", "1", "--duration", "0.2"]);
    if kind == Kind::Postgres {
        args.push("--durable");
    }
    let mut json_args = args.clone();
    json_args.push("--json");
    for (args, json) in [(json_args, true), (args, false)] {
        let mut cmd = rowbus();
        cmd.args(&args);
        let (output, pid) = run_with(cmd, None, Duration::from_secs(60));
        let own = format!("rowbus_bench_{pid}");
        db.database.cleanup.notify_table(&own);
        // What it may have written into the shared default table, deleted (it made it).
        let left_in_default = match kind {
            Kind::Sqlite => 0,
            _ if !db.database.table_exists("rowbus_notify") => 0,
            _ => {
                let filter = format!("FROM rowbus_notify WHERE channel LIKE 'bench\\_{pid}\\_%'");
                let n: u64 = db.database.exec(&format!("SELECT COUNT(*) {filter}")).trim().parse().unwrap();
                db.database.exec(&format!("DELETE {filter}"));
                n
            }
        };
        assert!(output.status.success(), "{}", show(&output));
        assert_eq!(left_in_default, 0, "rows left in rowbus_notify\n{}", show(&output));
        assert!(!db.database.table_exists(&own), "{own} was not dropped\n{}", show(&output));
        assert!(!db.database.table_exists(&format!("{own}_positions")), "{}", show(&output));
        let stdout = text(&output.stdout);
        let poll = if kind == Kind::Postgres { 0.0 } else { 50.0 };
        if json {
            let results: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
            assert_eq!(results["poll_interval_ms"], poll, "{results}");
            assert_eq!(results["notify_table"], own.as_str(), "{results}");
            assert_eq!(results["notify_table_dropped"], true, "{results}");
        } else {
            assert_mentions(
                &stdout,
                &[&format!("notify table `{own}`: the run's own, dropped at the end")],
                "own",
            );
            match kind {
                // The shared MariaDB writes no binary log: the listener polls.
                Kind::MariaDb => assert_mentions(
                    &stdout,
                    &["polls the notify table every 50 ms", "--poll-interval sets it"],
                    "poll",
                ),
                // SQLite's listener is woken by a watch on the files, the poll its fallback.
                Kind::Sqlite => {
                    assert_mentions(&stdout, &["wake-ups: pushed by a watch on the database's files"], "push")
                }
                Kind::Postgres => {}
            }
        }
    }
}
on_each_database!(bench_notify_uses_a_table_of_its_own_at_the_broker_poll);

/// Asserts the right-aligned column `column` of the table whose header is `lines[0]` ends
/// where its header does on every row of it.
fn assert_aligned(lines: &[&str], column: &str, output: &str) {
    let end =
        lines[0].find(column).unwrap_or_else(|| panic!("no {column:?} in {:?}", lines[0])) + column.len();
    for row in &lines[1..] {
        let at = |i: usize| row.as_bytes().get(i).copied().unwrap_or(b' ');
        assert!(
            at(end - 1).is_ascii_digit() && at(end) == b' ',
            "{column:?} ends at {end} in the header, not in {row:?}:\n{output}"
        );
    }
}

/// `bench broker`'s tables fit their widest cells (a long scenario label, a slow poll's
/// wake-up), and its help promises no run time it cannot keep. The publishes that wake
/// other processes run, beside the ones they are compared with.
#[test]
fn bench_broker_tables_fit_their_cells() {
    let db = Db::new(Kind::Sqlite, "bbench");
    db.deploy();
    let mut cmd = rowbus();
    cmd.args(["--database-url", &db.database.url, "--notify-table", &db.table, "--poll-interval", "1s"]);
    let only = "publish1,publish1-wake,txpublish1,txpublish1-wake,keeptxbatch100,latency-remote";
    cmd.args(["bench", "broker", "--only", only, "--messages", "200"]);
    cmd.args(["--rounds", "1", "--latency-samples", "3"]);
    let output = run_with(cmd, None, Duration::from_secs(120)).0;
    assert!(output.status.success(), "{}", show(&output));
    let stdout = text(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let throughput = lines.iter().position(|l| l.starts_with("scenario")).expect("a throughput table");
    let latency = lines.iter().position(|l| l.starts_with("latency ")).expect("a latency table");
    assert_aligned(&lines[throughput..latency], "msgs/s", &stdout);
    for scenario in ["publish1-wake", "txpublish1 ", "txpublish1-wake"] {
        assert!(
            lines[throughput..latency].iter().any(|l| l.starts_with(scenario)),
            "no {scenario}:\n{stdout}"
        );
    }
    assert!(stdout.contains("% of txpublish1"), "txpublish1-wake is compared with txpublish1:\n{stdout}");
    assert_aligned(&lines[latency..latency + 2], "p50 ms", &stdout);
    assert_aligned(&lines[latency..latency + 2], "max ms", &stdout);
    let mut help = rowbus();
    help.args(["bench", "--help"]);
    let help = text(&run(help).stdout);
    assert!(help.contains("broker") && !help.contains("two minutes"), "{help}");
}
