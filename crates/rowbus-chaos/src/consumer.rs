//! `rowbus-chaos consumer` (hidden): one consumer process of a broker scenario, started,
//! SIGKILLed and restarted by the driver. Each handled message is recorded in the database
//! before its acknowledgement, and the outcome of that acknowledgement in a journal file
//! (one `write` per line, so a SIGKILL loses nothing written).

use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use rowbus::{Broker, BrokerOptions, DbPool, Delivery, NotifyConfig, RetryPolicy, TxMessage};
use sqlx::{MySql, Pool, Postgres, Sqlite};

use super::BoxError;
use super::random::Rng;
use super::sql::{Exec, Tables};
use super::time::now_us;

/// Options of the hidden `rowbus-chaos consumer`; the database URL (the consumer role's)
/// comes in `DATABASE_URL`.
#[derive(Debug, Args)]
pub struct ConsumerArgs {
    /// The run's table prefix
    #[arg(long)]
    prefix: String,
    /// The run's id, recorded with each handled message
    #[arg(long)]
    run_id: i64,
    /// This consumer's number in the run
    #[arg(long)]
    proc: i64,
    /// How often this consumer has been started
    #[arg(long)]
    incarnation: i64,
    /// Transactional handlers (`run_tx`): the record and an effect row commit with the ack
    #[arg(long)]
    transactional: bool,
    /// Handlers at once
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// The lease, in milliseconds
    #[arg(long, default_value_t = 4000)]
    lease_ms: u64,
    /// Where to append the outcome of each acknowledgement
    #[arg(long)]
    journal: PathBuf,
    /// Stop after this many seconds whatever happens (the driver closes stdin before)
    #[arg(long, default_value_t = 3600)]
    max_secs: u64,
}

/// In `broker-tx`, one message in this many fails its first attempt after writing its
/// record and effect: the transaction must undo both and put the message back, counted.
const FAIL_EVERY: i64 = 50;

/// The broker options of every participant of a broker scenario: `listen_notify` on the
/// run's own notify table, a short lease, and retries that never dead-letter in a run.
pub(crate) fn broker_options(tables: &Tables, lease: Duration) -> BrokerOptions {
    BrokerOptions {
        poll_interval: Duration::from_secs(1),
        lease,
        retry: RetryPolicy {
            max_attempts: 1_000,
            base: Duration::from_millis(100),
            factor: 2.0,
            max_delay: Duration::from_secs(1),
        },
        listen_notify: true,
        notify_table: NotifyConfig {
            table: tables.wake.clone(),
            poll_interval: Duration::from_millis(50),
            lookback: Duration::from_secs(2),
            ..NotifyConfig::default()
        },
        listen_url: None,
        claim_error_wait: Duration::from_secs(1),
        // The scenarios publish their own messages and count them: no schedule of theirs
        // to run, nor a re-read of the schedule table to add to what the faults hit.
        run_schedules: false,
        schedule_reread: BrokerOptions::default().schedule_reread,
    }
}

/// What became of an acknowledgement (or of the record before it), as the journal says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The ack returned Ok: the message must never come back.
    Acked,
    /// The record or the ack failed because the connection was lost (a killed session).
    ConnectionLost,
    /// The ack was refused: the lease had run out.
    LeaseLost,
    /// Any other error.
    Failed,
}

impl Settled {
    fn of(error: &rowbus::Error) -> Self {
        if error.is_connection_error() {
            Settled::ConnectionLost
        } else if matches!(error, rowbus::Error::LeaseLost { .. }) {
            Settled::LeaseLost
        } else {
            Settled::Failed
        }
    }

    pub(crate) fn word(self) -> &'static str {
        match self {
            Settled::Acked => "acked",
            Settled::ConnectionLost => "connection-lost",
            Settled::LeaseLost => "lease-lost",
            Settled::Failed => "failed",
        }
    }

    pub(crate) fn parse(word: &str) -> Option<Self> {
        [Settled::Acked, Settled::ConnectionLost, Settled::LeaseLost, Settled::Failed]
            .into_iter()
            .find(|s| s.word() == word)
    }
}

/// Lines `<msg> <attempt> <outcome>`, one `write` each; `start` when a handler begins
/// (the driver SIGKILLs a consumer right after one, so that it dies mid-handler).
struct Journal(Mutex<File>);

impl Journal {
    fn write(&self, msg: i64, attempt: i64, word: &str) {
        let line = format!("{msg} {attempt} {word}\n");
        let mut file = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(error) = file.write_all(line.as_bytes()) {
            eprintln!("rowbus-chaos consumer: writing the journal failed: {error}");
        }
    }

    fn started(&self, msg: i64, attempt: i64) {
        self.write(msg, attempt, "start");
    }

    fn record(&self, msg: i64, attempt: i64, settled: Settled) {
        self.write(msg, attempt, settled.word());
    }
}

/// Runs one consumer process until the driver closes its stdin (or `max_secs`).
pub(crate) async fn run(url: &str, args: ConsumerArgs) -> Result<(), BoxError> {
    let size = u32::try_from(args.workers).unwrap_or(4) + 4;
    let db = starting("connecting", || DbPool::connect_with_size(url, size)).await?;
    if let Some(pool) = Postgres::typed(&db) {
        consume(pool, args).await
    } else if let Some(pool) = MySql::typed(&db) {
        consume(pool, args).await
    } else if let Some(pool) = Sqlite::typed(&db) {
        consume(pool, args).await
    } else {
        unreachable!("a DbPool is one of the three")
    }
}

/// Tries of a consumer's start (connecting, the broker's listening connection).
const START_TRIES: u32 = 20;

/// Starts like a supervised service: a start whose new sessions the harness killed (a kill
/// round comes every 2 s, and a restarted consumer often meets one) is tried again rather
/// than counted as a crash, up to [`START_TRIES`] times; any other error ends the process.
async fn starting<T, F, Fut>(what: &str, mut start: F) -> Result<T, rowbus::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, rowbus::Error>>,
{
    let mut tries = 1;
    loop {
        match start().await {
            Err(error) if error.is_connection_error() && tries < START_TRIES => {
                eprintln!("rowbus-chaos consumer: {what} failed, trying again: {error}");
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// The ids every record carries.
#[derive(Debug, Clone, Copy)]
struct Ids {
    run: i64,
    proc: i64,
    incarnation: i64,
}

fn message_number(text: Result<&str, rowbus::Error>) -> Result<i64, String> {
    let text = text.map_err(|e| e.to_string())?;
    text.parse().map_err(|_| format!("not a chaos message: {text:?}"))
}

async fn consume<DB: Exec>(pool: Pool<DB>, args: ConsumerArgs) -> Result<(), BoxError> {
    let tables = Tables::new(&args.prefix);
    let lease = Duration::from_millis(args.lease_ms);
    let broker =
        starting("starting the broker", || Broker::new(pool.clone(), broker_options(&tables, lease))).await?;
    let queue = broker.queue(&tables.queue)?;
    let journal =
        Arc::new(Journal(Mutex::new(File::options().create(true).append(true).open(&args.journal)?)));

    // Stop when the driver closes stdin (or is gone), or at the latest after max_secs.
    let (closed, stdin_closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        let _ = closed.send(());
    });
    let stopper = {
        let broker = broker.clone();
        let max = Duration::from_secs(args.max_secs);
        tokio::spawn(async move {
            tokio::select! {
                _ = stdin_closed => {}
                _ = tokio::time::sleep(max) => {}
            }
            broker.shutdown(Duration::from_secs(5)).await;
        })
    };

    let ids = Ids { run: args.run_id, proc: args.proc, incarnation: args.incarnation };
    let subscription = queue.subscribe().workers(args.workers).lease(lease);
    if args.transactional {
        let backend = DB::BACKEND;
        let record: Arc<str> = tables.insert_handled().into();
        let effect: Arc<str> = tables.insert_effect(backend).into();
        let dup: Arc<str> = tables.insert_dup().into();
        subscription
            .run_tx(move |conn, m: TxMessage| {
                let (record, effect, dup, pool) = (record.clone(), effect.clone(), dup.clone(), pool.clone());
                let journal = journal.clone();
                Box::pin(async move {
                    let msg = message_number(m.text())?;
                    let at = now_us();
                    let attempt = i64::from(m.attempt());
                    journal.started(msg, attempt);
                    let row = [ids.run, msg, ids.proc, ids.incarnation, attempt, at];
                    DB::exec(conn, &record, &row).await.map_err(|e| e.to_string())?;
                    let fresh = DB::exec(conn, &effect, &[ids.run, msg]).await.map_err(|e| e.to_string())?;
                    if fresh == 0 {
                        // The effect committed before: this message was handled twice.
                        let mut other = pool.acquire().await.map_err(|e| e.to_string())?;
                        DB::exec(&mut other, &dup, &[ids.run, msg, ids.proc, at])
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    if attempt == 1 && msg % FAIL_EVERY == FAIL_EVERY - 1 {
                        // After its writes: they must be undone and the message come back.
                        return Err(format!("message {msg} fails its first attempt on purpose"));
                    }
                    tokio::time::sleep(Rng::new(msg as u64).below(Duration::from_millis(4))).await;
                    Ok::<(), String>(())
                })
            })
            .await?;
    } else {
        let record: Arc<str> = tables.insert_handled().into();
        subscription
            .run(move |d: Delivery<DB>| {
                let (record, pool, journal) = (record.clone(), pool.clone(), journal.clone());
                async move {
                    let msg = message_number(d.text())?;
                    let attempt = i64::from(d.attempt());
                    journal.started(msg, attempt);
                    let mut rng = Rng::new(msg as u64);
                    tokio::time::sleep(rng.below(Duration::from_millis(3))).await;
                    let row = [ids.run, msg, ids.proc, ids.incarnation, attempt, now_us()];
                    let recorded = async {
                        let mut conn = pool.acquire().await?;
                        DB::exec(&mut conn, &record, &row).await
                    }
                    .await;
                    if let Err(error) = recorded {
                        let error = rowbus::Error::from(error);
                        journal.record(msg, attempt, Settled::of(&error));
                        return Err(error.to_string());
                    }
                    // Mid-handler: recorded, not yet acknowledged.
                    tokio::time::sleep(rng.below(Duration::from_millis(5))).await;
                    match d.ack().await {
                        Ok(()) => journal.record(msg, attempt, Settled::Acked),
                        Err(error) => journal.record(msg, attempt, Settled::of(&error)),
                    }
                    Ok::<(), String>(())
                }
            })
            .await?;
    }
    stopper.abort();
    Ok(())
}

#[cfg(test)]
mod start_tests {
    use super::*;
    use std::cell::Cell;

    fn killed() -> rowbus::Error {
        rowbus::Error::Database(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)))
    }

    // Found by a 10-minute run: a consumer restarted after a SIGKILL had its listening
    // connection killed while the broker started, and exited ("consumer_crashes").
    #[tokio::test]
    async fn a_start_whose_session_was_killed_is_tried_again() {
        let calls = Cell::new(0);
        let started = starting("starting", || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move { if n < 3 { Err(killed()) } else { Ok(n) } }
        })
        .await;
        assert_eq!(started.unwrap(), 3);
    }

    #[tokio::test]
    async fn other_errors_and_endless_kills_end_the_start() {
        let refused = starting("starting", || async { Err::<(), _>(rowbus::Error::ShuttingDown) }).await;
        assert!(matches!(refused, Err(rowbus::Error::ShuttingDown)));
        let calls = Cell::new(0);
        let gave_up = starting("starting", || {
            calls.set(calls.get() + 1);
            async { Err::<(), _>(killed()) }
        })
        .await;
        assert!(gave_up.is_err());
        assert_eq!(calls.get(), START_TRIES);
    }
}
