//! Push: how a listener learns that another session committed, without reading the notify
//! table. MySQL/MariaDB read the server's binary log as a replica does (`binlog.rs`, the
//! `binlog` feature); SQLite watches the database's files (`watch.rs`); PostgreSQL has
//! LISTEN and needs neither. A push path runs in a task of its own (`task.rs`), beside the
//! listener's connection, and reports commits that may have written the notify table: the
//! table stays the record, read by the same core, and a push only ends the wait for the
//! next poll early. A database's [`TableConn::push`](super::TableConn::push) starts it.
//!
//! Where the server refuses it (no binary log, no privilege, no file), the listener polls
//! as it did without it, and says why once.
// Built without a database that pushes (PostgreSQL alone, MySQL without `binlog`), the
// task has no source to run.
#![cfg_attr(not(any(feature = "binlog", feature = "sqlite")), allow(dead_code, unused_imports))]

#[cfg(feature = "binlog")]
pub(crate) mod binlog;
mod task;
#[cfg(feature = "sqlite")]
pub(crate) mod watch;

pub use task::{PushEvent, PushHandle, PushState, Pushed, spawn};
