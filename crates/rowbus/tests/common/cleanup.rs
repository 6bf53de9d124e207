//! A test's guard over what it makes: tables and PostgreSQL schemas in the `test`
//! databases, SQLite files and directories. Dropping the guard drops them, also when the
//! test panics, so that no run leaves anything behind for the next `rowbus stats` to list
//! (scripts/test.sh fails when one does).
//!
//! Shared, by `#[path]`, by the integration tests of rowbus, rowbus-cli and rowbus-chaos. A
//! `Drop` cannot await, and may run while the test's runtime is unwinding, so it drops
//! with the `psql` and `mariadb` clients (scripts/services.sh needs them too).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use rowbus::Backend;

/// The PostgreSQL server every test uses (scripts/services.sh starts it).
pub const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The MariaDB server every test uses.
pub const MARIADB_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// How long a drop waits for a lock: a failed test's sessions may still hold one for a
/// moment, and a guard must not hang the run on one that stays.
const LOCK_WAIT_SECS: u32 = 10;
/// How often a drop is tried before the guard says what it left.
const DROP_TRIES: u32 = 3;

/// What one test made, dropped with this guard. Declare it before what uses the tables
/// (pools, brokers, listeners), so that it is dropped after them.
#[derive(Default)]
pub struct Cleanup {
    /// `None`: no server (SQLite's tables go with its file).
    server: Option<Backend>,
    made: Mutex<Made>,
}

#[derive(Default)]
struct Made {
    tables: Vec<String>,
    /// Queue tables: each also has its dead-letter table, `<name>_dead`, its pause
    /// table, `<name>_pause`, its schedule and tick tables, `<name>_sched` and
    /// `<name>_ticks`, its history tables, `<name>_hist` and `<name>_keep`, and its counts
    /// table, `<name>_count`.
    queues: Vec<String>,
    schemas: Vec<String>,
    /// Every table whose name starts with one of these.
    prefixes: Vec<String>,
    sqlite_files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl Cleanup {
    /// A guard over what a test makes on `backend`'s test server ([`PG_URL`],
    /// [`MARIADB_URL`]); on SQLite only over files (`Cleanup::default()` is the same).
    pub fn new(backend: Backend) -> Cleanup {
        let server = (backend != Backend::Sqlite).then_some(backend);
        Cleanup { server, made: Mutex::default() }
    }

    fn made(&self) -> std::sync::MutexGuard<'_, Made> {
        self.made.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drops the table `name` (`schema.table` on PostgreSQL) at the end; returns the name.
    pub fn table(&self, name: &str) -> String {
        self.made().tables.push(name.to_owned());
        name.to_owned()
    }

    /// Drops the queue table `name`, its dead-letter, pause, schedule, tick and history
    /// tables at the end; returns the name.
    pub fn queue(&self, name: &str) -> String {
        self.made().queues.push(name.to_owned());
        name.to_owned()
    }

    /// Drops the notify table `name` and its durable listeners' positions table at the
    /// end (on PostgreSQL, where a durable deploy made them); returns the name.
    pub fn notify_table(&self, name: &str) -> String {
        self.table(name);
        self.table(&format!("{name}_positions"));
        name.to_owned()
    }

    /// Drops the PostgreSQL schema `name` with everything in it at the end; returns the name.
    pub fn schema(&self, name: &str) -> String {
        self.made().schemas.push(name.to_owned());
        name.to_owned()
    }

    /// Drops every table whose name starts with `prefix` at the end: for a program that
    /// names its tables itself under a prefix the test gave it.
    pub fn prefix(&self, prefix: &str) {
        assert!(
            !prefix.is_empty() && prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "a table prefix is a plain identifier: {prefix:?}"
        );
        self.made().prefixes.push(prefix.to_owned());
    }

    /// Deletes the SQLite database file `path` (and its journals) at the end.
    pub fn sqlite_file(&self, path: &Path) {
        self.made().sqlite_files.push(path.to_owned());
    }

    /// Deletes the directory `path` with everything in it at the end.
    pub fn dir(&self, path: &Path) {
        self.made().dirs.push(path.to_owned());
    }

    /// The test dropped the table, queue or schema `name` itself: nothing left to do.
    pub fn forget(&self, name: &str) {
        let made = &mut *self.made();
        for names in [&mut made.tables, &mut made.queues, &mut made.schemas] {
            names.retain(|n| n != name);
        }
    }

    /// Runs `sql` with the server's client; its standard output.
    fn client(server: Backend, sql: &str) -> Result<String, String> {
        let mut command = match server {
            Backend::Postgres => {
                let mut c = Command::new("psql");
                c.args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d", PG_URL, "-c", sql]);
                c
            }
            _ => {
                let url = MARIADB_URL.strip_prefix("mysql://").expect("a mysql:// URL");
                let (user, rest) = url.split_once('@').expect("a user");
                let (host_port, database) = rest.split_once('/').expect("a database");
                let (host, port) = host_port.split_once(':').expect("a port");
                let mut c = Command::new("mariadb");
                c.args(["-N", "-B", "-h", host, "-P", port, "-u", user, database, "-e", sql]);
                c
            }
        };
        match command.stdin(Stdio::null()).output() {
            Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
            Err(e) => Err(format!("cannot run the {} client: {e}", server.name())),
        }
    }

    /// [`client`](Self::client), on a runtime worker's thread handed over to blocking
    /// first: the guard drops inside the test's runtime, and a task that holds the lock the
    /// drop waits for (a session still ending its transaction) may be queued on this very
    /// worker, where nothing would run it until the drop timed out.
    fn client_blocking(server: Backend, sql: &str) -> Result<String, String> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| Self::client(server, sql))
            }
            _ => Self::client(server, sql),
        }
    }

    /// The tables in the test database (PostgreSQL: in its current schema) whose names
    /// start with `prefix`.
    fn tables_under(server: Backend, prefix: &str) -> Result<Vec<String>, String> {
        let sql = match server {
            Backend::Postgres => format!(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() \
                 AND left(tablename, {}) = '{prefix}'",
                prefix.len()
            ),
            _ => format!(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() \
                 AND LEFT(table_name, {}) = '{prefix}'",
                prefix.len()
            ),
        };
        Ok(Self::client(server, &sql)?.lines().filter(|l| !l.is_empty()).map(str::to_owned).collect())
    }

    /// The statement that drops `tables` and `schemas` on `server`, waiting for a lock at
    /// most [`LOCK_WAIT_SECS`].
    fn drop_sql(server: Backend, tables: &[String], schemas: &[String]) -> String {
        let (quote, wait) = match server {
            Backend::Postgres => ('"', format!("SET lock_timeout = '{LOCK_WAIT_SECS}s'; ")),
            _ => ('`', format!("SET SESSION lock_wait_timeout = {LOCK_WAIT_SECS}; ")),
        };
        let quoted = |name: &str| {
            let parts = name.split('.').map(|part| {
                let doubled = part.replace(quote, &format!("{quote}{quote}"));
                format!("{quote}{doubled}{quote}")
            });
            parts.collect::<Vec<_>>().join(".")
        };
        let mut sql = wait;
        if !tables.is_empty() {
            let list: Vec<String> = tables.iter().map(|t| quoted(t)).collect();
            sql.push_str(&format!("DROP TABLE IF EXISTS {}; ", list.join(", ")));
        }
        for schema in schemas {
            sql.push_str(&format!("DROP SCHEMA IF EXISTS {} CASCADE; ", quoted(schema)));
        }
        sql
    }
}

/// Deletes a SQLite database file and the journals SQLite keeps next to it.
pub fn remove_sqlite(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

/// What a deploy of queue `q` makes besides it: dead letters, pauses, schedules and their
/// ticks, kept history and its setting, counts, limits and their start log.
const QUEUE_SUFFIXES: [&str; 9] =
    ["_dead", "_pause", "_sched", "_ticks", "_hist", "_keep", "_count", "_limits", "_starts"];

/// Every table a deploy of queue `q` makes on every database, the queue table first.
pub fn queue_tables(q: &str) -> Vec<String> {
    std::iter::once(q.to_owned()).chain(QUEUE_SUFFIXES.iter().map(|s| format!("{q}{s}"))).collect()
}

/// [`queue_tables`] and those of `backend` alone: MySQL/MariaDB keeps deduplication ids
/// in `<q>_dedup` (elsewhere that name is the queue table's index, which a `DROP TABLE`
/// refuses) and ordering keys in `<q>_keys`; PostgreSQL's queue table has partitions
/// `<q>_p0` to `<q>_p3` (dropped with it; listed for tables that stand in for one).
pub fn queue_tables_on(backend: Backend, q: &str) -> Vec<String> {
    let mut tables = queue_tables(q);
    match backend {
        Backend::MySql => tables.extend([format!("{q}_dedup"), format!("{q}_keys")]),
        Backend::Postgres => tables.extend((0..4).map(|p| format!("{q}_p{p}"))),
        _ => {}
    }
    tables
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let made = std::mem::take(&mut *self.made());
        for file in &made.sqlite_files {
            remove_sqlite(file);
        }
        for dir in &made.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
        let Some(server) = self.server else { return };
        let mut tables = made.tables;
        tables.extend(made.queues.iter().flat_map(|q| queue_tables_on(server, q)));
        for prefix in &made.prefixes {
            match Self::tables_under(server, prefix) {
                Ok(found) => tables.extend(found),
                Err(e) => eprintln!("cleanup: cannot list the tables `{prefix}*` on {}: {e}", server.name()),
            }
        }
        // A name registered twice (a property test's shrinking retries a failing case)
        // would make MariaDB refuse the whole statement ("Not unique table/alias").
        let mut seen = std::collections::HashSet::new();
        tables.retain(|table| seen.insert(table.clone()));
        if tables.is_empty() && made.schemas.is_empty() {
            return;
        }
        let sql = Self::drop_sql(server, &tables, &made.schemas);
        let mut dropped = Self::client_blocking(server, &sql);
        // A lock still held a moment past the test (a session of a failed test, a task
        // ending with its runtime) times the drop out: try again before giving up.
        for _ in 1..DROP_TRIES {
            if dropped.is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
            dropped = Self::client_blocking(server, &sql);
        }
        if let Err(e) = dropped {
            // Panicking here could abort a test that is already unwinding: say what is left.
            eprintln!(
                "cleanup: cannot drop the tables {tables:?} and schemas {:?} on {}, drop them by hand: {e}",
                made.schemas,
                server.name()
            );
        }
    }
}

/// `ROWBUS_TEST_RUN` (letters and digits, at most 8), or nothing.
#[allow(dead_code)]
pub fn run_tag() -> String {
    let tag = std::env::var("ROWBUS_TEST_RUN").unwrap_or_default();
    tag.chars().filter(char::is_ascii_alphanumeric).take(8).collect::<String>().to_ascii_lowercase()
}
