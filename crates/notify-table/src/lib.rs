//! LISTEN/NOTIFY for databases that have none (MySQL 8.0, MariaDB 10.6+, SQLite),
//! emulated over a polled *notify table*, without I/O; on PostgreSQL, the same table read
//! by listeners that must not lose what was sent while they were away (woken by LISTEN).
//!
//! A notifier INSERTs a row; a listener polls the table for rows that are new to it.
//! This crate is the exact part of that and nothing else: it builds SQL with bind values
//! and folds the rows a statement returned into its state. Running statements, the timer
//! and the connection belong to the caller (a *transport*), so the same core serves
//! async and blocking drivers alike, and its tests need neither a database nor a clock.
//!
//! # What a listener gets
//!
//! - **Delivery on commit**: the row becomes visible when its transaction commits, the
//!   moment PostgreSQL delivers a `NOTIFY`; a rolled-back notification never arrives.
//! - **No history**: subscribing takes a mark; what was visible then is not delivered. A
//!   notification whose transaction was open at that moment is delivered once it commits.
//! - **Exactly once, in id order within a poll.** Ids are handed out at INSERT but rows
//!   become visible at COMMIT, so besides the rows above the channel's mark a poll reads
//!   the *gaps* below it, ids no poll has read yet, until they are read or a lookback old
//!   (see [`Position`]): what is new plus what may still arrive late, not the whole
//!   lookback window.
//! - **The one loss case**: a notification whose transaction commits more than `lookback`
//!   after its INSERT, while a notification with a higher id on the same channel was
//!   delivered in the meantime. See `docs/notify-table.md`.
//! - Latency is the poll interval. A subscription's [`Position`] can be stored and resumed
//!   on another connection, in another process ([`NotifyTable::resumed`]): what was
//!   committed meanwhile is delivered, while it is still in the table.
//!
//! # A transport's loop
//!
//! ```
//! use notify_table::{Config, Dialect, Notification, NotifyTable, Row, Statement};
//!
//! /// Stands in for a driver: runs a statement, returns its rows.
//! fn run(stmt: &Statement) -> Vec<Row> {
//!     if stmt.sql.starts_with("DELETE") { return vec![]; }
//!     vec![Row::cutoff(0, "2026-11-29 12:00:00.000000")]
//! }
//!
//! let mut nt = NotifyTable::new(Config::default(), Dialect::MySql)?;
//! let stmt = nt.subscribe_sql("jobs")?;                      // listen
//! nt.subscribed("jobs", run(&stmt))?;
//! for _tick in 0..3 {                                         // every poll_interval
//!     if let Some((stmt, token)) = nt.poll_sql() {
//!         for Notification { channel, payload, pid } in nt.polled(token, run(&stmt))? {
//!             println!("{channel}: {payload} (from {pid})");
//!         }
//!     }
//!     if let Some(select) = nt.cleanup_sql() {               // retention
//!         let expired: Vec<u64> = run(&select).iter().map(|row| row.id).collect();
//!         let deleted = match nt.delete_sql(&expired) {
//!             Some(delete) => { run(&delete); expired.len() as u64 }
//!             None => 0,
//!         };
//!         nt.cleaned(Some(deleted));
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod channel;
mod config;
mod dialect;
mod duration;
mod error;
mod position;
mod statement;
mod table;

pub use channel::{MAX_CHANNEL_CHARS, MAX_PAYLOAD_BYTES, check_channel, check_payload};
pub use config::{Config, MAX_CLEANUP_LIMIT, MAX_TABLE_LEN};
pub use dialect::{Dialect, PG_DURABLE_MARK, PG_MAX_TABLE_LEN};
pub use duration::{DurationError, DurationRange, MAX_DURATION, MIN_POLL_INTERVAL, parse_duration};
pub use error::{ConfigError, Error};
pub use position::{Ahead, FirstWindow, Gap, MAX_GAPS, Position};
pub use statement::{Notification, Row, Statement, Value};
pub use table::{MAX_CHANNELS, MAX_HELD_CHANNELS, NotifyTable, PollToken};
