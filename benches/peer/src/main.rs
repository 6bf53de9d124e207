//! The peer benchmark: publish N messages into a ruststream-sqlx 0.7.1 task queue, then drain
//! them with 8 workers (single messages, a handler that only acknowledges), and report
//! messages/s. `run.sh` beside this crate interleaves it with rowbus's `bench broker --only
//! drain8` so that the ratio is measured in one run.
//!
//! ```text
//! rowbus-peer-bench --database-url postgres://postgres@127.0.0.1:5432/test \
//!     [--messages 20000] [--workers 8] [--form lease|row-lock] [--json]
//! ```
//!
//! Two claim forms of ruststream-sqlx: `row-lock` (its default; PostgreSQL and MySQL/MariaDB
//! only), a `FOR UPDATE SKIP LOCKED` transaction held while the handler runs; and `lease`
//! (rowbus's model), a `locked_until` stamp committed at claim, then a delete on ack. Each run
//! uses its own freshly created table.

use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use ruststream_sqlx::Insert;
use ruststream_sqlx::prelude::*;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Executor, MySqlPool, PgPool, SqlitePool};

/// Messages handled by either subscription, since the last reset.
static HANDLED: AtomicU64 = AtomicU64::new(0);

/// A job of the row lock form: claimed by a transaction that holds the row while it runs.
#[derive(Debug, Clone, Inbox, sqlx::FromRow)]
#[inbox(table = "rowbus_peer_locked")]
struct LockedJob {
    #[field(id, generated)]
    id: i64,
    body: Vec<u8>,
}

/// A job of the lease form: the claim stamps `locked_until` and commits.
#[derive(Debug, Clone, Inbox, sqlx::FromRow)]
#[inbox(table = "rowbus_peer_leased")]
struct LeasedJob {
    #[field(id, generated)]
    id: i64,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    body: Vec<u8>,
}

#[subscriber(InboxQueue::<LockedJob>::new("peer_locked"))]
async fn locked(_job: &LockedJob) -> HandlerOutcome {
    HANDLED.fetch_add(1, Ordering::Relaxed);
    HandlerOutcome::ack()
}

#[subscriber(InboxQueue::<LeasedJob>::new("peer_leased"))]
async fn leased(_job: &LeasedJob) -> HandlerOutcome {
    HANDLED.fetch_add(1, Ordering::Relaxed);
    HandlerOutcome::ack()
}

/// Which claim form a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    RowLock,
    Lease,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::RowLock => "row-lock",
            Form::Lease => "lease",
        }
    }
}

/// The command line.
#[derive(Debug)]
struct Args {
    url: String,
    messages: u64,
    workers: usize,
    form: Form,
    json: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: std::env::var("DATABASE_URL").unwrap_or_default(),
        messages: 20_000,
        workers: 8,
        form: Form::Lease,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--database-url" => args.url = value("--database-url")?,
            "--messages" => {
                args.messages = value("--messages")?.parse().map_err(|e| format!("--messages: {e}"))?
            }
            "--workers" => {
                args.workers = value("--workers")?.parse().map_err(|e| format!("--workers: {e}"))?
            }
            "--form" => {
                args.form = match value("--form")?.as_str() {
                    "lease" => Form::Lease,
                    "row-lock" => Form::RowLock,
                    other => return Err(format!("--form: expected lease or row-lock, not {other:?}")),
                }
            }
            "--json" => args.json = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.url.is_empty() {
        return Err("--database-url (or DATABASE_URL) is required".into());
    }
    Ok(args)
}

/// What one run measured.
#[derive(Debug)]
struct Measured {
    publish_per_s: f64,
    drain_per_s: f64,
    left: i64,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A ~30-byte body.
fn body(i: u64) -> Vec<u8> {
    format!("bench message {i:>16}").into_bytes()
}

/// Runs `inserters` loops that insert the `n` rows `make` builds, through the derive's
/// insert on a pooled connection each.
macro_rules! publish {
    ($pool:expr, $n:expr, $inserters:expr, $make:expr) => {{
        let next = std::sync::Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..$inserters {
            let (pool, next) = ($pool.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= $n {
                        return Ok::<(), sqlx::Error>(());
                    }
                    let mut conn = pool.acquire().await?;
                    $make(i).insert(&mut *conn).await?;
                }
            }));
        }
        for task in tasks {
            task.await??;
        }
    }};
}

/// Starts a service whose only subscription is `$handler` with `$workers` workers on the
/// pool, waits until `$n` messages were handled, shuts it down; the messages/s from start
/// to shutdown.
macro_rules! drain {
    ($pool:expr, $handler:expr, $workers:expr, $n:expr) => {{
        HANDLED.store(0, Ordering::Relaxed);
        let workers = NonZeroUsize::new($workers.max(1)).expect("at least one");
        let broker = SqlxBroker::new($pool.clone());
        let app = RustStream::new(AppInfo::new("rowbus-peer-bench", "0.1.0")).with_broker(broker, |b| {
            b.include($handler.workers(workers));
        });
        let started = Instant::now();
        let running = app.start().await?;
        let (mut last, mut last_at) = (0, Instant::now());
        loop {
            let now = HANDLED.load(Ordering::Relaxed);
            if now >= $n {
                break;
            }
            if now != last {
                (last, last_at) = (now, Instant::now());
            } else if last_at.elapsed() > Duration::from_secs(30) {
                eprintln!("peer: drain stalled at {now} of {} messages", $n);
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        running.shutdown().await?;
        HANDLED.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
    }};
}

/// The row lock drain, where the database has row locks.
macro_rules! drain_row_lock {
    (row_lock, $pool:expr, $workers:expr, $n:expr) => {
        drain!($pool, locked, $workers, $n)
    };
    (lease_only, $pool:expr, $workers:expr, $n:expr) => {
        unreachable!("refused before the run")
    };
}

/// Drops and creates the run's table, publishes, drains, counts what is left. `$row_lock`
/// is `row_lock` where the database has row locks, `lease_only` where it has not (the row
/// lock subscription does not compile there).
macro_rules! bench_on {
    ($pool:expr, $args:expr, $locked_ddl:expr, $leased_ddl:expr, $row_lock:ident) => {{
        let (pool, args) = ($pool, $args);
        let n = args.messages;
        let table = match args.form {
            Form::RowLock => "rowbus_peer_locked",
            Form::Lease => "rowbus_peer_leased",
        };
        pool.execute(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}"))).await?;
        let ddl = match args.form {
            Form::RowLock => $locked_ddl,
            Form::Lease => $leased_ddl,
        };
        pool.execute(ddl).await?;
        let started = Instant::now();
        match args.form {
            Form::RowLock => publish!(pool, n, 8, |i| LockedJob { id: 0, body: body(i) }),
            Form::Lease => publish!(pool, n, 8, |i| LeasedJob { id: 0, locked_until: None, body: body(i) }),
        }
        let publish_per_s = n as f64 / started.elapsed().as_secs_f64();
        let drain_per_s = match args.form {
            Form::RowLock => drain_row_lock!($row_lock, pool, args.workers, n),
            Form::Lease => drain!(pool, leased, args.workers, n),
        };
        let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(&pool)
            .await?;
        pool.execute(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}"))).await?;
        pool.close().await;
        Measured { publish_per_s, drain_per_s, left }
    }};
}

async fn postgres(args: &Args) -> Result<Measured, Error> {
    let pool: PgPool = PgPoolOptions::new().max_connections(8).connect(&args.url).await?;
    Ok(bench_on!(
        pool,
        args,
        "CREATE TABLE rowbus_peer_locked (id BIGSERIAL PRIMARY KEY, body BYTEA NOT NULL)",
        "CREATE TABLE rowbus_peer_leased (id BIGSERIAL PRIMARY KEY, locked_until TIMESTAMPTZ, body BYTEA NOT NULL)",
        row_lock
    ))
}

async fn mysql(args: &Args) -> Result<Measured, Error> {
    // The session rowbus's own pool runs in: claims want READ COMMITTED on MariaDB.
    let pool: MySqlPool = MySqlPoolOptions::new()
        .max_connections(8)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
                Ok(())
            })
        })
        .connect(&args.url.replacen("mariadb:", "mysql:", 1))
        .await?;
    Ok(bench_on!(
        pool,
        args,
        "CREATE TABLE rowbus_peer_locked (id BIGINT AUTO_INCREMENT PRIMARY KEY, body BLOB NOT NULL) ENGINE=InnoDB",
        "CREATE TABLE rowbus_peer_leased (id BIGINT AUTO_INCREMENT PRIMARY KEY, locked_until DATETIME, \
         body BLOB NOT NULL) ENGINE=InnoDB",
        row_lock
    ))
}

async fn sqlite(args: &Args) -> Result<Measured, Error> {
    if args.form == Form::RowLock {
        return Err("SQLite has no row locks: ruststream-sqlx serves it in the lease form only".into());
    }
    // As rowbus sets SQLite up: WAL, a busy timeout, at most 4 connections.
    let options: SqliteConnectOptions = args.url.parse()?;
    let options = options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool: SqlitePool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await?;
    Ok(bench_on!(
        pool,
        args,
        "CREATE TABLE rowbus_peer_locked (id INTEGER PRIMARY KEY, body BLOB NOT NULL)",
        "CREATE TABLE rowbus_peer_leased (id INTEGER PRIMARY KEY, locked_until TEXT, body BLOB NOT NULL)",
        lease_only
    ))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("peer: {e}");
            return ExitCode::from(2);
        }
    };
    let scheme = args.url.split(':').next().unwrap_or("").to_ascii_lowercase();
    let (backend, measured) = match scheme.as_str() {
        "postgres" | "postgresql" => ("PostgreSQL", postgres(&args).await),
        "mysql" | "mariadb" => ("MySQL/MariaDB", mysql(&args).await),
        "sqlite" => ("SQLite", sqlite(&args).await),
        _ => ("?", Err(format!("unsupported URL scheme {scheme:?}").into())),
    };
    let measured = match measured {
        Ok(m) => m,
        Err(e) => {
            eprintln!("peer: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "peer": "ruststream-sqlx 0.7.1",
                "backend": backend,
                "form": args.form.name(),
                "messages": args.messages,
                "workers": args.workers,
                "publish_msgs_per_s": measured.publish_per_s,
                "drain_msgs_per_s": measured.drain_per_s,
                "left": measured.left,
            })
        );
    } else {
        println!(
            "ruststream-sqlx 0.7.1 on {backend}, {} form, {} messages: publish (8 at a time) {:.0} msgs/s, \
             drain ({} workers) {:.0} msgs/s{}",
            args.form.name(),
            args.messages,
            measured.publish_per_s,
            args.workers,
            measured.drain_per_s,
            if measured.left == 0 { String::new() } else { format!(", {} left in the table", measured.left) }
        );
    }
    if measured.left != 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
