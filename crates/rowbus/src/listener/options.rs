//! How a listener listens and reconnects.

use std::time::Duration;

use notify_table::Config;

/// How a [`Listener`](super::Listener) listens and reconnects.
#[derive(Debug, Clone)]
pub struct ListenerOptions {
    /// The notify table and its polling (MySQL/MariaDB and SQLite; on PostgreSQL, durable
    /// channels only, whose poll interval is a fallback to LISTEN's wake-ups).
    pub notify_table: Config,
    /// Whether to learn of commits through a push path where the database offers one:
    /// the binary log on MySQL/MariaDB (needs `log_bin` and a user with `REPLICATION
    /// SLAVE` and `BINLOG MONITOR`, `REPLICATION CLIENT` on MySQL), a watch on the
    /// database's files on SQLite. While it is open the notify table is read when a
    /// commit is pushed, and otherwise only every [`pushed_poll_interval`](Self::pushed_poll_interval);
    /// where the server refuses it, or while it is lost, the listener polls every
    /// `poll_interval`, and says why once. On by default.
    pub push: bool,
    /// While the push path is open on MySQL/MariaDB, how often the notify table is read
    /// anyway: a safety net for a commit the binary log did not show (a session with
    /// `sql_log_bin = 0`), and the pace of the table's cleanup. One minute by default.
    pub pushed_poll_interval: Duration,
    /// First wait before reconnecting after the connection was lost.
    pub reconnect_min: Duration,
    /// Longest wait between two reconnect attempts; the wait doubles up to it.
    pub reconnect_max: Duration,
    /// Events held for the caller before the listener stops reading from the server.
    pub buffer: usize,
    /// A durable listener's lease on its name, at least three poll intervals: it checks
    /// in (storing what was acknowledged) every third of it, between polls, and another
    /// process may take the name over once it has not for this long (after a crash, say).
    /// It is stored with the name: a listener waiting for the name waits for this one.
    pub durable_lease: Duration,
    /// How recently a durable listener must have checked in for every listener's cleanup
    /// to keep the rows it has not read yet; one away longer stops holding them back (and
    /// is told of a possible gap when it resumes).
    pub durable_live: Duration,
}

impl Default for ListenerOptions {
    fn default() -> Self {
        ListenerOptions {
            notify_table: Config::default(),
            push: true,
            pushed_poll_interval: Duration::from_secs(60),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            buffer: 4096,
            durable_lease: Duration::from_secs(10),
            durable_live: Duration::from_secs(3600),
        }
    }
}
