//! apalis 1.0 for benches/field/run.sh: optionally publish N jobs one at a time from 8
//! publishers (timed), then push N jobs with the backend's own stream push, and drain them with
//! one worker of 8 handlers fetching `--fetch` jobs a poll, timed from the worker's start until
//! the last job is handled. Prints one JSON line. The database (or SQLite file) is the
//! caller's: the script gives each run a database of its own and drops it afterwards.
//!
//!   rowbus-field-apalis --database-url URL [--messages 20000] [--workers 8] [--fetch 500]
//!       [--publish]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use apalis::prelude::*;
use tokio::sync::Notify;

static HANDLED: AtomicUsize = AtomicUsize::new(0);
static TARGET: AtomicUsize = AtomicUsize::new(usize::MAX);
static DONE: Notify = Notify::const_new();

async fn job(_n: u64) -> Result<(), BoxDynError> {
    if HANDLED.fetch_add(1, Ordering::AcqRel) + 1 == TARGET.load(Ordering::Acquire) {
        DONE.notify_one();
    }
    Ok(())
}

struct Args {
    url: String,
    messages: usize,
    workers: usize,
    fetch: usize,
    publish: bool,
}

fn args() -> Args {
    let mut a = Args { url: String::new(), messages: 20_000, workers: 8, fetch: 500, publish: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--database-url" => a.url = value(),
            "--messages" => a.messages = value().parse().expect("--messages"),
            "--workers" => a.workers = value().parse().expect("--workers"),
            "--fetch" => a.fetch = value().parse().expect("--fetch"),
            "--publish" => a.publish = true,
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(!a.url.is_empty(), "--database-url is required");
    a
}

/// Publishes `n` jobs one `push` each from 8 tasks on clones of the backend; msgs/s.
macro_rules! publish_rate {
    ($backend:expr, $n:expr) => {{
        let n: usize = $n;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for p in 0..8usize {
            let mut b = $backend.clone();
            let count = n / 8 + usize::from(p < n % 8);
            tasks.push(tokio::spawn(async move {
                for i in 0..count {
                    b.push(i as u64).await.expect("push");
                }
            }));
        }
        for t in tasks {
            t.await.expect("publisher");
        }
        n as f64 / started.elapsed().as_secs_f64()
    }};
}

/// Pushes `n` jobs in one stream; seconds.
macro_rules! bulk_insert {
    ($backend:expr, $n:expr) => {{
        let started = Instant::now();
        let mut items = futures::stream::iter(0..$n as u64);
        $backend.push_stream(&mut items).await.expect("push_stream");
        started.elapsed().as_secs_f64()
    }};
}

/// Runs one worker of `workers` handlers until `n` jobs are handled; msgs/s.
macro_rules! drain {
    ($backend:expr, $n:expr, $workers:expr) => {{
        HANDLED.store(0, Ordering::Release);
        TARGET.store($n, Ordering::Release);
        let started = Instant::now();
        let worker = WorkerBuilder::new("field-drain")
            .backend($backend)
            .concurrency($workers)
            .parallelize(tokio::spawn)
            .build(job);
        // The worker runs in this task until the last job is handled (DONE keeps a permit if
        // it came first); then it is dropped, and the process exits.
        tokio::select! {
            result = worker.run() => panic!("the worker stopped before the drain ended: {result:?}"),
            _ = tokio::time::sleep(Duration::from_secs(600)) => panic!("drain timed out"),
            _ = DONE.notified() => {}
        }
        $n as f64 / started.elapsed().as_secs_f64()
    }};
}

#[cfg(feature = "postgres")]
async fn postgres(a: &Args, n: usize) -> (Option<f64>, f64, f64) {
    use apalis_postgres::{Config, PgPool, PostgresStorage};
    let pool = PgPool::connect(&a.url).await.expect("connect");
    PostgresStorage::setup(&pool).await.expect("setup");
    let config = Config::default().queue("field").batch_size(a.fetch);
    let publish = if a.publish {
        let b = PostgresStorage::<u64>::new(&pool).with_config(config.clone().queue("field-publish"));
        Some(publish_rate!(b, n))
    } else {
        None
    };
    let mut backend = PostgresStorage::<u64>::new(&pool).with_config(config);
    let insert_s = bulk_insert!(backend, n);
    (publish, insert_s, drain!(backend, n, a.workers))
}

#[cfg(feature = "sqlite")]
async fn sqlite(a: &Args, n: usize) -> (Option<f64>, f64, f64) {
    use apalis_sqlite::{Config, SqlitePool, SqliteStorage};
    let pool = SqlitePool::connect(&a.url).await.expect("connect");
    SqliteStorage::setup(&pool).await.expect("setup");
    let config = Config::default().queue("field").batch_size(a.fetch);
    let publish = if a.publish {
        let b = SqliteStorage::<u64>::new(&pool).with_config(config.clone().queue("field-publish"));
        Some(publish_rate!(b, n))
    } else {
        None
    };
    let mut backend = SqliteStorage::<u64>::new(&pool).with_config(config);
    let insert_s = bulk_insert!(backend, n);
    (publish, insert_s, drain!(backend, n, a.workers))
}

#[cfg(feature = "mysql")]
async fn mysql(a: &Args, n: usize) -> (Option<f64>, f64, f64) {
    use apalis_mysql::{Config, MySqlPool, MySqlStorage};
    let pool = MySqlPool::connect(&a.url.replacen("mariadb://", "mysql://", 1)).await.expect("connect");
    // Its migrations create the tables with MySQL 8's collation utf8mb4_0900_ai_ci, which
    // MariaDB does not have: they run here one by one with utf8mb4_unicode_ci instead.
    for migration in MySqlStorage::migrations().iter() {
        let sql = migration.sql.replace("utf8mb4_0900_ai_ci", "utf8mb4_unicode_ci");
        sqlx::raw_sql(&sql).execute(&pool).await.expect("migration");
    }
    let config = Config::new("field").set_buffer_size(a.fetch);
    let publish = if a.publish {
        let b = MySqlStorage::<u64, (), ()>::new_with_config(&pool, &Config::new("field-publish"));
        Some(publish_rate!(b, n))
    } else {
        None
    };
    let mut backend = MySqlStorage::<u64, (), ()>::new_with_config(&pool, &config);
    let insert_s = bulk_insert!(backend, n);
    (publish, insert_s, drain!(backend, n, a.workers))
}

#[tokio::main]
async fn main() {
    let a = args();
    let n = a.messages;
    let (publish, insert_s, drain) = match a.url.split(':').next().unwrap_or("") {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => postgres(&a, n).await,
        #[cfg(feature = "sqlite")]
        "sqlite" => sqlite(&a, n).await,
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => mysql(&a, n).await,
        other => panic!("this build has no backend for {other}: (apalis-mysql is a build of its own)"),
    };
    println!(
        "{{\"system\": \"apalis\", \"messages\": {n}, \"workers\": {}, \"fetch\": {}, \"insert_s\": {insert_s:.3}, \
         \"drain_msgs_per_s\": {drain:.1}, \"publish_msgs_per_s\": {}}}",
        a.workers,
        a.fetch,
        publish.map_or("null".to_owned(), |p| format!("{p:.1}")),
    );
    std::process::exit(0);
}
