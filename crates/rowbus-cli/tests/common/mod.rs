//! Shared by the CLI's end-to-end tests: the servers, unique names, the guard that drops
//! what a test made, running the `rowbus` binary with deadlines, reading a running one's
//! output line by line, and checking the errors it reports.
#![allow(dead_code)]

#[path = "../../../rowbus/tests/common/bouncer.rs"]
pub mod bouncer;
#[path = "../../../rowbus/tests/common/cleanup.rs"]
mod cleanup;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

#[allow(unused_imports)]
pub use cleanup::{Cleanup, MARIADB_URL, PG_URL, queue_tables, queue_tables_on};
use rowbus::Backend;

/// How long a one-shot command (`deploy`, `notify`, `publish`...) may run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a running command may take to print its next line.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `scenario(Kind)` as one test per database, named after the database in a module
/// named after the scenario (`scenario::postgres`, `scenario::mariadb`, `scenario::sqlite`);
/// `on a, b` names the databases it runs on when not all three.
macro_rules! on_each_database {
    (@kind postgres) => { crate::common::Kind::Postgres };
    (@kind mariadb) => { crate::common::Kind::MariaDb };
    (@kind sqlite) => { crate::common::Kind::Sqlite };
    ($scenario:ident) => {
        crate::common::on_each_database!($scenario on postgres, mariadb, sqlite);
    };
    ($scenario:ident on $($database:ident),+) => {
        mod $scenario {
            $(
                #[test]
                fn $database() {
                    super::$scenario(crate::common::on_each_database!(@kind $database));
                }
            )+
        }
    };
}
pub(crate) use on_each_database;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A name no other test (nor another run of this file) uses: `name_<tag><pid>_<n>`, the
/// tag being the run's (`ROWBUS_TEST_RUN`, set by `scripts/test.sh`), or none.
pub fn unique(name: &str) -> String {
    format!("{name}_{}{}_{}", cleanup::run_tag(), std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// The binary, with none of the caller's DATABASE_URL or RUST_LOG, backtraces on (so that
/// a panic would show), run in the temp directory so the default URL never lands in the tree.
pub fn rowbus() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rowbus"));
    cmd.env_remove("DATABASE_URL")
        .env_remove("ROWBUS_LISTEN_URL")
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null());
    cmd
}

/// The command line, shortened, for messages.
pub fn describe(cmd: &Command) -> String {
    let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
    let mut text = format!("rowbus {}", args.join(" "));
    if text.len() > 300 {
        let mut end = 300;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// Bytes as (lossy) text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A finished process's status and output, for messages.
pub fn show(output: &Output) -> String {
    format!(
        "status {}\n--- stdout ---\n{}--- stderr ---\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    )
}

/// Waits for `child` to exit for at most `timeout`.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a rowbus process") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Reads a pipe to its end on a thread.
pub fn read_all(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// Runs `cmd` to completion (at most [`RUN_TIMEOUT`]), stdin empty.
pub fn run(cmd: Command) -> Output {
    run_with(cmd, None, RUN_TIMEOUT).0
}

/// Runs `cmd` to completion (at most `timeout`), `input` on its stdin; returns its output
/// and pid.
pub fn run_with(mut cmd: Command, input: Option<&[u8]>, timeout: Duration) -> (Output, u32) {
    let what = describe(&cmd);
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
    let pid = child.id();
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("piped stdin");
        let input = input.to_vec();
        thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    let stdout = read_all(child.stdout.take().expect("piped stdout"));
    let stderr = read_all(child.stderr.take().expect("piped stderr"));
    let Some(status) = wait_timeout(&mut child, timeout) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("`{what}` did not finish within {timeout:?}");
    };
    let output = Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    };
    (output, pid)
}

/// Runs `cmd` (with `input` on stdin), which must succeed without a word on stderr; its
/// stdout. `server` names the database in the message.
pub fn run_quietly(cmd: Command, input: Option<&[u8]>, server: &str) -> String {
    let what = describe(&cmd);
    let (output, _) = run_with(cmd, input, RUN_TIMEOUT);
    assert!(
        output.status.success() && output.stderr.is_empty(),
        "`{what}` on {server} did not succeed quietly (is the server up? scripts/services.sh starts it)\n{}",
        show(&output)
    );
    text(&output.stdout)
}

/// Asserts a failure the way the CLI reports one: exit status 1, nothing on stdout, and
/// exactly one stderr line `rowbus: error: ...` (no panic, no backtrace). Returns the line.
pub fn assert_error(output: &Output, what: &str) -> String {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{what}: expected exit status 1\n{}", show(output));
    assert!(!stderr.contains("panicked"), "{what}: the binary panicked\n{}", show(output));
    assert!(!stderr.to_lowercase().contains("backtrace"), "{what}: a backtrace\n{}", show(output));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: expected exactly one stderr line\n{}", show(output));
    assert!(stderr.ends_with('\n'), "{what}: the error line is not terminated\n{}", show(output));
    assert!(lines[0].starts_with("rowbus: error: "), "{what}: not a `rowbus: error:` line\n{}", show(output));
    assert!(output.stdout.is_empty(), "{what}: unexpected stdout\n{}", show(output));
    lines[0].to_owned()
}

/// Asserts `text` contains every one of `needles`.
pub fn assert_mentions(text: &str, needles: &[&str], what: &str) {
    for needle in needles {
        assert!(text.contains(needle), "{what}: expected {needle:?} in:\n{text}");
    }
}

/// The databases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// PostgreSQL at 127.0.0.1:5432.
    Postgres,
    /// MariaDB at 127.0.0.1:3306.
    MariaDb,
    /// A temporary SQLite file.
    Sqlite,
}

impl Kind {
    /// The database rowbus sees.
    pub fn backend(self) -> Backend {
        match self {
            Kind::Postgres => Backend::Postgres,
            Kind::MariaDb => Backend::MySql,
            Kind::Sqlite => Backend::Sqlite,
        }
    }
}

/// One test's database: its URL, and the guard that drops the tables the test registers
/// with it and, on SQLite, deletes the file of the test's own.
pub struct Database {
    pub kind: Kind,
    pub url: String,
    pub cleanup: Cleanup,
    sqlite_file: Option<PathBuf>,
}

impl Database {
    /// `name` names the SQLite file.
    pub fn new(kind: Kind, name: &str) -> Database {
        let cleanup = Cleanup::new(kind.backend());
        let (url, sqlite_file) = match kind {
            Kind::Postgres => (PG_URL.to_owned(), None),
            Kind::MariaDb => (MARIADB_URL.to_owned(), None),
            Kind::Sqlite => {
                let file = std::env::temp_dir().join(format!("rowbus_{name}.sqlite"));
                cleanup.sqlite_file(&file);
                (format!("sqlite://{}", file.display()), Some(file))
            }
        };
        Database { kind, url, cleanup, sqlite_file }
    }

    /// The SQLite file (`None` off SQLite).
    pub fn sqlite_file(&self) -> Option<&Path> {
        self.sqlite_file.as_deref()
    }

    /// The paths SQLite may make beside its file: the file itself, `-wal`, `-shm` and
    /// `-journal` (none off SQLite).
    pub fn sqlite_files(&self) -> Vec<PathBuf> {
        let Some(file) = &self.sqlite_file else { return Vec::new() };
        ["", "-wal", "-shm", "-journal"]
            .iter()
            .map(|suffix| {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                PathBuf::from(path)
            })
            .collect()
    }

    /// The server, for messages.
    pub fn server(&self) -> &'static str {
        match self.kind {
            Kind::Postgres => "PostgreSQL at 127.0.0.1:5432",
            Kind::MariaDb => "MariaDB at 127.0.0.1:3306",
            Kind::Sqlite => "SQLite",
        }
    }

    /// Runs `sql` with the database's own client (`psql`, `mariadb`, `sqlite3`), printing
    /// nothing but rows, one a line, columns tab-separated; `Err` with what it said when it
    /// fails or cannot start.
    pub fn client(&self, sql: &str) -> Result<String, String> {
        let mut cmd = match self.kind {
            Kind::Postgres => {
                let mut cmd = Command::new("psql");
                cmd.args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-d",
                    "test",
                    "-q",
                    "-tA",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-c",
                ]);
                cmd
            }
            Kind::MariaDb => {
                let mut cmd = Command::new("mariadb");
                cmd.args(["-h127.0.0.1", "-P3306", "-uroot", "test", "-N", "-B", "-e"]);
                cmd
            }
            Kind::Sqlite => {
                let mut cmd = Command::new("sqlite3");
                cmd.arg("-bail").arg(self.sqlite_file.as_ref().expect("a SQLite file"));
                cmd
            }
        };
        match cmd.arg(sql).stdin(Stdio::null()).output() {
            Ok(out) if out.status.success() => Ok(text(&out.stdout)),
            Ok(out) => Err(text(&out.stderr)),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Runs `sql` with [`Database::client`]; panics when it fails.
    pub fn exec(&self, sql: &str) -> String {
        self.client(sql).unwrap_or_else(|e| panic!("`{sql}` on {} failed: {e}", self.server()))
    }

    /// Whether table `name` exists (where an unqualified name resolves).
    pub fn table_exists(&self, name: &str) -> bool {
        let sql = match self.kind {
            Kind::Postgres => format!("SELECT to_regclass('{name}') IS NOT NULL"),
            Kind::MariaDb => format!(
                "SELECT COUNT(*) = 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '{name}'"
            ),
            Kind::Sqlite => {
                format!("SELECT COUNT(*) = 1 FROM sqlite_master WHERE type = 'table' AND name = '{name}'")
            }
        };
        matches!(self.exec(&sql).trim(), "t" | "1")
    }

    /// Drops `tables` on PostgreSQL or MariaDB, best effort: they may never have been
    /// created. Nothing on SQLite, whose file goes whole.
    pub fn drop_tables(&self, tables: &[String]) {
        if tables.is_empty() || self.kind == Kind::Sqlite {
            return;
        }
        let quoted: Vec<String> = match self.kind {
            Kind::MariaDb => tables.iter().map(|t| format!("`{t}`")).collect(),
            _ => tables.to_vec(),
        };
        if let Err(e) = self.client(&format!("DROP TABLE IF EXISTS {}", quoted.join(", "))) {
            eprintln!("cannot drop {tables:?}: {e}");
        }
    }
}

/// A pipe's lines, read on a thread.
pub fn read_lines(pipe: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Every line until the reader hangs up (the pipe closed), each within `within`.
pub fn drain(lines: &Receiver<String>, within: Duration) -> Vec<String> {
    let mut all = Vec::new();
    loop {
        match lines.recv_timeout(within) {
            Ok(line) => all.push(line),
            Err(RecvTimeoutError::Disconnected) => return all,
            Err(RecvTimeoutError::Timeout) => panic!("a pipe stayed open after its process exited"),
        }
    }
}

/// A running process (`listen`, `consume`, `demo`), its stdout and stderr read line by
/// line. Killed when dropped.
pub struct Running {
    child: Child,
    pub what: String,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
    stderr_seen: Vec<String>,
    /// How long it may take to exit after SIGINT/SIGTERM.
    exit_timeout: Duration,
}

impl Running {
    /// Starts `cmd`, which must exit within `exit_timeout` of a signal.
    pub fn spawn(mut cmd: Command, exit_timeout: Duration) -> Running {
        let what = describe(&cmd);
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
        let stdout = read_lines(child.stdout.take().expect("piped stdout"));
        let stderr = read_lines(child.stderr.take().expect("piped stderr"));
        Running { child, what, stdout, stderr, stderr_seen: Vec::new(), exit_timeout }
    }

    /// Waits (at most `timeout`) for the stderr line that `is_it`; returns it. `saying`
    /// names it in messages.
    pub fn await_stderr(&mut self, saying: &str, timeout: Duration, is_it: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            match self.stderr.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    let done = is_it(&line);
                    self.stderr_seen.push(line.clone());
                    if done {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.die(&format!("did not say `{saying}` within {timeout:?}"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = wait_timeout(&mut self.child, self.exit_timeout);
                    self.die(&format!("exited ({status:?}) before saying `{saying}`"))
                }
            }
        }
    }

    /// Panics with `message` about this process and the stderr it printed so far.
    pub fn die(&mut self, message: &str) -> ! {
        while let Ok(line) = self.stderr.try_recv() {
            self.stderr_seen.push(line);
        }
        panic!("`{}`: {message}\n--- stderr so far ---\n{}", self.what, self.stderr_seen.join("\n"))
    }

    /// The next stdout line, within [`LINE_TIMEOUT`].
    pub fn next_line(&mut self, waiting_for: &str) -> String {
        match self.stdout.recv_timeout(LINE_TIMEOUT) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                self.die(&format!("no line within {LINE_TIMEOUT:?}, waiting for {waiting_for}"))
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.die(&format!("stdout closed, waiting for {waiting_for}"))
            }
        }
    }

    /// Asserts it prints no stdout line for `quiet`; `why` says why it must not.
    pub fn no_line(&mut self, quiet: Duration, why: &str) {
        match self.stdout.recv_timeout(quiet) {
            Ok(line) => self.die(&format!("printed {line:?}, though {why}")),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => self.die(&format!("stdout closed, though {why}")),
        }
    }

    /// Waits (at most `timeout`) for it to exit by itself; its status and stderr lines.
    pub fn wait_exit(&mut self, timeout: Duration) -> (ExitStatus, Vec<String>) {
        let Some(status) = wait_timeout(&mut self.child, timeout) else {
            self.die(&format!("did not exit by itself within {timeout:?}"))
        };
        let more = drain(&self.stderr, self.exit_timeout);
        self.stderr_seen.extend(more);
        (status, self.stderr_seen.clone())
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`INT`, `TERM`) and waits (at most its exit timeout) for the process
    /// to exit; returns its status, the stdout lines it printed but were not read, and all
    /// of its stderr lines.
    pub fn stop(&mut self, signal: &str) -> (ExitStatus, Vec<String>, Vec<String>) {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill").arg(format!("-{signal}")).arg(&pid).status().expect("running kill");
        assert!(killed.success(), "kill -{signal} {pid} failed");
        let sent = Instant::now();
        let (status, rest, stderr) = self.finish(self.exit_timeout, &format!(" of SIG{signal}"));
        eprintln!("`{}` exited {:?} after SIG{signal}", self.what, sent.elapsed());
        (status, rest, stderr)
    }

    /// Waits (at most `timeout`) for the process to exit by itself; returns what
    /// [`Running::stop`] does.
    pub fn wait(&mut self, timeout: Duration) -> (ExitStatus, Vec<String>, Vec<String>) {
        self.finish(timeout, "")
    }

    /// Waits at most `timeout` (`since` says since what, for the message) for the exit,
    /// then reads what is left of the pipes.
    fn finish(&mut self, timeout: Duration, since: &str) -> (ExitStatus, Vec<String>, Vec<String>) {
        let Some(status) = wait_timeout(&mut self.child, timeout) else {
            self.die(&format!("did not exit within {timeout:?}{since}"))
        };
        // The pipes close with the process: the readers then hang up.
        let rest = drain(&self.stdout, self.exit_timeout);
        let more = drain(&self.stderr, self.exit_timeout);
        self.stderr_seen.extend(more);
        (status, rest, self.stderr_seen.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
