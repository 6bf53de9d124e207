//! A queue's dead letters for its operators: reading them, putting them back in the queue,
//! purging them.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify_table::DurationRange;

use crate::broker::exec::{micros, retrying, to_the_end};
use crate::broker::publish::insert;
use crate::broker::{Queue, check_group};
use crate::driver::{Arg, DeadRow};
use crate::error::{Error, check_duration};
use crate::sql::{Db, begin};

/// Most dead letters one statement (or one requeue's transaction) takes: well under every
/// database's limit on binds.
const CHUNK: usize = 500;

/// A message its queue gave up on (it used its attempts, or its handler dead-lettered it),
/// as the queue's dead-letter table (`<table>_dead`) keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its id, the one it had in the queue (and has again once requeued).
    pub id: i64,
    /// Its group.
    pub group: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The attempts it had when it died.
    pub attempts: i64,
    /// Why it died: its handler's last error (for a library handler, the error and its
    /// causes; for `rowbus consume --exec`, the exit status and the end of its stderr).
    pub last_error: Option<String>,
    /// When it was published.
    pub published_at: SystemTime,
    /// When it was dead-lettered.
    pub died_at: SystemTime,
    /// Its priority.
    pub priority: i16,
    /// Its ordering key, if it had one.
    pub key: Option<String>,
    /// Its headers.
    pub headers: crate::broker::Headers,
}

/// An empty letter (id 0, no payload, published and died at the Unix epoch): with its
/// fields set one by one, what a test of code that shows letters starts from (the struct
/// may grow, so it is not built field by field outside rowbus).
impl Default for DeadLetter {
    fn default() -> Self {
        DeadLetter {
            id: 0,
            group: String::new(),
            payload: Vec::new(),
            attempts: 0,
            last_error: None,
            published_at: SystemTime::UNIX_EPOCH,
            died_at: SystemTime::UNIX_EPOCH,
            priority: 0,
            key: None,
            headers: Default::default(),
        }
    }
}

impl DeadLetter {
    fn from_row(row: DeadRow) -> Self {
        DeadLetter {
            id: row.id,
            group: row.group,
            payload: row.payload,
            attempts: row.attempts,
            last_error: row.last_error,
            published_at: at_micros(row.created_at),
            died_at: at_micros(row.failed_at),
            priority: i16::try_from(row.priority).unwrap_or_default(),
            key: row.key,
            headers: crate::broker::publish::message::decode_headers(row.headers.as_deref()),
        }
    }
}

/// The time `us` microseconds after the Unix epoch (before it, the epoch).
fn at_micros(us: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// Which page of a queue's dead letters [`Queue::dead_letters`] returns: newest first
/// (the latest to die first), `limit` of them after skipping `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPage {
    /// Only this group's; every group's when `None`.
    pub group: Option<String>,
    /// The most to return (100 by default).
    pub limit: u32,
    /// How many newer ones to skip: the previous pages' dead letters.
    pub offset: u64,
}

impl Default for DeadLetterPage {
    fn default() -> Self {
        DeadLetterPage { group: None, limit: 100, offset: 0 }
    }
}

/// Which dead letters a requeue or a purge takes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetters {
    /// These (ids that are not dead letters are passed over).
    Ids(Vec<i64>),
    /// Every one.
    All,
    /// Those dead-lettered longer ago than this: at most
    /// [`MAX_DURATION`](crate::limits::MAX_DURATION).
    OlderThan(Duration),
}

impl<DB: Db> Queue<DB> {
    /// A page of this queue's dead letters, newest first.
    pub async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>, Error> {
        if let Some(group) = &page.group {
            check_group(group)?;
        }
        let sql = Arc::from(self.sql.dead_list(page.group.is_some()));
        let mut args: Vec<Arg<'_>> = page.group.as_deref().map(Arg::Text).into_iter().collect();
        args.push(Arg::Int(i64::from(page.limit)));
        args.push(Arg::Int(i64::try_from(page.offset).unwrap_or(i64::MAX)));
        self.fetch_dead(&sql, &args).await
    }

    /// The dead letter `id`, if there is one.
    pub async fn dead_letter(&self, id: i64) -> Result<Option<DeadLetter>, Error> {
        let sql = Arc::from(self.sql.dead_get());
        Ok(self.fetch_dead(&sql, &[Arg::Int(id)]).await?.into_iter().next())
    }

    async fn fetch_dead(&self, sql: &Arc<str>, args: &[Arg<'_>]) -> Result<Vec<DeadLetter>, Error> {
        let pool = &self.inner().pool;
        let rows =
            retrying(self, || async move { DB::fetch_dead(&mut *pool.acquire().await?, sql, args).await })
                .await?;
        Ok(rows.into_iter().map(DeadLetter::from_row).collect())
    }

    /// Puts dead letters back in the queue, claimable after `delay` (at most
    /// [`MAX_DURATION`](crate::limits::MAX_DURATION)): same id, group, payload and publish time,
    /// their attempts counted again from 0. Returns how many it moved. Wakes this broker's
    /// subscriptions of their groups, and with `listen_notify` those of other processes.
    ///
    /// Each one moves once: the move locks the dead letters it takes, and a requeue of
    /// the same ones at the same time finds them gone and moves nothing. A requeue whose
    /// future is dropped once polled runs to its end all the same.
    pub async fn requeue_dead(&self, which: &DeadLetters, delay: Duration) -> Result<u64, Error> {
        let (queue, which) = (self.clone(), which.clone());
        to_the_end(async move { queue.requeue_dead_now(&which, delay).await }).await
    }

    /// [`requeue_dead`](Self::requeue_dead) itself.
    async fn requeue_dead_now(&self, which: &DeadLetters, delay: Duration) -> Result<u64, Error> {
        check_duration("delay", delay, DurationRange::Span)?;
        let delay = micros(delay);
        let (mut moved, mut groups) = (0, Vec::new());
        match which {
            DeadLetters::Ids(ids) => {
                for chunk in ids.chunks(CHUNK) {
                    let lock = Arc::from(self.sql.dead_lock_ids(chunk.len()));
                    let args: Vec<Arg<'_>> = chunk.iter().copied().map(Arg::Int).collect();
                    let (n, _) = self.move_locked(&lock, &args, delay, &mut groups).await?;
                    moved += n;
                }
            }
            DeadLetters::All | DeadLetters::OlderThan(_) => {
                let older = self.older_than(which)?;
                let lock = Arc::from(self.sql.dead_lock_some(older.is_some()));
                let args: Vec<Arg<'_>> = older.into_iter().chain([CHUNK as i64]).map(Arg::Int).collect();
                loop {
                    let (n, locked) = self.move_locked(&lock, &args, delay, &mut groups).await?;
                    moved += n;
                    if locked < CHUNK {
                        break;
                    }
                }
            }
        }
        groups.sort_unstable();
        groups.dedup();
        self.wake(&groups).await;
        Ok(moved)
    }

    /// In one transaction: locks the dead letters `lock` returns, copies them into the
    /// queue table and deletes them. How many it moved and how many it locked; their
    /// groups are added to `groups`.
    async fn move_locked(
        &self,
        lock: &Arc<str>,
        args: &[Arg<'_>],
        delay: i64,
        groups: &mut Vec<String>,
    ) -> Result<(u64, usize), Error> {
        let (pool, sql) = (&self.inner().pool, &*self.sql);
        let (moved, rows) = retrying(self, || async move {
            let mut tx = begin(pool, DB::WRITE_BEGIN).await?;
            let rows = DB::fetch_rows(&mut tx, lock, args, 1).await?;
            if rows.is_empty() {
                return Ok((0, rows));
            }
            let ids: Vec<Arg<'_>> = rows.iter().map(|row| Arg::Int(row.int(0))).collect();
            let insert = Arc::from(sql.dead_requeue(ids.len()));
            let insert_args: Vec<Arg<'_>> =
                std::iter::once(Arg::Int(delay)).chain(ids.iter().copied()).collect();
            DB::execute(&mut tx, &insert, &insert_args).await?;
            DB::requeued(&mut tx, sql, &ids).await?;
            let moved = DB::execute(&mut tx, &Arc::from(sql.dead_delete(ids.len())), &ids).await?;
            tx.commit().await?;
            Ok((moved, rows))
        })
        .await?;
        let locked = rows.len();
        groups.extend(rows.into_iter().filter_map(|row| row.texts.into_iter().next()));
        Ok((moved, locked))
    }

    /// Wakes the subscriptions of `groups`: this broker's, and with `listen_notify` other
    /// processes'.
    async fn wake(&self, groups: &[String]) {
        if groups.is_empty() {
            return;
        }
        insert::wake_others_pooled(self, groups).await;
        for group in groups {
            self.inner().wakers.wake(self.table().channel(), Some(group));
        }
    }

    /// Deletes dead letters for good. Returns how many it deleted. Runs to its end when its
    /// future is dropped once polled.
    pub async fn purge_dead(&self, which: &DeadLetters) -> Result<u64, Error> {
        let (queue, which) = (self.clone(), which.clone());
        to_the_end(async move { queue.purge_dead_now(&which).await }).await
    }

    /// [`purge_dead`](Self::purge_dead) itself.
    async fn purge_dead_now(&self, which: &DeadLetters) -> Result<u64, Error> {
        match which {
            DeadLetters::Ids(ids) => {
                let mut purged = 0;
                for chunk in ids.chunks(CHUNK) {
                    let args: Vec<Arg<'_>> = chunk.iter().copied().map(Arg::Int).collect();
                    purged += self.execute(&Arc::from(self.sql.dead_delete(chunk.len())), &args).await?;
                }
                Ok(purged)
            }
            DeadLetters::All | DeadLetters::OlderThan(_) => {
                let older = self.older_than(which)?;
                let args: Vec<Arg<'_>> = older.into_iter().map(Arg::Int).collect();
                self.execute(&Arc::from(self.sql.dead_purge(older.is_some())), &args).await
            }
        }
    }

    /// For [`DeadLetters::OlderThan`], the µs from now to its cut-off (negative), checked.
    fn older_than(&self, which: &DeadLetters) -> Result<Option<i64>, Error> {
        match which {
            DeadLetters::OlderThan(age) => {
                check_duration("older_than", *age, DurationRange::Span)?;
                Ok(Some(-micros(*age)))
            }
            _ => Ok(None),
        }
    }

    async fn execute(&self, sql: &Arc<str>, args: &[Arg<'_>]) -> Result<u64, Error> {
        let pool = &self.inner().pool;
        retrying(self, || async move { DB::execute(&mut *pool.acquire().await?, sql, args).await }).await
    }
}
