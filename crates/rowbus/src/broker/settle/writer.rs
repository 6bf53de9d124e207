//! The transaction a transactional batch runs in: its own where writers run side by side;
//! on a database with one writer (SQLite), one that consecutive batches of the broker share.
//!
//! SQLite runs one write transaction at a time, so a broker's transactional batches take
//! turns anyway (see [`Claiming::ONE_WRITER`](crate::sql::Claiming::ONE_WRITER)), and each
//! paid a commit of its own: a WAL write and an fsync, about a third of a 100-row batch's
//! time. A batch that finds others waiting for the turn now leaves its transaction open
//! for the next one instead of committing it, and waits for the commit that ends the group:
//! the last batch of a group (no one waiting, [`MAX_BATCHES`] taken, or the transaction
//! open for [`MAX_OPEN`]) commits for all of them. Each batch's handler runs inside the
//! group's transaction behind its own savepoint, so a failed handler still undoes only its
//! own writes and puts only its own rows back. A batch's writes and its messages'
//! deletion still commit together, or not at all: a group commits or rolls back as one,
//! and a batch reports its messages handled only once the commit succeeded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::Transaction;
use tokio::sync::{Mutex, OwnedMutexGuard, oneshot};

use crate::broker::Queue;
use crate::broker::claim::claims::{claim_locked, take_in};
use crate::broker::settle::turns::{Group, Turn};
use crate::driver::ClaimedRow;
use crate::error::Error;
use crate::sql::Db;

/// The most batches one shared transaction carries.
const MAX_BATCHES: usize = 16;
/// The longest a shared transaction takes more batches: a batch's commit waits at most
/// about this long for the batches after it.
const MAX_OPEN: Duration = Duration::from_millis(10);
/// How long a group left open for the next batch waits for it before a task of its own
/// commits it: a batch counted as waiting for the turn may have gone away (its task
/// aborted) before it came to take the group on.
const UNCLAIMED_GROUP: Duration = Duration::from_millis(25);

/// Counts a batch as waiting for the turn while it exists.
struct Waiting(Arc<AtomicUsize>);

impl Waiting {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Waiting(count.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The transaction one transactional batch runs in.
pub(crate) struct Write<DB: Db>(Kind<DB>);

enum Kind<DB: Db> {
    /// Its own.
    Own(Transaction<'static, DB>),
    /// Its group's, with the turn.
    Shared { turn: OwnedMutexGuard<Turn<DB>>, group: Group<DB>, waiting: Arc<AtomicUsize> },
}

impl<DB: Db> Write<DB> {
    /// Takes up to `limit` ready messages of `group` for a transactional handler (see
    /// [`claim_locked`]), in a transaction of its own or, on a database with one writer,
    /// its turn's.
    pub async fn claim(
        queue: &Queue<DB>,
        group: &str,
        limit: usize,
    ) -> Result<(Self, Vec<ClaimedRow>), Error> {
        if !DB::ONE_WRITER {
            let (tx, rows) = claim_locked(queue, group, limit).await?;
            return Ok((Write(Kind::Own(tx)), rows));
        }
        let turns = &queue.inner().turns;
        let waiting = Waiting::new(&turns.waiting);
        let mut turn = turns.turn.clone().lock_owned().await;
        drop(waiting);
        let (mut group, rows) = match turn.open.take() {
            Some(mut open) => match take_in(queue, &mut open.tx, group, limit).await {
                Ok(rows) => (open, rows),
                Err(error) => {
                    // The batches before it are undone with it: they learn so.
                    let _ = open.end(false).await;
                    return Err(error);
                }
            },
            None => {
                let (tx, rows) = claim_locked(queue, group, limit).await?;
                turn.groups += 1;
                let began = Instant::now();
                (Group { tx, number: turn.groups, batches: 0, began, waiting: Vec::new() }, rows)
            }
        };
        if !rows.is_empty() {
            group.batches += 1;
        }
        Ok((Write(Kind::Shared { turn, group, waiting: turns.waiting.clone() }), rows))
    }

    /// The transaction, for the handler and the batch's own statements.
    pub fn tx(&mut self) -> &mut Transaction<'static, DB> {
        match &mut self.0 {
            Kind::Own(tx) => tx,
            Kind::Shared { group, .. } => &mut group.tx,
        }
    }

    /// Ends the batch: `ok` when its statements all went through. Whether its writes
    /// committed (`false`: rolled back, with its group's when it had one). `took` says
    /// whether the batch took any rows; one that took none waits for nobody.
    pub async fn finish(self, ok: bool, took: bool) -> Result<bool, Error> {
        let (turn, mut group, waiting) = match self.0 {
            Kind::Own(tx) if ok && took => return tx.commit().await.map(|()| true).map_err(Error::from),
            Kind::Own(tx) if ok => return tx.rollback().await.map(|()| true).map_err(Error::from),
            Kind::Own(tx) => return tx.rollback().await.map(|()| false).map_err(Error::from),
            Kind::Shared { turn, group, waiting } => (turn, group, waiting),
        };
        if !ok {
            let ended = group.end(false).await;
            drop(turn);
            return ended;
        }
        if group.batches == 0 {
            // A fresh transaction that took nothing.
            let ended = group.end(false).await;
            drop(turn);
            return ended.map(|_| true);
        }
        let more = waiting.load(Ordering::Acquire) > 0
            && group.batches < MAX_BATCHES
            && group.began.elapsed() < MAX_OPEN;
        if !more {
            let ended = group.end(true).await;
            drop(turn);
            return ended;
        }
        // Leave it open for the next batch, and wait for the commit that ends it.
        let (told, outcome) = oneshot::channel();
        if took {
            group.waiting.push(told);
        }
        let number = group.number;
        let mut turn = turn;
        turn.open = Some(group);
        // Not this batch's task, which its runner may abort: the group must end even then.
        tokio::spawn(close_unclaimed(OwnedMutexGuard::mutex(&turn).clone(), number));
        drop(turn);
        if !took {
            return Ok(true);
        }
        // Dropped without a word: the group went with a task that was aborted (rolled back).
        Ok(outcome.await.unwrap_or(false))
    }
}

/// Commits the group `number` if it is still open after [`UNCLAIMED_GROUP`]: the batch
/// counted as waiting for the turn went away, or its runner was stopped.
async fn close_unclaimed<DB: Db>(turn: Arc<Mutex<Turn<DB>>>, number: u64) {
    tokio::time::sleep(UNCLAIMED_GROUP).await;
    let mut turn = turn.lock().await;
    if turn.open.as_ref().is_some_and(|group| group.number == number) {
        let group = turn.open.take().expect("just seen");
        // Its batches learn the outcome (false if the commit failed).
        if let Err(error) = group.end(true).await {
            tracing::warn!(%error, "committing a shared transactional group failed; its messages are claimable again");
        }
    }
}
