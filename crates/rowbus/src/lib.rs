//! Messaging over the SQL database you already run.
//!
//! rowbus gives PostgreSQL, MySQL/MariaDB and SQLite one LISTEN/NOTIFY API: PostgreSQL's
//! own on PostgreSQL, and elsewhere an exact emulation over a polled notify table (the
//! [`notify_table`] core): delivered on commit, exactly once, out-of-order commits caught.
//! On top of it, a table [`Broker`]: queues are tables, subscriptions claim rows for
//! workers or batches under leases, publishes wake subscriptions at once in this process
//! and, with `listen_notify`, in others; retries, dead letters, transactional handlers.
//!
//! # A queue
//!
//! ```no_run
//! # async fn f() -> Result<(), rowbus::Error> {
//! use rowbus::{Broker, BrokerOptions, Message, sqlx::Sqlite};
//!
//! // Makes app.sqlite if it is missing; rowbus::connect would refuse to.
//! let pool = rowbus::connect_creating::<Sqlite>("sqlite://app.sqlite", 4).await?;
//! let broker = Broker::new(pool, BrokerOptions { listen_notify: true, ..Default::default() }).await?;
//! let jobs = broker.queue("jobs")?;
//! jobs.deploy().await?;
//! jobs.publish(Message::text("resize 42.png").group("images")).await?;
//!
//! // Four handlers at once; Ok acknowledges, Err retries with backoff, then dead-letters
//! // (return an `Outcome` to retry later, snooze it without using an attempt, or drop it).
//! jobs.subscribe().group("images").workers(4).run(|delivery| async move {
//!     println!("{} (attempt {})", delivery.text()?, delivery.attempt());
//!     Ok::<_, rowbus::Error>(())
//! }).await?; // returns when broker.shutdown(..) is called elsewhere
//! # Ok(()) }
//! ```
//!
//! Code for any of the three databases is generic over [`Db`]; [`DbPool::run`] runs it on
//! the database a URL names (see [`OnPool`]). Each database's SQL lives in one module
//! behind one trait; `docs/architecture.md` explains the layout.
//!
//! # Listening
//!
//! ```no_run
//! # async fn f() -> Result<(), rowbus::Error> {
//! use rowbus::{DbPool, Event, Listener};
//!
//! let url = "sqlite://app.sqlite";
//! let db = DbPool::connect_creating(url, 4).await?;
//! db.deploy_notify_table(&Default::default()).await?; // no-op on PostgreSQL
//!
//! let mut listener = Listener::connect(url).await?;
//! listener.listen("jobs").await?; // in effect when this returns
//!
//! db.notify("jobs", "wake up").await?;
//! match listener.recv().await? {
//!     Event::Notification(n) => println!("{}: {} (from {})", n.channel, n.payload, n.pid),
//!     Event::Transient(n) => println!("{}: {} (not resumable)", n.channel, n.payload),
//!     Event::Disconnected(error) => eprintln!("lost the connection ({error}); resync"),
//!     Event::Reconnected { missed } => eprintln!("listening again; resync {missed:?}"),
//!     Event::Stopped { channel, error } => eprintln!("stopped listening on {channel}: {error}"),
//!     _ => {} // events a later rowbus adds
//! }
//! # Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod broker;
mod deploy;
mod driver;
mod error;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod hosts;
mod listener;
mod names;
mod notify;
mod sql;
pub mod workflow;

pub use backend::{Backend, PGBOUNCER, redact, uses_pgbouncer};
pub use broker::{
    BatchOutcome, Broker, BrokerOptions, BrokerTx, Delivery, Headers, Message, Outcome, Published, Queue,
    QueueTable, Received, RetryPolicy, Subscription, SubscriptionBuilder, TxMessage,
};

/// Job control: cancelling messages, and what a running handler is told.
pub mod control {
    pub use crate::broker::{Cancel, Cancelled, DEFAULT_GRACE, StopReason, TIMEOUT_HEADER};
}
pub use broker::{MessagePage, MessageState, Messages, QueuedMessage};
pub use deploy::{DeployOptions, NotifyDeploy};
pub use error::Error;
pub use listener::{Event, Listener, ListenerHandle, ListenerOptions, WakePath, WakeStats};
pub use notify::notify;
pub use notify_table::{Config as NotifyConfig, Notification};
pub use sql::{Db, DbPool, Notifier, OnPool, connect, connect_creating};

/// Limits rowbus checks before the database sees a value, and the checks themselves.
pub mod limits {
    pub use crate::broker::{
        HISTORY_CLEANUP_BATCH, HISTORY_CLEANUP_INTERVAL, MAX_KEY_CHARS, MAX_MESSAGE_PAGE,
    };
    pub use crate::broker::{MAX_SCHEDULE_NAME, MAX_SCHEDULE_PAYLOAD, MIN_EVERY};
    pub use crate::names::{MAX_DURABLE_NAME_CHARS, MAX_GROUP_CHARS, MAX_TABLE_NAME, check_group};
    pub use crate::sql::{PG_MAX_CHANNEL_BYTES, PG_PAYLOAD_LIMIT_BYTES, check_pg_channel, check_pg_payload};
    pub use notify_table::{MAX_DURATION, MIN_POLL_INTERVAL};
}

/// Durations as rowbus reads them from text (`500ms`, `30s`, `5m`, `2h`, `7d`) and the
/// ranges it accepts.
pub mod duration {
    pub use notify_table::{DurationError, DurationRange, parse_duration};
}

/// Schedules: a message published to a queue every interval or at a cron expression's
/// times ([`Queue::schedule`](crate::Queue::schedule)), and the headers a tick carries.
pub mod schedule {
    pub use crate::broker::{SCHEDULE_HEADER, Schedule, ScheduleChange, ScheduleInfo, TICK_HEADER, When};
}

/// Kept history: what a queue deployed with a keep duration records of each handled
/// message, read with [`Queue::history`](crate::Queue::history).
pub mod history {
    pub use crate::broker::{HistoryEntry, HistoryOutcome, HistoryPage, Pruned};
}

/// Concurrency and rate limits on a queue or a group, across every process
/// ([`Queue::set_limit`](crate::Queue::set_limit)), and how a limited scope stands.
pub mod limit {
    pub use crate::broker::{Limit, LimitScope, LimitStatus, Rate};
}

/// Dead letters: the messages that ran out of attempts, for operators to read, requeue
/// or purge ([`Queue::dead_letters`](crate::Queue::dead_letters)).
pub mod dead {
    pub use crate::broker::{DeadLetter, DeadLetterPage, DeadLetters};
}

/// How queues stand: a broker's counters, per-group figures, a queue's event counters
/// ([`Queue::counts`](crate::Queue::counts)), the notify table's size, whether a queue is
/// deployed or paused, and what holds the database's horizon
/// ([`Queue::health`](crate::Queue::health)).
pub mod stats {
    pub use crate::broker::{ClaimFailure, GroupStats, NotifyTableStats, Paused, Stats, TableState};
    pub use crate::broker::{Counted, QueueCounts};
    pub use crate::broker::{DeadRows, Holder, HolderKind, QueueHealth, Reading, Unreadable, Wal};
}

/// A harness for testing handlers and publishers: a broker on a SQLite file or a database
/// of its own queues, dropped at the end; inline draining; delayed messages and schedule
/// ticks brought forward (see docs/testing.md).
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing {
    pub use crate::broker::testing::{Drained, Expected, Handled, TestBroker};
}

/// Traces from publish to handler: the spans' names are `rowbus.publish`, `rowbus.message`
/// and `rowbus.batch`, with OpenTelemetry's messaging attributes as fields; with the
/// `opentelemetry` feature the publisher's W3C trace context travels in these headers
/// and a handler's span continues it (see the module's page in docs/operating.md).
pub mod telemetry {
    pub use crate::broker::{TRACEPARENT, TRACESTATE};
}

/// Durable listeners: named positions that outlive a process, so a restarted listener
/// resumes where it stopped ([`Listener::listen_durable`](crate::Listener::listen_durable)).
pub mod durable {
    pub use crate::listener::{DurableListener, Resume, durable_listeners, forget_durable_listener};
    pub use crate::names::check_durable_name;
}

/// The sans-I/O core of the emulated LISTEN/NOTIFY, re-exported.
pub use notify_table;
/// The sqlx this rowbus is built on, for pools and your own statements in the same
/// version (`rowbus::sqlx::Pool<DB>`).
pub use sqlx;

/// The Rust blocks of README.md and docs/, compiled (and run where they may) as doctests,
/// so a snippet that stops compiling fails the tests.
#[cfg(doctest)]
mod snippets {
    #[doc = include_str!("../../../README.md")]
    struct Readme;
    #[doc = include_str!("../../../docs/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../../../docs/claims-and-leases.md")]
    struct ClaimsAndLeases;
    #[doc = include_str!("../../../docs/control.md")]
    struct Control;
    #[doc = include_str!("../../../docs/messages.md")]
    struct Messages;
    #[doc = include_str!("../../../docs/notify-table.md")]
    struct NotifyTable;
    #[doc = include_str!("../../../docs/operating.md")]
    struct Operating;
    #[doc = include_str!("../../../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../../../docs/publishing.md")]
    struct Publishing;
    #[doc = include_str!("../../../docs/reliability.md")]
    struct Reliability;
    #[doc = include_str!("../../../docs/scaling.md")]
    struct Scaling;
    #[doc = include_str!("../../../docs/schedules.md")]
    struct Schedules;
    // Its example needs the harness.
    #[cfg(feature = "testing")]
    #[doc = include_str!("../../../docs/testing.md")]
    struct Testing;
    #[doc = include_str!("../../../docs/waking.md")]
    struct Waking;
    #[doc = include_str!("../../../docs/workflows.md")]
    struct Workflows;
}

#[cfg(test)]
mod tests {
    /// Every page of docs/ is among the doctests' snippets of a crate of the workspace
    /// (this one's [`snippets`], or the crate whose API the page shows): a new page's Rust
    /// blocks compile too.
    #[test]
    fn every_page_of_the_docs_is_compiled() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let mut libs = String::new();
        for krate in std::fs::read_dir(format!("{root}/crates")).expect("crates/") {
            let lib = krate.expect("crates/ entry").path().join("src/lib.rs");
            libs.push_str(&std::fs::read_to_string(lib).unwrap_or_default());
        }
        for page in std::fs::read_dir(format!("{root}/docs")).expect("docs/") {
            let name = page.expect("docs/ entry").file_name().into_string().expect("a UTF-8 name");
            if name.ends_with(".md") {
                let include = format!("include_str!(\"../../../docs/{name}\")");
                assert!(
                    libs.contains(&include),
                    "docs/{name} is not among the doctests' snippets of any crate"
                );
            }
        }
    }
}
