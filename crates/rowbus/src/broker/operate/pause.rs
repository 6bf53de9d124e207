//! Pausing and resuming a queue or one of its groups. The state is rows of the queue's
//! pause table (`<table>_pause`, made by [`Queue::deploy`]), so it holds for every process
//! and outlives them; the claims themselves skip a paused group, so a subscription
//! anywhere takes nothing from it from its next claim on, and finishes what it holds.

use std::sync::Arc;

use crate::broker::exec::{queue_error, to_the_end};
use crate::broker::publish::insert;
use crate::broker::{Queue, check_group};
use crate::driver::Arg;
use crate::error::Error;
use crate::sql::Db;

/// What is paused in a queue, as [`Queue::paused`] reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Paused {
    /// The whole queue: every group, whatever `groups` says.
    pub queue: bool,
    /// Groups paused one by one (`""` is the default group), by name.
    pub groups: Vec<String>,
}

impl Paused {
    /// Whether claims of `group` are held: the queue or that group is paused.
    pub fn covers(&self, group: &str) -> bool {
        self.queue || self.groups.iter().any(|g| g == group)
    }
}

impl<DB: Db> Queue<DB> {
    /// Pauses the whole queue (`None`) or one group: from their next claim on, the
    /// subscriptions of every process take nothing from it (they finish what they hold
    /// and wait their poll interval); publishing goes on. Wakes this broker's
    /// subscriptions, and with `listen_notify` other processes', so that they see it at
    /// once. Returns whether it was not paused so already (pausing twice is harmless).
    ///
    /// Needs the pause table: a queue deployed by an older rowbus gets it from a new
    /// [`deploy`](Self::deploy) ([`Error::MissingPauseTable`] until then). A pause whose
    /// future is dropped once polled runs to its end all the same.
    pub async fn pause(&self, group: Option<&str>) -> Result<bool, Error> {
        let (queue, group) = (self.clone(), group.map(str::to_owned));
        let changed = to_the_end(async move {
            let sql = &queue.sql.pause;
            match group.as_deref() {
                None => queue.run_pause_sql(&sql.pause_queue, None).await,
                Some(group) => queue.run_pause_sql(&sql.pause_group, Some(group)).await,
            }
        })
        .await?;
        Ok(changed > 0)
    }

    /// Lifts a pause: `None` lifts every pause of the queue, the whole queue's and each
    /// group's; `Some(group)` lifts that group's own pause (while the whole queue is
    /// paused, the group still waits for it). Wakes the subscriptions as
    /// [`pause`](Self::pause) does, so that they claim again at once. Returns how many
    /// pauses it lifted. Runs to its end when its future is dropped once polled.
    pub async fn resume(&self, group: Option<&str>) -> Result<u64, Error> {
        let (queue, group) = (self.clone(), group.map(str::to_owned));
        to_the_end(async move {
            let sql = &queue.sql.pause;
            match group.as_deref() {
                None => queue.run_pause_sql(&sql.resume_queue, None).await,
                Some(group) => queue.run_pause_sql(&sql.resume_group, Some(group)).await,
            }
        })
        .await
    }

    /// What is paused in this queue now.
    pub async fn paused(&self) -> Result<Paused, Error> {
        let mut conn = self.inner().pool.acquire().await?;
        let rows = DB::fetch_rows(&mut conn, &self.sql.pause.list, &[], 1)
            .await
            .map_err(|e| queue_error(self, e))?;
        let mut paused = Paused::default();
        for row in rows {
            if row.int(0) == 1 {
                paused.queue = true;
            } else {
                paused.groups.push(row.text(0).to_owned());
            }
        }
        Ok(paused)
    }

    /// Whether claims of `group` are held now: the queue or the group is paused.
    pub async fn is_paused(&self, group: &str) -> Result<bool, Error> {
        check_group(group)?;
        Ok(self.paused().await?.covers(group))
    }

    /// Runs a pause table statement, which binds `group` if it names one; then wakes the
    /// subscriptions of that group (all of the queue's for none), here and, with
    /// `listen_notify`, elsewhere. The rows it changed.
    async fn run_pause_sql(&self, sql: &Arc<str>, group: Option<&str>) -> Result<u64, Error> {
        if let Some(group) = group {
            check_group(group)?;
        }
        let args: Vec<Arg<'_>> = group.map(Arg::Text).into_iter().collect();
        let mut conn = self.inner().pool.acquire().await?;
        let changed = DB::execute(&mut conn, sql, &args).await.map_err(|e| queue_error(self, e))?;
        // An empty payload wakes every group of the table in the other processes.
        insert::wake_others(self, &mut conn, &[group.unwrap_or("").to_owned()]).await;
        drop(conn);
        self.inner().wakers.wake(self.table().channel(), group);
        Ok(changed)
    }
}
