//! `rowbus bench workflows`: durable workflows of no-op steps at rowbus's defaults, measured
//! as benches/workflows measures its peers (DBOS Transact, Absurd): N workflows started one
//! by one while the workers run, timed from the first start to the last end; then the
//! latency from start to result of one workflow at a time on the idle workers, each started
//! after a random 0-1 s pause. On a queue of the run's own, dropped at the end.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use clap::Args;
use rowbus::workflow::{Context, WorkflowError, Workflows};
use rowbus::{Broker, BrokerOptions, Db, DbPool, OnPool};
use serde_json::json;

use super::{Jitter, percentiles};
use crate::cli_error::CliError;
use crate::queue_cmd::outln;

/// Options of `rowbus bench workflows`.
#[derive(Debug, Args)]
pub struct WorkflowsBench {
    /// Workflows in the throughput run, started one by one while the workers run
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    workflows: u32,
    /// No-op steps per workflow (each records its result)
    #[arg(long, value_name = "N", default_value_t = 5)]
    steps: u32,
    /// Workflows running at once
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    workers: u32,
    /// Workflows started one at a time on the idle workers, after a random 0-1 s pause
    /// each, for the start-to-result percentiles
    #[arg(long, value_name = "N", default_value_t = 50)]
    latency_samples: u32,
    /// Print one JSON line {system, version, mode, database, workers, workflows,
    /// steps_per_workflow, seconds, workflows_per_s, steps_per_s, p50_ms, p99_ms,
    /// latency_samples, recorded_p50_ms, recorded_p99_ms, loadavg_1m, steps_recorded}, as
    /// benches/workflows' drivers do
    #[arg(long)]
    json: bool,
}

/// The workflow measured.
const NOOP: &str = "noop";

/// Runs the benchmark on `url`.
pub(crate) async fn workflows(url: &str, args: WorkflowsBench) -> Result<(), CliError> {
    // A connection per worker, and a few for the starts and the reads.
    let db = DbPool::connect_creating(url, args.workers + 4).await?;
    let done = db.run(Run { args }).await;
    db.close().await;
    done
}

struct Run {
    args: WorkflowsBench,
}

impl OnPool for Run {
    type Output = Result<(), CliError>;

    async fn run<DB: Db>(self, pool: rowbus::sqlx::Pool<DB>) -> Self::Output {
        let broker = Broker::new(pool, BrokerOptions::default()).await?;
        let queue = broker.queue(&format!("rowbus_bench_wf_{}", std::process::id()))?;
        queue.deploy().await?;
        let workflows = Workflows::new(queue.clone());
        let measured = async {
            workflows.deploy().await.map_err(wf)?;
            measure(&workflows, &self.args).await
        }
        .await;
        broker.shutdown(Duration::from_secs(5)).await;
        let dropped = workflows.drop_tables().await.map_err(wf);
        queue.undeploy().await?;
        let figures = measured?;
        dropped?;
        print(&self.args, DB::BACKEND.name(), &figures)
    }
}

/// A workflow error in the command's words.
fn wf(error: WorkflowError) -> CliError {
    match error {
        WorkflowError::Db(error) => CliError::Rowbus(error),
        other => CliError::Message(other.to_string()),
    }
}

/// What was measured.
struct Figures {
    seconds: f64,
    latencies: Vec<Duration>,
    recorded: Vec<Duration>,
    steps_recorded: usize,
}

async fn measure<DB: Db>(workflows: &Workflows<DB>, args: &WorkflowsBench) -> Result<Figures, CliError> {
    let steps = args.steps;
    workflows.register(NOOP, move |ctx: Context<DB>, (): ()| async move {
        for n in 0..steps {
            ctx.step(&format!("step {n}"), || async move { Ok::<_, Infallible>(n) }).await?;
        }
        Ok::<_, WorkflowError>(())
    });
    let runner = {
        let (workflows, queue) = (workflows.clone(), workflows.queue().clone());
        let workers = usize::try_from(args.workers).unwrap_or(usize::MAX);
        tokio::spawn(async move { workflows.run(queue.subscribe().workers(workers)).await })
    };

    // Throughput: started one by one while the workers run, timed to the last end.
    let began = Instant::now();
    let mut ids = Vec::with_capacity(args.workflows as usize);
    for _ in 0..args.workflows {
        ids.push(workflows.start(NOOP, &()).await.map_err(wf)?);
    }
    for id in &ids {
        workflows.result::<()>(id).await.map_err(wf)?;
    }
    let seconds = began.elapsed().as_secs_f64();
    let mut steps_recorded = 0;
    for id in &ids {
        steps_recorded += workflows.steps(id).await.map_err(wf)?.len();
    }

    // Latency: one at a time on the idle workers, after a random pause.
    let mut jitter = Jitter(u64::from(std::process::id()) | 1);
    let (mut latencies, mut recorded) = (Vec::new(), Vec::new());
    for _ in 0..args.latency_samples {
        tokio::time::sleep(Duration::from_secs_f64(jitter.next_unit())).await;
        let start = Instant::now();
        let id = workflows.start(NOOP, &()).await.map_err(wf)?;
        workflows.result::<()>(&id).await.map_err(wf)?;
        latencies.push(start.elapsed());
        if let Some(info) = workflows.get(&id).await.map_err(wf)? {
            recorded.push(info.updated_at.duration_since(info.created_at).unwrap_or_default());
        }
    }
    runner.abort();
    Ok(Figures { seconds, latencies, recorded, steps_recorded })
}

/// The 1-minute load average, where the system tells it.
fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// `x` rounded to `places` decimals.
fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

fn print(args: &WorkflowsBench, database: &str, figures: &Figures) -> Result<(), CliError> {
    let n = f64::from(args.workflows);
    let per_s = n / figures.seconds;
    let steps_per_s = n * f64::from(args.steps) / figures.seconds;
    let latency = percentiles(figures.latencies.clone());
    let recorded = percentiles(figures.recorded.clone());
    let sampled = !figures.latencies.is_empty();
    let expected = args.workflows as usize * args.steps as usize;
    if args.json {
        let line = json!({
            "system": "rowbus",
            "version": env!("CARGO_PKG_VERSION"),
            "mode": "defaults",
            "database": database,
            "workers": args.workers,
            "workflows": args.workflows,
            "steps_per_workflow": args.steps,
            "seconds": round(figures.seconds, 3),
            "workflows_per_s": round(per_s, 1),
            "steps_per_s": round(steps_per_s, 1),
            "p50_ms": sampled.then(|| round(latency.p50, 2)),
            "p99_ms": sampled.then(|| round(latency.p99, 2)),
            "latency_samples": figures.latencies.len(),
            "recorded_p50_ms": sampled.then(|| round(recorded.p50, 2)),
            "recorded_p99_ms": sampled.then(|| round(recorded.p99, 2)),
            "loadavg_1m": loadavg(),
            "steps_recorded": figures.steps_recorded,
        });
        outln!("{line}");
    } else {
        outln!(
            "{} workflows of {} no-op steps, {} workers, on {database}: {:.3} s, {per_s:.1} workflows/s, \
             {steps_per_s:.1} steps/s ({} step results recorded)",
            args.workflows,
            args.steps,
            args.workers,
            figures.seconds,
            figures.steps_recorded
        );
        if sampled {
            outln!(
                "start to result, one at a time on idle workers ({} samples): p50 {:.2} ms, p99 {:.2} ms \
                 (as recorded: p50 {:.2} ms, p99 {:.2} ms)",
                figures.latencies.len(),
                latency.p50,
                latency.p99,
                recorded.p50,
                recorded.p99
            );
        }
    }
    if figures.steps_recorded != expected {
        return Err(CliError::Message(format!(
            "{} step results recorded where {expected} were expected",
            figures.steps_recorded
        )));
    }
    Ok(())
}
