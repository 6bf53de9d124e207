//! The turn to write on a database with one writer (SQLite), held by the broker: the
//! transaction left open for the next transactional batch, and who waits for it. How
//! batches take it and share its commit is in `writer`.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use sqlx::Transaction;
use tokio::sync::{Mutex, oneshot};

use crate::error::Error;
use crate::sql::Db;

/// The turn to write on a database with one writer, and the transaction left open for
/// the next batch.
#[derive(Debug)]
pub(crate) struct Turns<DB: Db> {
    pub(in crate::broker) turn: Arc<Mutex<Turn<DB>>>,
    /// Batches waiting for the turn.
    pub(in crate::broker) waiting: Arc<AtomicUsize>,
}

impl<DB: Db> Default for Turns<DB> {
    fn default() -> Self {
        Turns { turn: Arc::new(Mutex::new(Turn { open: None, groups: 0 })), waiting: Arc::default() }
    }
}

#[derive(Debug)]
pub(crate) struct Turn<DB: Db> {
    pub(in crate::broker) open: Option<Group<DB>>,
    /// Groups begun so far: each its number.
    pub(in crate::broker) groups: u64,
}

/// A transaction consecutive batches share.
pub(crate) struct Group<DB: Db> {
    pub(in crate::broker) tx: Transaction<'static, DB>,
    pub(in crate::broker) number: u64,
    pub(in crate::broker) batches: usize,
    pub(in crate::broker) began: Instant,
    /// The batches before this one, each told whether the group committed.
    pub(in crate::broker) waiting: Vec<oneshot::Sender<bool>>,
}

impl<DB: Db> std::fmt::Debug for Group<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("number", &self.number).field("batches", &self.batches).finish()
    }
}

impl<DB: Db> Group<DB> {
    /// Commits (or, when `commit` is false, rolls back) and tells every batch of it.
    pub(in crate::broker) async fn end(mut self, commit: bool) -> Result<bool, Error> {
        let waiting = std::mem::take(&mut self.waiting);
        let ended = match commit {
            true => self.tx.commit().await.map(|()| true),
            false => self.tx.rollback().await.map(|()| false),
        };
        let committed = matches!(ended, Ok(true));
        for batch in waiting {
            let _ = batch.send(committed);
        }
        Ok(ended?)
    }
}
