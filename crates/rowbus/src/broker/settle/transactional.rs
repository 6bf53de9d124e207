//! The transactional runners: a handler runs inside the transaction that locked its
//! messages, and their deletion commits with the handler's writes.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::sync::Arc;

use futures::future::BoxFuture;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};
use tokio::task::JoinSet;
use tracing::{Instrument as _, debug, info_span, warn};

use crate::broker::claim::limited;
use crate::broker::claim::runner::{Turn, drain, drive, free_workers, outcome};
use crate::broker::claim::subscription::{Claimer, Pace, SubscriptionBuilder};
use crate::broker::exec::queue_error;
use crate::broker::operate::counts::{self, Counted};
use crate::broker::operate::history::record;
use crate::broker::publish::message::decode_headers;
use crate::broker::settle::lease::{
    handler_retry, handler_snooze, move_dead, restore_failed, restore_snoozed,
};
use crate::broker::settle::writer::Write;
use crate::broker::telemetry;
use crate::broker::{BatchOutcome, Headers, Outcome, Queue, TxMessage};
use crate::driver::ClaimedRow;
use crate::error::Error;
use crate::sql::Db;
use crate::sql::Moved;

impl<DB: Db> SubscriptionBuilder<DB> {
    /// Runs `handler` inside the claim's transaction, up to `workers` at once: its writes
    /// and the message's deletion commit together or not at all (exactly-once effects in
    /// the database). `Err` or a panic rolls back and counts the attempt.
    ///
    /// ```no_run
    /// # async fn f(queue: rowbus::Queue<sqlx::Postgres>) -> Result<(), rowbus::Error> {
    /// queue.subscribe().workers(4).run_tx(|conn, message| Box::pin(async move {
    ///     sqlx::query("INSERT INTO effects (message_id) VALUES ($1)")
    ///         .bind(message.id())
    ///         .execute(&mut *conn)
    ///         .await?;
    ///     Ok::<_, sqlx::Error>(())
    /// })).await
    /// # }
    /// ```
    pub async fn run_tx<F, O, E>(self, handler: F) -> Result<(), Error>
    where
        F: for<'c> Fn(&'c mut DB::Connection, TxMessage) -> BoxFuture<'c, Result<O, E>>
            + Send
            + Sync
            + 'static,
        O: Into<Outcome> + Send + 'static,
        E: Display + Send + 'static,
    {
        self.run_locked(1, move |conn, mut rows| {
            let row = rows.pop().expect("a transactional claim hands over at least one row");
            let handled = outcome::<_, _, _, Outcome>(handler(conn, TxMessage::locked(row)));
            Box::pin(async move { handled.await.map(BatchOutcome::All) })
        })
        .await
    }

    /// Runs `handler` on batches of up to `batch` messages inside the transaction that
    /// locked them, `workers` batches at once: the handler's writes and the deletion of
    /// the whole batch commit together or not at all. An [`Outcome`] applies to the whole
    /// batch; a [`BatchOutcome`] may dead-letter some of its messages and acknowledge the
    /// rest, or undo the batch without a trace. `Err` or a panic rolls back and counts an
    /// attempt of every message in it.
    ///
    /// This is the cheapest way to drain a queue: a batch costs one transaction (take the
    /// rows, handle them, commit) where a leased batch costs two (claim, then acknowledge).
    /// The price is a transaction, and a pooled connection, held open while the handler
    /// runs; on SQLite that transaction holds the database's single write lock.
    ///
    /// ```no_run
    /// # async fn f(queue: rowbus::Queue<sqlx::Postgres>) -> Result<(), rowbus::Error> {
    /// queue.subscribe().batch(100).run_batch_tx(|conn, messages| Box::pin(async move {
    ///     let ids: Vec<i64> = messages.iter().map(|m| m.id()).collect();
    ///     sqlx::query("INSERT INTO effects (message_id) SELECT * FROM UNNEST($1::BIGINT[])")
    ///         .bind(ids)
    ///         .execute(&mut *conn)
    ///         .await?;
    ///     Ok::<_, sqlx::Error>(())
    /// })).await
    /// # }
    /// ```
    pub async fn run_batch_tx<F, O, E>(self, handler: F) -> Result<(), Error>
    where
        F: for<'c> Fn(&'c mut DB::Connection, Vec<TxMessage>) -> BoxFuture<'c, Result<O, E>>
            + Send
            + Sync
            + 'static,
        O: Into<BatchOutcome> + Send + 'static,
        E: Display + Send + 'static,
    {
        let batch = self.batch;
        self.run_locked(batch, move |conn, rows| {
            Box::pin(outcome(handler(conn, rows.into_iter().map(TxMessage::locked).collect())))
        })
        .await
    }

    /// Both: a transaction per free worker, each taking up to `limit` rows for itself.
    async fn run_locked<H>(self, limit: usize, handler: H) -> Result<(), Error>
    where
        H: for<'c> Fn(&'c mut DB::Connection, Vec<ClaimedRow>) -> BoxFuture<'c, Result<BatchOutcome, String>>
            + Send
            + Sync
            + 'static,
    {
        let claimer = Claimer::start(&self).await?;
        refuse_limited(&self.queue, &self.group).await?;
        let turn = Locked {
            handler: Arc::new(handler),
            workers: Arc::new(Semaphore::new(self.workers)),
            max: self.workers,
            limit,
            short: true,
            gone: Arc::new(watch::Sender::new(false)),
        };
        drive(claimer, turn, None, self.shutdown_timeout).await;
        Ok(())
    }
}

/// Refuses a transactional subscription of a group some limit applies to
/// ([`Error::LimitedTransactional`]): its claims take nothing there (they carry the
/// limits check), and it would wait for ever. After the registration for wake-ups, so
/// that a limit cleared meanwhile is not missed either way.
async fn refuse_limited<DB: Db>(queue: &Queue<DB>, group: &str) -> Result<(), Error> {
    let q = queue.clone();
    let g = group.to_owned();
    let applies = crate::sql::Finishing::new(|_| async move { limited::applies(&q, &g).await })
        .await
        .map_err(|e| queue_error(queue, e))?;
    match applies {
        true => {
            Err(Error::LimitedTransactional { table: queue.table().to_string(), group: group.to_owned() })
        }
        false => Ok(()),
    }
}

/// The transactional runners' [`Turn`].
struct Locked<H> {
    handler: Arc<H>,
    workers: Arc<Semaphore>,
    max: usize,
    limit: usize,
    /// Whether the last round found fewer rows than it asked for (and before the first):
    /// the next round sends one claim, not one per free worker. Claims sent together
    /// while little is ready all look for the same rows: over a queue whose messages wait
    /// behind a few keys (1,400 of 7 keys, four relays of 3 batches in flight) that was up
    /// to 12 claims at once, each reading every row waiting behind the keys, for the 7 rows
    /// one of them takes.
    short: bool,
    /// `true` once the runner's future was dropped: see [`Turn::detached_when_dropped`].
    gone: Arc<watch::Sender<bool>>,
}

impl<DB, H> Turn<DB> for Locked<H>
where
    DB: Db,
    H: for<'c> Fn(&'c mut DB::Connection, Vec<ClaimedRow>) -> BoxFuture<'c, Result<BatchOutcome, String>>
        + Send
        + Sync
        + 'static,
{
    async fn free(&mut self) -> Vec<OwnedSemaphorePermit> {
        free_workers(&self.workers, self.max).await
    }

    /// Starts a transaction per worker (one after a round that found fewer rows than it
    /// asked for); the pace follows this round alone (a failure of an earlier round has
    /// had its wait already).
    async fn claim(
        &mut self,
        claimer: &mut Claimer<DB>,
        mut workers: Vec<OwnedSemaphorePermit>,
        set: &mut JoinSet<()>,
    ) -> Option<Pace> {
        if self.short {
            // The others' permits go back: the next round has them if this one is full.
            workers.truncate(1);
        }
        let mut claims = Vec::with_capacity(workers.len());
        for worker in workers {
            let (found, claimed) = oneshot::channel();
            let (handler, queue, group, limit, gone) = (
                self.handler.clone(),
                claimer.queue.clone(),
                claimer.group.clone(),
                self.limit,
                self.gone.subscribe(),
            );
            set.spawn(
                async move {
                    let _worker = worker;
                    transactional(&queue, &group, limit, &*handler, gone, found).await;
                }
                .instrument(info_span!("rowbus.transactional")),
            );
            claims.push(claimed);
        }
        let (mut all_full, mut failed) = (true, false);
        for claimed in claims {
            match claimed.await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => all_full = false,
                Ok(Err(())) | Err(_) => failed = true,
            }
        }
        self.short = !all_full || failed;
        Some(match (failed, all_full) {
            (true, _) => Pace::Failed,
            (false, true) => Pace::Now,
            (false, false) => Pace::Idle,
        })
    }

    async fn finish(self, mut set: JoinSet<()>, timeout: Duration) {
        drain(&mut set, timeout).await
    }

    /// Aborted, an attempt was cut off wherever it was, rowbus's statements included:
    /// sqlx's MySQL driver does not recover a connection whose statement was cut off while
    /// its answer was being read, and the pool waited for that connection for good. Told,
    /// an attempt whose claim is under way finishes it and gives the rows back; a handler
    /// running is dropped and its transaction rolled back, as the `Rollback` outcome does.
    fn detached_when_dropped(&self) -> Option<Arc<watch::Sender<bool>>> {
        Some(self.gone.clone())
    }
}

/// One transactional attempt: take up to `limit` rows in a transaction (locked and deleted
/// at once; on a database with one writer, the transaction consecutive batches share, see
/// [`Write`]), run the handler in it and commit; or undo the handler's writes, put the rows
/// back with the failure counted and commit that. `found` learns whether the claim filled
/// its limit.
async fn transactional<DB, H>(
    queue: &Queue<DB>,
    group: &str,
    limit: usize,
    handler: &H,
    mut gone: watch::Receiver<bool>,
    found: oneshot::Sender<Result<bool, ()>>,
) where
    DB: Db,
    H: for<'c> Fn(&'c mut DB::Connection, Vec<ClaimedRow>) -> BoxFuture<'c, Result<BatchOutcome, String>>,
{
    let counters = &queue.inner().counters;
    let (mut write, rows) = match Write::claim(queue, group, limit).await {
        Ok((write, rows)) if !rows.is_empty() => (write, rows),
        Ok((write, _)) => {
            if let Err(error) = write.finish(true, false).await {
                warn!(%error, table = %queue.table(), "ending an empty transactional claim failed");
            }
            let _ = found.send(Ok(false));
            return;
        }
        Err(error) => {
            queue.inner().claim_failed(queue.table(), &error);
            warn!(%error, table = %queue.table(), "transactional claim failed");
            let _ = found.send(Err(()));
            return;
        }
    };
    let _ = found.send(Ok(rows.len() >= limit));
    let n = rows.len() as u64;
    // A failure puts the rows back as they were, its attempt counted: the handler gets
    // the rows and this keeps a copy (the claim already deleted them).
    let claimed = rows.clone();
    // The groups of keyed messages: their keys' next messages wait for this commit.
    let mut keyed: Vec<&str> = claimed.iter().filter(|r| r.key.is_some()).map(|r| r.group.as_str()).collect();
    keyed.sort_unstable();
    keyed.dedup();
    let keyed_ids: Vec<i64> = claimed.iter().filter(|r| r.key.is_some()).map(|r| r.id).collect();
    // The handler's span continues the publisher's trace (one message) or links each
    // message's (a batch), as the leased runners' spans do.
    let span = match &claimed[..] {
        [row] => telemetry::message_span(
            queue.table(),
            row.id,
            u32::try_from(row.attempts + 1).unwrap_or(u32::MAX),
            &decode_headers(row.headers.as_deref()),
        ),
        rows => {
            let headers: Vec<Headers> = rows.iter().map(|r| decode_headers(r.headers.as_deref())).collect();
            telemetry::batch_span(queue.table(), rows.len(), headers.iter())
        }
    };
    // The claim set the handler's savepoint.
    let settled = async {
        let tx = write.tx();
        // The runner gone (its future dropped): the handler is not started, or dropped
        // rather than waited for, and the batch goes back as it was.
        let handled = if *gone.borrow() {
            Ok(BatchOutcome::Rollback)
        } else {
            tokio::select! {
                biased;
                handled = handler(tx, rows).instrument(span) => handled,
                _ = gone.wait_for(|gone| *gone) => Ok(BatchOutcome::Rollback),
            }
        };
        let (error, after) = match handled {
            Ok(BatchOutcome::Rollback) if !DB::ONE_WRITER => return Ok(Settled::RolledBack),
            Ok(BatchOutcome::Rollback) => {
                // Its group's transaction holds other batches: only this one is undone.
                DB::simple(tx, "ROLLBACK TO SAVEPOINT rowbus_handler").await?;
                restore_snoozed(queue, tx, &claimed, Duration::ZERO).await?;
                return Ok(Settled::RolledBack);
            }
            Ok(BatchOutcome::DeadLetter(reasons)) => {
                let reasons: HashMap<i64, String> = reasons.into_iter().collect();
                let (dead, acked): (Vec<&ClaimedRow>, Vec<&ClaimedRow>) =
                    claimed.iter().partition(|row| reasons.contains_key(&row.id));
                let mut by_reason: BTreeMap<&str, Vec<&ClaimedRow>> = BTreeMap::new();
                for row in dead {
                    by_reason.entry(reasons[&row.id].as_str()).or_default().push(row);
                }
                let (mut moved, mut failed) = (0, 0);
                for (reason, rows) in by_reason {
                    let restored = move_dead(queue, tx, &rows, reason).await?;
                    (moved, failed) = (moved + restored.dead, failed + restored.dead_failed);
                }
                if queue.keeps() && !acked.is_empty() {
                    let acked: Vec<ClaimedRow> = acked.iter().map(|&row| row.clone()).collect();
                    record(queue, tx, &acked, Moved::Acked, None).await?;
                }
                return Ok(Settled::DeadLettered {
                    acked: acked.len() as u64,
                    dead: moved,
                    dead_failed: failed,
                });
            }
            Ok(BatchOutcome::All(done @ (Outcome::Ack | Outcome::Drop))) => {
                if queue.keeps() {
                    let outcome = if done == Outcome::Drop { Moved::Dropped } else { Moved::Acked };
                    record(queue, tx, &claimed, outcome, None).await?;
                }
                return Ok(if done == Outcome::Drop { Settled::Dropped } else { Settled::Acked });
            }
            Ok(BatchOutcome::All(Outcome::Retry(after))) => handler_retry(after),
            Ok(BatchOutcome::All(Outcome::Snooze(after))) => match handler_snooze(after) {
                Ok(after) => {
                    // Its writes undone, as for a failure: the messages run again later.
                    DB::simple(tx, "ROLLBACK TO SAVEPOINT rowbus_handler").await?;
                    restore_snoozed(queue, tx, &claimed, after).await?;
                    return Ok(Settled::Snoozed);
                }
                Err(reason) => (reason, None),
            },
            Err(error) => {
                debug!(table = %queue.table(), error, "transactional handler failed; undoing its writes");
                (error, None)
            }
        };
        DB::simple(tx, "ROLLBACK TO SAVEPOINT rowbus_handler").await?;
        let restored = restore_failed(queue, tx, &claimed, &error, after).await?;
        Ok::<_, Error>(Settled::Failed { dead: restored.dead, dead_failed: restored.dead_failed })
    }
    .await;
    // Undone: the batch's own transaction ends in a rollback; with one writer the batch
    // was undone inside its group's transaction (above), which commits as usual.
    let rolled_back = matches!(settled, Ok(Settled::RolledBack)) && !DB::ONE_WRITER;
    let committed = write.finish(settled.is_ok() && !rolled_back, true).await;
    let settled = match (settled, committed) {
        (Ok(settled), Ok(true)) => settled,
        (Ok(Settled::RolledBack), Ok(false)) => return,
        (Ok(_), Ok(false)) => {
            warn!(table = %queue.table(), "the transaction this batch shared failed; its messages are claimable again");
            return;
        }
        (Err(error), _) | (_, Err(error)) => {
            warn!(%error, table = %queue.table(), "settling transactional messages failed; they are claimable again");
            return;
        }
    };
    let left = match settled {
        Settled::Acked => {
            counters.acknowledged(n as usize, n);
            true
        }
        Settled::Dropped => {
            counters.dropped(n);
            true
        }
        Settled::Failed { dead, dead_failed } => {
            counters.failed_batch(n - dead_failed, dead);
            counters.dead_letter_failed(dead_failed);
            dead > 0
        }
        Settled::Snoozed => {
            counters.snoozed(n);
            counts::count(queue, Counted::Snoozed, n).await;
            false
        }
        Settled::DeadLettered { acked, dead, dead_failed } => {
            counters.acknowledged(acked as usize, acked);
            counters.failed_batch(dead + dead_failed, dead);
            counters.dead_letter_failed(dead_failed);
            acked + dead > 0
        }
        Settled::RolledBack => false,
    };
    // Some left the queue: wake who can take their keys' next messages.
    if left {
        for group in keyed {
            crate::broker::publish::insert::wake_group(queue, group).await;
        }
        crate::broker::settle::lease::keys_gone(queue, &keyed_ids).await;
    }
}

/// How a transactional batch's messages were settled, once committed.
enum Settled {
    Acked,
    Dropped,
    /// Put back to run again, `dead` of them dead-lettered, and `dead_failed` put back
    /// because their move to the dead-letter table failed.
    Failed {
        dead: u64,
        dead_failed: u64,
    },
    /// Put back to run after a delay, their attempt not counted.
    Snoozed,
    /// `acked` acknowledged, `dead` dead-lettered as the handler asked, and `dead_failed`
    /// put back because their move to the dead-letter table failed.
    DeadLettered {
        acked: u64,
        dead: u64,
        dead_failed: u64,
    },
    /// Undone, as if never claimed (on a database with one writer, put back unchanged).
    RolledBack,
}
