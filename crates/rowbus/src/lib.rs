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
//! // (return an `Outcome` to retry later or drop it instead).
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
//!     Event::Disconnected(error) => eprintln!("lost the connection ({error}); resync"),
//!     Event::Reconnected { missed } => eprintln!("listening again; resync {missed:?}"),
//!     Event::Stopped { channel, error } => eprintln!("stopped listening on {channel}: {error}"),
//! }
//! # Ok(()) }
//! ```

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

pub use backend::{Backend, redact};
pub use broker::Paused;
pub use broker::{
    Broker, BrokerOptions, BrokerTx, DeadLetter, DeadLetterPage, DeadLetters, Delivery, GroupStats,
    HISTORY_CLEANUP_BATCH, HISTORY_CLEANUP_INTERVAL, Headers, HistoryEntry, HistoryOutcome, HistoryPage,
    MAX_GROUP_CHARS, MAX_KEY_CHARS, MAX_TABLE_NAME, Message, NotifyTableStats, Outcome, Pruned, Published,
    Queue, QueueTable, Received, RetryPolicy, Stats, Subscription, SubscriptionBuilder, TableState,
    TxMessage, check_group,
};
pub use broker::{
    MAX_SCHEDULE_NAME, MAX_SCHEDULE_PAYLOAD, MIN_EVERY, SCHEDULE_HEADER, Schedule, ScheduleChange,
    ScheduleInfo, TICK_HEADER, When,
};
pub use deploy::NotifyDeploy;
pub use error::Error;
pub use listener::{
    DurableListener, Event, Listener, ListenerHandle, ListenerOptions, Resume, durable_listeners,
    forget_durable_listener,
};
pub use notify::notify;
pub use sql::{Db, DbPool, OnPool, connect, connect_creating};
pub use sql::{Notifier, PG_MAX_CHANNEL_BYTES, PG_PAYLOAD_LIMIT_BYTES, check_pg_channel, check_pg_payload};

pub use notify_table::{
    self, Config as NotifyConfig, DurationError, DurationRange, MAX_DURATION, MIN_POLL_INTERVAL,
    Notification, parse_duration,
};
/// The sqlx this rowbus is built on, for pools and your own statements in the same
/// version (`rowbus::sqlx::Pool<DB>`).
pub use sqlx;
