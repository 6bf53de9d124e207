//! The library's errors.

use std::time::Duration;

use notify_table::DurationRange;

/// What rowbus refuses or could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database URL names no database rowbus speaks, or cannot be parsed.
    #[error("invalid database URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given (password removed).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server could not be reached or refused the connection.
    #[error("cannot connect to {target}: {source}")]
    Connect {
        /// Where rowbus tried to connect (password removed).
        target: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// None of the hosts of a several-host URL could be connected to (or, with
    /// `target_session_attrs=read-write`, none took writes).
    #[error("cannot connect to any host of {url}: {tried}; check that one of them is up (and a primary)")]
    NoHost {
        /// The URL (password removed).
        url: String,
        /// Each host tried, in order, and why it failed.
        tried: String,
    },
    /// The server is read-only (a standby, or `default_transaction_read_only` is on) and the
    /// URL asks for `target_session_attrs=read-write`.
    #[error(
        "{target} is read-only (a standby?) and the URL asks for target_session_attrs=read-write: \
         list the primary among its hosts"
    )]
    ReadOnlyHost {
        /// The host's URL (password removed).
        target: String,
    },
    /// Something that needs a database session of its own (LISTEN: listeners, the
    /// broker's `listen_notify` wake-ups, durable listeners) was asked of a URL through
    /// PgBouncer in transaction pooling mode (`pgbouncer=true`), which hands each
    /// transaction whichever server connection is free.
    #[error(
        "{feature} needs a database session of its own, which PgBouncer in transaction pooling mode \
         (pgbouncer=true) does not keep: give it a direct URL to PostgreSQL (BrokerOptions::listen_url; \
         the CLI's --listen-url or ROWBUS_LISTEN_URL)"
    )]
    NeedsSession {
        /// What asked for the session: "listening", "listen_notify".
        feature: &'static str,
    },
    /// The SQLite database file does not exist, and the connection was not one that
    /// creates it.
    #[error(
        "the SQLite database file {} does not exist: create it with `rowbus deploy` \
         (or connect with DbPool::connect_creating)",
        path.display()
    )]
    MissingDatabase {
        /// The file, as an absolute path where it could be made one.
        path: std::path::PathBuf,
    },
    /// The notify table does not exist yet.
    #[error(
        "the notify table `{table}` does not exist: create it with `rowbus deploy` (`rowbus deploy --durable` \
         on PostgreSQL), or DbPool::deploy_notify_table (deploy_durable_notify_table)"
    )]
    MissingNotifyTable {
        /// The table's name.
        table: String,
    },
    /// The positions table of durable listeners does not exist yet.
    #[error(
        "the positions table `{table}` of durable listeners does not exist: create it with `rowbus deploy` \
         (`rowbus deploy --durable` on PostgreSQL), or DbPool::deploy_notify_table \
         (deploy_durable_notify_table), which makes it beside the notify table"
    )]
    MissingPositionsTable {
        /// The table's name.
        table: String,
    },
    /// The positions table of durable listeners was made by an older rowbus.
    #[error(
        "the positions table `{table}` of durable listeners was made by an older rowbus: bring it up to \
         date with `rowbus deploy` (`--durable` on PostgreSQL)"
    )]
    PositionsTableOutdated {
        /// The table's name.
        table: String,
    },
    /// The notify table's name leaves no room for the positions table's suffix.
    #[error(
        "durable listeners need the table `{table}_positions`, longer than the database allows: \
         name the notify table with at most {max} characters"
    )]
    PositionsTableName {
        /// The notify table's name.
        table: String,
        /// The longest notify table name that leaves room.
        max: usize,
    },
    /// Another listener holds the durable name, and checked in within its lease.
    #[error(
        "the durable listener {name:?} on channel {channel:?} is in use by another process (it checked in \
         {since:?} ago): stop it, or wait {expires_in:?} for its lease to run out, or use another name"
    )]
    DurableNameTaken {
        /// The channel.
        channel: String,
        /// The durable name.
        name: String,
        /// Time since the owner's last check-in.
        since: Duration,
        /// Time until its lease runs out, unless it checks in again.
        expires_in: Duration,
    },
    /// Another listener took the durable name over: this one had not checked in within
    /// its lease (stalled or disconnected for that long). The channel is no longer listened on.
    #[error(
        "the durable listener {name:?} on channel {channel:?} was taken over by another process after this \
         one missed its lease; listen again (under the name, once the other stops) to go on"
    )]
    DurableNameLost {
        /// The channel.
        channel: String,
        /// The durable name.
        name: String,
    },
    /// A durable listener checks in between polls: its lease must span three of them.
    #[error(
        "a durable listener's lease ({lease:?}) must be at least three poll intervals ({poll_interval:?} \
         each): it checks in between polls; lengthen the lease or poll more often"
    )]
    DurableLeaseTooShort {
        /// The lease asked for.
        lease: Duration,
        /// The notify table's poll interval.
        poll_interval: Duration,
    },
    /// A durable listener was asked of a channel this listener already listens on.
    #[error(
        "channel {channel:?} is already listened on without a durable name: unlisten it first, or use \
         another listener"
    )]
    AlreadyListening {
        /// The channel.
        channel: String,
    },
    /// An acknowledgement for a channel this listener does not listen on durably.
    #[error("channel {channel:?} is not listened on durably by this listener: listen_durable it first")]
    NotDurable {
        /// The channel.
        channel: String,
    },
    /// A channel or payload the notify table cannot hold, or a poll that returned
    /// malformed rows.
    #[error(transparent)]
    NotifyTable(#[from] notify_table::Error),
    /// An invalid notify-table configuration.
    #[error(transparent)]
    Config(#[from] notify_table::ConfigError),
    /// A PostgreSQL channel name is an identifier: at most 63 bytes.
    #[error("invalid channel {channel:?}: {bytes} bytes, PostgreSQL channel names hold at most 63 bytes")]
    PgChannelTooLong {
        /// The channel.
        channel: String,
        /// Its length in bytes.
        bytes: usize,
    },
    /// A PostgreSQL channel name must not be empty.
    #[error("invalid channel: the name is empty")]
    PgChannelEmpty,
    /// A PostgreSQL NOTIFY payload must be shorter than 8000 bytes.
    #[error("payload too large: {bytes} bytes, PostgreSQL payloads must be under 8000 bytes")]
    PgPayloadTooLarge {
        /// Its length in bytes.
        bytes: usize,
    },
    /// The queue table does not exist yet.
    #[error(
        "the queue table `{table}` does not exist: create it with `rowbus deploy --queue {table}` (or Queue::deploy)"
    )]
    MissingQueueTable {
        /// The table's name.
        table: String,
    },
    /// The queue's pause table is missing: the queue was deployed by a rowbus without
    /// pause and resume, and claims, pauses and resumes need it.
    #[error(
        "the queue `{table}` has no pause table `{table}_pause` (deployed by an older rowbus): add it with `rowbus deploy --queue {table}` (or Queue::deploy), which leaves the messages alone"
    )]
    MissingPauseTable {
        /// The queue table's name.
        table: String,
    },
    /// The queue's limits tables are missing, or lack their newest columns (a rate's
    /// burst): the queue was deployed by an older rowbus, and claims and limits need them.
    #[error(
        "the queue `{table}` lacks its limits tables `{table}_limits` and `{table}_starts`, or their newest columns (deployed by an older rowbus): add them with `rowbus deploy --queue {table}` (or Queue::deploy), which leaves the messages alone"
    )]
    MissingLimitsTable {
        /// The queue table's name.
        table: String,
    },
    /// A transactional subscription ([`run_tx`](crate::SubscriptionBuilder::run_tx),
    /// [`run_batch_tx`](crate::SubscriptionBuilder::run_batch_tx)) of a group some limit
    /// applies to (the group's own or the whole queue's): refused at its start, since its
    /// messages are taken in an open transaction that the limits of other claims cannot
    /// count. Run a leased handler (`run`, `run_batch`) there, or clear the limits.
    #[error(
        "the group {group:?} of the queue `{table}` is limited, and a transactional handler (run_tx, run_batch_tx) cannot obey limits: handle it with run or run_batch, or clear its limits (and the whole queue's)"
    )]
    LimitedTransactional {
        /// The queue table's name.
        table: String,
        /// The group subscribed to (`""` is the default group).
        group: String,
    },
    /// A limit out of its range: a count of 0, or a rate's period of zero or past
    /// [`MAX_DURATION`](crate::limits::MAX_DURATION).
    #[error("{what}")]
    InvalidLimit {
        /// What is wrong, in a sentence.
        what: String,
    },
    /// The queue's schedule tables are missing: the queue was deployed by a rowbus
    /// without schedules.
    #[error(
        "the queue `{table}` has no schedule tables `{table}_sched` and `{table}_ticks` (deployed by an older rowbus): add them with `rowbus deploy --queue {table}` (or Queue::deploy), which leaves the messages alone"
    )]
    MissingScheduleTable {
        /// The queue table's name.
        table: String,
    },
    /// A schedule rowbus refuses: its name, interval, group or payload.
    #[error("invalid schedule {name:?}: {reason}")]
    InvalidSchedule {
        /// The schedule's name.
        name: String,
        /// The rule it breaks.
        reason: String,
    },
    /// A cron expression that does not parse, or that no date matches.
    #[error(
        "invalid cron expression {expr:?}: {reason}; write five fields (minute hour day-of-month month \
         day-of-week, in UTC, e.g. \"0 3 * * *\") or six with seconds first"
    )]
    InvalidCron {
        /// The expression as given.
        expr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The queue's history tables are missing: the queue was deployed by a rowbus without
    /// kept history, which reading or setting its history needs (it keeps nothing until
    /// then).
    #[error(
        "the queue `{table}` has no history tables `{table}_hist` and `{table}_keep` (deployed by an older rowbus): add them with `rowbus deploy --queue {table}` (or Queue::deploy), which leaves the messages alone"
    )]
    MissingHistoryTable {
        /// The queue table's name.
        table: String,
    },
    /// A table of the queue's name exists and is not a queue table: a deploy refuses to
    /// build on it (and creates nothing), and nothing publishes to it or claims from it.
    #[error(
        "table `{table}` is not a rowbus queue table (missing columns: {}): queue tables are created \
         by `rowbus deploy --queue NAME` (or Queue::deploy) under a name no other table has",
        .missing.join(", ")
    )]
    NotAQueueTable {
        /// The table's name.
        table: String,
        /// The queue table's columns it lacks.
        missing: Vec<&'static str>,
    },
    /// A queue whose tables would share a name with another queue's: `jobs_dead` deployed
    /// as a queue beside `jobs` (whose dead letters go to `jobs_dead`), either way round,
    /// and the same for every side table. A deploy refuses it and creates nothing.
    #[error(
        "cannot deploy queue `{queue}`: the table `{table}` would belong both to it and to the queue \
         `{other}`, mixing their messages; give the new queue a name that shares no table with \
         another queue's (nothing was created)"
    )]
    QueueNameCollides {
        /// The queue being deployed.
        queue: String,
        /// The name both queues would take.
        table: String,
        /// The queue already deployed.
        other: String,
    },
    /// Another deploy held the deploy lock for longer than a deploy waits.
    #[error(
        "cannot deploy `{table}`: another deploy held the deploy lock for {}s; nothing was created, \
         run the deploy again once the other one has finished",
        .waited.as_secs()
    )]
    DeployLocked {
        /// The table being deployed.
        table: String,
        /// How long this deploy waited.
        waited: std::time::Duration,
    },
    /// PostgreSQL: the schema a queue table is qualified with does not exist, and the
    /// deploy was not asked to create it ([`DeployOptions::create_schema`](crate::DeployOptions::create_schema)).
    #[error(
        "the schema `{schema}` does not exist: a deploy creates a schema only when asked to (DeployOptions::create_schema)"
    )]
    MissingSchema {
        /// The schema.
        schema: String,
    },
    /// MySQL/MariaDB: the database a queue table is qualified with does not exist. rowbus
    /// never creates databases, asked to create schemas or not.
    #[error(
        "the database `{database}` does not exist: on MySQL/MariaDB a queue's qualifier is a database, and rowbus does not create databases (CREATE DATABASE it first)"
    )]
    MissingMySqlDatabase {
        /// The database.
        database: String,
    },
    /// A queue table or group name that rowbus refuses.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// The rule it breaks.
        reason: String,
    },
    /// A durable listener's name that rowbus refuses: empty, or too long for the
    /// positions table.
    #[error("invalid durable listener name {name:?}: {reason}")]
    InvalidDurableName {
        /// The name as given.
        name: String,
        /// The rule it breaks.
        reason: String,
    },
    /// A message's ordering key or deduplication id that rowbus refuses.
    #[error("invalid message {field} {value:?}: it {reason}")]
    InvalidMessage {
        /// `key` or `dedup_id`.
        field: &'static str,
        /// The value as given.
        value: String,
        /// The rule it breaks.
        reason: String,
    },
    /// An ack, retry or release came after the message was claimed again (or cancelled),
    /// or a lease extension came after the lease ran out: someone else may hold the
    /// message now, so nothing was changed.
    #[error(
        "the lease on message {id} of `{table}` was lost (it ran out and the message may be held by another worker); nothing was changed"
    )]
    LeaseLost {
        /// The queue table.
        table: String,
        /// The message's id.
        id: i64,
    },
    /// Moving a message to its queue's dead-letter table failed (the table is missing, or
    /// is not a dead-letter table): the message was not dead-lettered. It stays in its
    /// queue and runs again after `after`, its attempt not counted again, until the move
    /// succeeds.
    #[error(
        "message {id} of `{table}` could not be dead-lettered into `{dead}` and stays in the queue, to run \
         again in {after:?} (`rowbus deploy --queue {table}`, or Queue::deploy, recreates a missing \
         dead-letter table)"
    )]
    DeadLetterFailed {
        /// The queue table.
        table: String,
        /// Its dead-letter table.
        dead: String,
        /// The message's id.
        id: i64,
        /// When the message runs again.
        after: Duration,
        /// Why the move failed.
        #[source]
        source: Box<Error>,
    },
    /// A duration out of its range, refused before any statement: longer than a database
    /// can add to its clock ([`MAX_DURATION`](crate::limits::MAX_DURATION)), a lease of zero, or
    /// a poll interval under [`MIN_POLL_INTERVAL`](crate::limits::MIN_POLL_INTERVAL).
    #[error("invalid `{setting}` = {value:?}: {rule}")]
    InvalidDuration {
        /// The setting or argument (`lease`, `poll_interval`, `delay`...).
        setting: &'static str,
        /// The duration as given.
        value: Duration,
        /// What it must be.
        rule: &'static str,
    },
    /// The broker is shutting down and takes no new work.
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// A [`BrokerTx`](crate::BrokerTx) whose publish was dropped before it finished: the
    /// publish ran to its end on a task of its own and its transaction was rolled back
    /// there (nothing of it stored). Begin another transaction.
    #[error(
        "this transaction was rolled back: a publish in it was dropped before it finished          (begin another transaction)"
    )]
    TransactionAbandoned,
    /// A message too large for the database to take in one statement.
    #[error(
        "message of {bytes} bytes refused: over the {limit}-byte limit of {setting} \
         (publish smaller messages, or raise the limit where it is a setting)"
    )]
    MessageTooLarge {
        /// The message's payload, group, key, deduplication id and headers, in bytes.
        bytes: usize,
        /// What the database takes, less what a statement needs besides.
        limit: u64,
        /// Where the limit comes from.
        setting: &'static str,
    },
    /// A payload that was to be decoded as text or JSON is not.
    #[error("message {id} payload cannot be decoded: {reason}")]
    Payload {
        /// The message's id.
        id: i64,
        /// What failed.
        reason: String,
    },
    /// The listener's connection task has stopped; the listener cannot be used any more.
    #[error("the listener has stopped")]
    ListenerClosed,
    /// A statement failed. A prepared statement of the driver's that already exists
    /// (SQLSTATE 42P05) or is missing (26000), the sign of a transaction-pooling PgBouncer
    /// in front of a URL without `?pgbouncer=true`, says how to fix the URL.
    #[error("database error: {}", database_line(.0))]
    Database(#[from] sqlx::Error),
    /// The statement that carried this publish together with others made at the same
    /// moment ([`Queue::publish`](crate::Queue::publish)) failed: its error, which each
    /// of them gets. As with any failed statement, nothing of it was stored, unless the
    /// connection was lost after the commit.
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
}

impl Error {
    /// Whether this error means the connection it happened on is gone (or unusable),
    /// rather than that the statement was refused.
    pub fn is_connection_error(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::NoHost { .. } | Error::ReadOnlyHost { .. } => true,
            Error::Database(e) => is_connection_lost(e),
            Error::Shared(e) => e.is_connection_error(),
            _ => false,
        }
    }

    /// Whether trying the same statement again cannot help: the table or a column it
    /// names does not exist, or the database refuses the user the privilege. A claim
    /// failing so fails until someone changes the database.
    ///
    /// ```
    /// let missing = rowbus::Error::MissingQueueTable { table: "jobs".into() };
    /// assert!(missing.is_permanent());
    /// assert!(!rowbus::Error::ShuttingDown.is_permanent());
    /// ```
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::MissingQueueTable { .. }
            | Error::MissingPauseTable { .. }
            | Error::MissingLimitsTable { .. }
            | Error::MissingScheduleTable { .. }
            | Error::MissingHistoryTable { .. }
            | Error::MissingNotifyTable { .. } => true,
            Error::Database(sqlx::Error::Database(db)) => {
                // SQLSTATE class 42 (PostgreSQL and MySQL alike): undefined table or
                // column, insufficient privilege. SQLite says it in the message only.
                let code = db.code();
                code.as_deref().is_some_and(|c| c.starts_with("42"))
                    || ["no such table", "no such column", "readonly database"]
                        .iter()
                        .any(|m| db.message().contains(m))
            }
            Error::Shared(e) => e.is_permanent(),
            _ => false,
        }
    }

    /// Whether the database refused the statement because the user lacks a privilege on
    /// what it names: PostgreSQL's `insufficient_privilege` (SQLSTATE 42501), MySQL's and
    /// MariaDB's 1142 (table) and 1143 (column) "command denied". Such a statement fails
    /// for this user until an administrator grants more; another user may run it.
    pub fn is_permission_denied(&self) -> bool {
        match self {
            Error::Database(e) => is_permission_denied(e),
            Error::Shared(e) => e.is_permission_denied(),
            _ => false,
        }
    }

    /// This error for each of several callers: a copy where it holds only its
    /// description (a missing table, say), else one [`Error::Shared`] for all.
    pub(crate) fn for_each(self, callers: usize) -> Vec<Error> {
        let copy = |e: &Error| match e {
            Error::MissingQueueTable { table } => Some(Error::MissingQueueTable { table: table.clone() }),
            Error::MissingPauseTable { table } => Some(Error::MissingPauseTable { table: table.clone() }),
            Error::MissingLimitsTable { table } => Some(Error::MissingLimitsTable { table: table.clone() }),
            Error::MissingHistoryTable { table } => Some(Error::MissingHistoryTable { table: table.clone() }),
            Error::ShuttingDown => Some(Error::ShuttingDown),
            _ => None,
        };
        if callers <= 1 {
            return vec![self];
        }
        if let Some(first) = copy(&self) {
            return std::iter::once(first).chain((1..callers).filter_map(|_| copy(&self))).collect();
        }
        let shared = std::sync::Arc::new(self);
        (0..callers).map(|_| Error::Shared(shared.clone())).collect()
    }

    /// The error and its causes, on one line.
    pub fn one_line(&self) -> String {
        chain_line(self)
    }
}

/// `error` and its causes (each one its message does not already hold), on one line.
pub(crate) fn chain_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = without_server_line(&cause.to_string()).to_owned();
        if !line.contains(&cause_text) {
            line.push_str(": ");
            line.push_str(&cause_text);
        }
        source = cause.source();
    }
    line.replace('\n', " ")
}

/// `text` without the " at line N" sqlx appends to a PostgreSQL error: the line of the
/// server's own C source that raised it, which says nothing to a user.
fn without_server_line(text: &str) -> &str {
    match text.rsplit_once(" at line ") {
        Some((before, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => before,
        _ => text,
    }
}

/// A driver error's text for [`Error::Database`]: without the server's source line, and
/// with the fix when the error is a prepared statement of the driver's that already exists
/// on the server connection (PgBouncer in transaction pooling mode hands one client's
/// prepared statements to another, unless the URL says `pgbouncer=true`).
fn database_line(e: &sqlx::Error) -> String {
    let text = without_server_line(&e.to_string()).to_owned();
    match is_pooled_statement_clash(e) {
        true => format!(
            "{text} (a transaction-pooling PgBouncer? add `?pgbouncer=true` to the database URL, \
             `&pgbouncer=true` after other parameters)"
        ),
        false => text,
    }
}

/// Whether `e` is PostgreSQL's `duplicate_prepared_statement` (42P05), or its
/// `invalid_sql_statement_name` (26000, the same clash seen from the other client), on one
/// of the driver's own statements (`sqlx_s_N`).
fn is_pooled_statement_clash(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else { return false };
    matches!(db.code().as_deref(), Some("42P05" | "26000")) && db.message().contains("\"sqlx_s_")
}

/// Refuses `value` of `setting` with [`Error::InvalidDuration`] unless it is in `range`.
pub(crate) fn check_duration(
    setting: &'static str,
    value: Duration,
    range: DurationRange,
) -> Result<(), Error> {
    if range.contains(value) {
        Ok(())
    } else {
        Err(Error::InvalidDuration { setting, value, rule: range.rule() })
    }
}

/// Whether a driver error means the connection is gone rather than the statement refused.
pub(crate) fn is_connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                // 1053 server shutdown, 1927 connection killed, 2006/2013 server gone.
                return matches!(my.number(), 1053 | 1927 | 2006 | 2013);
            }
            // PostgreSQL: class 08 (connection exception), 57P01-57P03 (administrator or
            // crash shutdown, cannot connect now).
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            code.starts_with("08") || code.starts_with("57P0")
        }
        _ => false,
    }
}

/// Whether a driver error is a deadlock, a serialization failure or a Galera conflict
/// worth one more try.
///
/// On a Galera cluster a transaction that lost certification to another node's (the
/// same rows written there first) fails with 1213, at `COMMIT` or, when the other node's
/// write set aborts it while it runs, on a statement: the same number as an InnoDB
/// deadlock, and the same cure. A node that is joining or has lost its quorum refuses
/// statements with 1047 ("WSREP has not yet prepared node for application use") until
/// it is synced again.
pub(crate) fn is_retryable(e: &sqlx::Error) -> bool {
    error_is(e, &[1213, 1205, 1047], &["40001", "40P01"], None)
}

/// Whether a driver error is a lock wait that ran past its timeout (PostgreSQL's
/// `lock_timeout`, MySQL's `innodb_lock_wait_timeout`).
pub(crate) fn is_lock_wait(e: &sqlx::Error) -> bool {
    error_is(e, &[1205], &["55P03"], None)
}

/// Whether a driver error says the table a statement named does not exist.
pub(crate) fn is_missing_table(e: &sqlx::Error) -> bool {
    // PostgreSQL undefined_table; SQLite reports it in the message only.
    error_is(e, &[1146], &["42P01"], Some("no such table"))
}

/// Whether `e` says a column does not exist (a table made by an older rowbus).
pub(crate) fn is_missing_column(e: &sqlx::Error) -> bool {
    // PostgreSQL undefined_column; SQLite reports it in the message only.
    error_is(e, &[1054], &["42703"], Some("no such column"))
}

/// Whether a driver error says the user lacks the privilege the statement needs (see
/// [`Error::is_permission_denied`]).
pub(crate) fn is_permission_denied(e: &sqlx::Error) -> bool {
    // MySQL 1142: SELECT (INSERT, ...) command denied for a table; 1143: for a column.
    error_is(e, &[1142, 1143], &["42501"], None)
}

/// Whether a driver error says the user lacks a privilege: a table's or column's (see
/// [`is_permission_denied`]) or, on MySQL/MariaDB, a global one such as PROCESS (1227).
pub(crate) fn is_privilege_missing(e: &sqlx::Error) -> bool {
    error_is(e, &[1142, 1143, 1227], &["42501"], None)
}

/// Whether `e` is a database error of one of the MySQL/MariaDB error numbers `mysql`,
/// or elsewhere of one of the SQLSTATEs `codes` or with `message` in its text.
fn error_is(e: &sqlx::Error, mysql: &[u16], codes: &[&str], message: Option<&str>) -> bool {
    let sqlx::Error::Database(db) = e else { return false };
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return mysql.contains(&my.number());
    }
    #[cfg(not(feature = "mysql"))]
    let _ = mysql;
    db.code().is_some_and(|code| codes.contains(&code.as_ref()))
        || message.is_some_and(|text| db.message().contains(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_source_line_is_dropped() {
        assert_eq!(
            without_server_line("column \"x\" does not exist at line 1850"),
            "column \"x\" does not exist"
        );
        assert_eq!(without_server_line("read at line one"), "read at line one");
        assert_eq!(without_server_line("plain"), "plain");
    }
}
