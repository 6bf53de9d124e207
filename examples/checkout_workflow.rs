//! A durable checkout: a workflow of five steps, a durable sleep and a wait for an event,
//! run by workers that may be killed at any point and started again.
//!
//! Each step appends `STEP <n> <workflow id>` to the file of `--log` and then records its
//! result; a sleep of `--sleep` (2s by default) comes between steps 3 and 4, and a wait for
//! the event `paid` before step 5. A step whose result is recorded never runs again, so
//! across crashes and restarts the log holds each line once per workflow.
//!
//! ```text
//! cargo run -p rowbus-examples --example checkout_workflow -- \
//!     --database-url sqlite:///tmp/shop.sqlite --log /tmp/shop.log --start 3 --abort-after-step 2
//! # aborted after a step 2; again, paying every workflow, until they all end:
//! cargo run -p rowbus-examples --example checkout_workflow -- \
//!     --database-url sqlite:///tmp/shop.sqlite --log /tmp/shop.log --emit-paid
//! ```
//!
//! The flags: `--database-url URL` (PostgreSQL, MySQL/MariaDB or SQLite; default
//! `DATABASE_URL`, else a SQLite file of its own removed at the end), `--queue Q` (deployed
//! if missing, `checkout` by default), `--workers N` (8), `--start K` (starts K workflows
//! and prints one id per line), `--for DURATION` (stop then, if the workflows have not all
//! ended by then), `--emit-paid` (emits `paid` once to every workflow of the queue that has
//! not ended, at the start), `--abort-after-step N` (`std::process::abort()` right after the
//! first step N this process runs has recorded its result). Without `--for`, the workers
//! run until every workflow of the queue has ended.
//!
//! The abort waits for the steps other workflows have begun in this process to record
//! theirs (it takes the gate every step holds while it runs): a crash in the middle of a
//! step is the other case, whose line may then be written twice (docs/workflows.md, "What
//! runs once, and what may run again").

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rowbus::workflow::{Context, Status, WorkflowError, Workflows};
use rowbus::{Broker, BrokerOptions, Db, DbPool, OnPool};
use rowbus_examples::TempDatabase;
use tokio::sync::RwLock;

/// The workflow's registered name.
const WORKFLOW: &str = "checkout";
/// How long a run's message stays with a worker: what a restart after an abort waits at
/// most for the workflows the aborted process held (renewed while a run goes on).
const LEASE: Duration = Duration::from_secs(5);
/// How often the runner looks whether every workflow has ended.
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// The most workflows `--emit-paid` reads at once.
const EMIT_PAGE: u32 = 1_000_000;

/// The example's flags.
#[derive(Debug, Parser)]
#[command(about = "A durable checkout workflow: five steps, a sleep, a wait for `paid`")]
struct Args {
    /// Database URL: postgres://, mysql://, mariadb:// or sqlite: [default: a SQLite file of
    /// its own, removed at the end]
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// The queue the workflows run on (deployed, with its workflow tables, if missing)
    #[arg(long, default_value = "checkout")]
    queue: String,
    /// The file each step appends its line `STEP <n> <workflow id>` to
    #[arg(long, value_name = "FILE")]
    log: PathBuf,
    /// Workflows running at once
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Start this many workflows, printing one id per line
    #[arg(long, value_name = "K", default_value_t = 0)]
    start: u32,
    /// The durable sleep between steps 3 and 4, e.g. 2s, 500ms
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration)]
    sleep: Duration,
    /// Run at most this long, e.g. 10s [default: until every workflow of the queue ended]
    #[arg(long = "for", value_name = "DURATION", value_parser = duration)]
    run_for: Option<Duration>,
    /// Emit `paid` once to every workflow of the queue that has not ended, at the start
    #[arg(long)]
    emit_paid: bool,
    /// Abort the process (std::process::abort) right after the first step N it runs has
    /// recorded its result
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=5))]
    abort_after_step: Option<u32>,
}

/// A duration flag: `250ms`, `2s`, `1m` or plain seconds.
fn duration(text: &str) -> Result<Duration, String> {
    rowbus::duration::parse_duration(text).map_err(|e| e.to_string())
}

/// What every run of the workflow in this process shares.
struct Shop {
    log: PathBuf,
    sleep: Duration,
    abort_after_step: Option<u32>,
    /// Held (shared) by each step from its start to its recorded result; the abort takes it
    /// alone, so that it comes between steps.
    gate: RwLock<()>,
}

impl Shop {
    /// Step `n` of workflow `ctx`: appends its line, then records its result (`n`). On a
    /// replay of a recorded step, neither.
    async fn step<DB: Db>(&self, ctx: &Context<DB>, n: u32) -> Result<u32, WorkflowError> {
        let line = format!("STEP {n} {}\n", ctx.workflow_id());
        let gate = self.gate.read().await;
        let mut ran = false;
        let result = ctx
            .step(&format!("step {n}"), || {
                ran = true;
                let (log, line) = (self.log.clone(), line.clone());
                async move { append(&log, &line).map(|()| n) }
            })
            .await?;
        drop(gate);
        if ran && self.abort_after_step == Some(n) {
            let _alone = self.gate.write().await;
            eprintln!("checkout_workflow: aborting after step {n} of {}", ctx.workflow_id());
            std::process::abort();
        }
        Ok(result)
    }
}

/// Appends `line` to the file at `path` in one write.
fn append(path: &std::path::Path, line: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(line.as_bytes())
}

/// The workflow: order `order`'s five steps, the sleep after the third, the wait for `paid`
/// before the fifth.
async fn checkout<DB: Db>(ctx: Context<DB>, shop: Arc<Shop>, order: u32) -> Result<String, WorkflowError> {
    let mut sum = 0;
    for n in 1..=5 {
        if n == 4 {
            ctx.sleep(shop.sleep).await?;
        }
        if n == 5 {
            let _payment: Option<serde_json::Value> = ctx.wait_for_event("paid", None).await?;
        }
        sum += shop.step(&ctx, n).await?;
    }
    Ok(format!("order {order} checked out ({sum})"))
}

/// The example on the URL's database.
struct Run {
    args: Args,
}

impl OnPool for Run {
    type Output = Result<(), Box<dyn std::error::Error>>;

    async fn run<DB: Db>(self, pool: rowbus::sqlx::Pool<DB>) -> Self::Output {
        let args = self.args;
        let broker = Broker::new(pool, BrokerOptions::default()).await?;
        let result = run_on(&broker, &args).await;
        broker.shutdown(Duration::from_secs(5)).await;
        result
    }
}

async fn run_on<DB: Db>(broker: &Broker<DB>, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let queue = broker.queue(&args.queue)?;
    if !queue.is_deployed().await? {
        queue.deploy().await?;
    }
    let workflows = Workflows::new(queue.clone());
    workflows.deploy().await?;
    let shop = Arc::new(Shop {
        log: args.log.clone(),
        sleep: args.sleep,
        abort_after_step: args.abort_after_step,
        gate: RwLock::new(()),
    });
    workflows.register(WORKFLOW, move |ctx: Context<DB>, order: u32| checkout(ctx, shop.clone(), order));

    for order in 0..args.start {
        let id = workflows.start(WORKFLOW, &order).await?;
        println!("{id}");
    }
    if args.emit_paid {
        for workflow in workflows.list(Some(Status::Running), EMIT_PAGE).await? {
            workflows.emit_event(&workflow.id, "paid", &"card").await?;
        }
    }

    let runner = {
        let (workflows, queue) = (workflows.clone(), queue.clone());
        let subscription = queue.subscribe().workers(args.workers).lease(LEASE).heartbeat(true);
        tokio::spawn(async move { workflows.run(subscription).await })
    };
    let began = Instant::now();
    loop {
        if workflows.list(Some(Status::Running), 1).await?.is_empty() {
            break;
        }
        if runner.is_finished() || args.run_for.is_some_and(|limit| began.elapsed() >= limit) {
            break;
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    if runner.is_finished() {
        runner.await??;
    }
    let running = workflows.list(Some(Status::Running), EMIT_PAGE).await?.len();
    eprintln!("checkout_workflow: {running} workflows of `{}` not ended", args.queue);
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let temporary = args.database_url.is_none().then(|| TempDatabase::new("checkout_workflow"));
    let url = match (&args.database_url, &temporary) {
        (Some(url), _) => url.clone(),
        (None, Some(database)) => database.url(),
        (None, None) => unreachable!("a temporary database without a URL"),
    };
    // A connection per worker, and a few for the starts, the sleeps' snoozes and the looks.
    let size = u32::try_from(args.workers).unwrap_or(u32::MAX).saturating_add(4);
    let done = match DbPool::connect_creating(&url, size).await {
        Ok(db) => {
            let done = db.run(Run { args }).await;
            db.close().await;
            done
        }
        Err(e) => Err(e.into()),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("checkout_workflow: error: {e}");
            ExitCode::FAILURE
        }
    }
}
