//! Cancelling messages: removed from the queue whatever their state (ready, delayed,
//! waiting for a retry, or running), into the kept history as cancelled where the queue
//! keeps history; a runner holding one asks its handler to stop.

use std::sync::Arc;

use crate::broker::claim::wake::CONTROL_GROUP;
use crate::broker::exec::{retrying, to_the_end};
use crate::broker::operate::counts::{self, Counted};
use crate::broker::operate::history::{arcs, load, move_in};
use crate::broker::publish::insert;
use crate::broker::settle::lease;
use crate::broker::{Queue, check_group};
use crate::driver::{Arg, TextsAndInts};
use crate::error::Error;
use crate::sql::{Db, begin};

/// Most messages one cancel's transaction takes: well under every database's limit on
/// binds. A longer list, or a whole group, goes in several transactions.
const CHUNK: usize = 500;

/// Which messages [`Queue::cancel_which`] cancels.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cancel {
    /// These ids (those not in the queue are passed over).
    Ids(Vec<i64>),
    /// Every message of this group (`""`: the default group), whatever its state.
    Group(String),
}

/// What a cancel did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cancelled {
    /// The ids removed from the queue, lowest first.
    pub ids: Vec<i64>,
    /// Those of them that were running (held under a lease that had not run out): their
    /// runner asks its handler to stop (see [`Delivery::cancelled`](crate::broker::Delivery::cancelled)).
    pub running: Vec<i64>,
}

impl Cancelled {
    /// How many were cancelled.
    pub fn count(&self) -> u64 {
        self.ids.len() as u64
    }
}

/// One locked row: group, then id, running, keyed.
struct Locked {
    group: String,
    id: i64,
    running: bool,
    keyed: bool,
}

impl Locked {
    fn of(row: TextsAndInts) -> Self {
        Locked {
            id: row.int(0),
            running: row.int(1) == 1,
            keyed: row.int(2) == 1,
            group: row.text(0).to_owned(),
        }
    }
}

impl<DB: Db> Queue<DB> {
    /// Cancels the messages `ids`, whatever their state: a ready, delayed or retrying one
    /// is removed and never claimed again; a running one is removed too, and its runner,
    /// in this process or another, asks its handler to stop (at its next look: within its
    /// poll interval, at once with `listen_notify`), gives it its grace period, then drops
    /// it; its acknowledgement, if it comes, is refused. A cancelled message frees its
    /// ordering key at once. Where the queue keeps history, each goes there as
    /// `cancelled`. Ids not in the queue are passed over; each id is cancelled once, also
    /// by racing cancels (the rows are locked, then removed, in one transaction per 500
    /// ids). A cancel whose future is dropped once polled runs to its end all the same.
    pub async fn cancel(&self, ids: &[i64]) -> Result<Cancelled, Error> {
        self.cancel_which(&Cancel::Ids(ids.to_vec())).await
    }

    /// Cancels every message of `group` (`""`: the default group), whatever its state, as
    /// [`cancel`](Self::cancel) does.
    pub async fn cancel_group(&self, group: &str) -> Result<Cancelled, Error> {
        self.cancel_which(&Cancel::Group(group.to_owned())).await
    }

    /// Cancels `which` (see [`cancel`](Self::cancel)).
    pub async fn cancel_which(&self, which: &Cancel) -> Result<Cancelled, Error> {
        let (queue, which) = (self.clone(), which.clone());
        to_the_end(async move { queue.cancel_now(&which).await }).await
    }

    /// [`cancel_which`](Self::cancel_which) itself.
    async fn cancel_now(&self, which: &Cancel) -> Result<Cancelled, Error> {
        // Whether to move them into the history: the queue's setting, read now.
        load(self).await?;
        let mut locked = Vec::new();
        match which {
            Cancel::Ids(ids) => {
                let mut ids = ids.clone();
                ids.sort_unstable();
                ids.dedup();
                for chunk in ids.chunks(CHUNK) {
                    let lock = Arc::from(self.sql.cancel_lock_ids(chunk.len()));
                    let args: Vec<Arg<'_>> = chunk.iter().copied().map(Arg::Int).collect();
                    locked.extend(self.cancel_locked(&lock, &args).await?);
                }
            }
            Cancel::Group(group) => {
                check_group(group)?;
                let lock = Arc::from(self.sql.cancel_lock_group());
                let args = [Arg::Text(group), Arg::Int(CHUNK as i64)];
                loop {
                    let rows = self.cancel_locked(&lock, &args).await?;
                    let full = rows.len() >= CHUNK;
                    locked.extend(rows);
                    if !full {
                        break;
                    }
                }
            }
        }
        self.inner().counters.cancelled(locked.len() as u64);
        counts::count(self, Counted::Cancelled, locked.len() as u64).await;
        self.after_cancel(&locked).await;
        let mut done = Cancelled::default();
        for row in &locked {
            done.ids.push(row.id);
            if row.running {
                done.running.push(row.id);
            }
        }
        done.ids.sort_unstable();
        done.running.sort_unstable();
        Ok(done)
    }

    /// In one transaction: locks the rows `lock` returns, then removes them (into the
    /// history where the queue keeps it). What it removed.
    async fn cancel_locked(&self, lock: &Arc<str>, args: &[Arg<'_>]) -> Result<Vec<Locked>, Error> {
        let (pool, sql, keeping) = (&self.inner().pool, &*self.sql, self.keeps());
        let rows = retrying(self, || async move {
            let mut tx = begin(pool, DB::WRITE_BEGIN).await?;
            let rows = DB::fetch_rows(&mut tx, lock, args, 1).await?;
            if rows.is_empty() {
                tx.rollback().await?;
                return Ok(rows);
            }
            let ids: Vec<Arg<'_>> = rows.iter().map(|row| Arg::Int(row.int(0))).collect();
            if keeping {
                move_in::<DB>(&mut tx, &arcs(sql.history.cancel_ids(ids.len())), &ids).await?;
            } else {
                DB::execute(&mut tx, &sql.delete_ids(ids.len()), &ids).await?;
            }
            tx.commit().await?;
            Ok(rows)
        })
        .await?;
        Ok(rows.into_iter().map(Locked::of).collect())
    }

    /// After a cancel committed: the keys it freed cleaned up after and their groups
    /// woken; the runners holding what was running told, here and (with `listen_notify`)
    /// in other processes.
    async fn after_cancel(&self, locked: &[Locked]) {
        let keyed: Vec<i64> = locked.iter().filter(|row| row.keyed).map(|row| row.id).collect();
        lease::keys_gone(self, &keyed).await;
        let mut groups: Vec<String> =
            locked.iter().filter(|row| row.keyed).map(|row| row.group.clone()).collect();
        if locked.iter().any(|row| row.running) {
            groups.push(CONTROL_GROUP.to_owned());
        }
        groups.sort_unstable();
        groups.dedup();
        if groups.is_empty() {
            return;
        }
        insert::wake_others_pooled(self, &groups).await;
        for group in &groups {
            self.inner().wakers.wake(self.table().channel(), Some(group));
        }
    }
}
