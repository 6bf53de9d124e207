//! `rowbus-chaos`: faults against rowbus on a real database, and Jepsen-style counts of
//! what survived them. See docs/reliability.md. A crate of its own (`publish = false`) so
//! that the `rowbus` binary users install carries no fault injection.
//!
//! Scenarios: `broker` (at-least-once handlers), `broker-tx` (transactional handlers) and
//! `notify` (the listener). The driver (this process) publishes or notifies, and injects
//! the faults; consumers run in child processes of this binary (`rowbus-chaos consumer`).
//! Everyone connects under the least-privilege roles of scripts/roles.sh.

mod broker;
mod children;
mod consumer;
mod faults;
mod galera;
mod history;
mod notify;
mod random;
mod report;
mod roles;
mod server;
mod sql;
mod time;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use rowbus::{Backend, Broker, DbPool};
use sqlx::{MySql, Postgres, Sqlite};

use report::Report;
use roles::Role;
use sql::{Exec, Tables};

/// Errors of the harness: any error, reported on one line.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which scenarios to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Publishers and consumer processes under killed sessions and SIGKILLs
    Broker,
    /// The same with transactional handlers (`run_tx`): effects exactly once
    BrokerTx,
    /// Notifiers and listeners under killed listener connections
    Notify,
    /// All three, one after the other
    All,
}

#[derive(Debug, Parser)]
#[command(
    name = "rowbus-chaos",
    version,
    about = "Faults against a real database (killed sessions, SIGKILLed consumers, crashed \
             servers) and the counts of what survived them; see docs/reliability.md",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Database URL: postgres://, mysql://, mariadb:// or sqlite: (SQLite runs on a scratch
    /// file of its own)
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite:", global = true)]
    database_url: String,

    #[command(flatten)]
    chaos: ChaosArgs,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One consumer process of a broker scenario (started by the driver)
    #[command(hide = true)]
    Consumer(consumer::ConsumerArgs),
}

/// Options of a run.
#[derive(Debug, Clone, Args)]
struct ChaosArgs {
    /// How long each scenario runs under faults before it drains, e.g. 30s, 10m
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = rowbus::duration::parse_duration)]
    duration: Duration,
    /// The scenario to run
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    scenario: Scenario,
    /// Print the results as one JSON object
    #[arg(long)]
    json: bool,
    /// Messages published per second, all publishers together [default: 200; SQLite 100]
    #[arg(long)]
    rate: Option<u32>,
    /// Publishers (broker scenarios)
    #[arg(long, default_value_t = 8)]
    publishers: usize,
    /// Consumer processes (broker scenarios)
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    /// Workers per consumer process (broker scenarios)
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Notifier sessions (notify scenario)
    #[arg(long, default_value_t = 16)]
    notifiers: usize,
    /// Listeners (notify scenario)
    #[arg(long, default_value_t = 4)]
    listeners: usize,
    /// Every consumer session is killed this often, e.g. 500ms, 2s (broker scenarios; not on
    /// SQLite)
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = rowbus::duration::parse_duration)]
    kill_every: Duration,
    /// A consumer process is SIGKILLed and restarted this often, e.g. 10s, 1m (SQLite: twice
    /// --kill-every)
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = rowbus::duration::parse_duration)]
    sigkill_every: Duration,
    /// Half of the listeners lose their connection this often, e.g. 3s (notify scenario)
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = rowbus::duration::parse_duration)]
    listener_kill_every: Duration,
    /// The consumers' lease, e.g. 4s, 250ms
    #[arg(long, value_name = "DURATION", default_value = "4s", value_parser = rowbus::duration::parse_duration)]
    lease: Duration,
    /// Prefix of the run's tables (created if missing, emptied at the start)
    #[arg(long, default_value = "chaos")]
    prefix: String,
    /// Start a throwaway server of the URL's kind (its own data directory under the run
    /// directory and its own port; the URL's host is not used), crash it hard every
    /// --crash-every (`pg_ctl stop -m immediate`, `kill -9`) and start it again
    #[arg(long)]
    server_faults: bool,
    /// The URL lists the nodes of scripts/galera.sh's Galera cluster
    /// (mysql://root@127.0.0.1:3311,127.0.0.1:3312,127.0.0.1:3313/test), brought up if down:
    /// consumer i starts on node i (the others after it in its URL), and in the broker
    /// scenarios one node in turn is SIGKILLed and started again every --crash-every
    #[arg(long, conflicts_with = "server_faults")]
    galera_faults: bool,
    /// How often --server-faults crashes the server (--galera-faults a node), e.g. 30s, 1m
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = rowbus::duration::parse_duration)]
    crash_every: Duration,
    /// Keep the run's directory (consumer journals and logs, the SQLite file) even when
    /// the run is valid
    #[arg(long)]
    keep: bool,
}

/// What every scenario of a run shares.
pub(crate) struct Ctx {
    pub backend: Backend,
    pub database: &'static str,
    admin_url: String,
    /// An administrator's pool: set-up, kills, and reading the records.
    pub admin: DbPool,
    pub tables: Tables,
    pub run_id: i64,
    /// The run's directory: journals, logs, the SQLite file.
    pub dir: PathBuf,
    pub settings: ChaosArgs,
    /// The throwaway server of `--server-faults`.
    server: Option<tokio::sync::Mutex<server::Server>>,
    /// The cluster of `--galera-faults`.
    galera: Option<tokio::sync::Mutex<galera::Galera>>,
}

impl Ctx {
    /// The URL to connect as `role`.
    pub(crate) fn url(&self, role: Role) -> Result<String, BoxError> {
        roles::url(&self.admin_url, self.backend, role)
    }

    /// With `--server-faults`: crashes the throwaway server, leaves it down for a second,
    /// starts it again. Returns (crashed, accepting connections again), in µs.
    pub(crate) async fn crash_server(&self) -> Result<Option<(i64, i64)>, BoxError> {
        if let Some(galera) = &self.galera {
            let crashed = time::now_us();
            galera.lock().await.crash_next().await?;
            return Ok(Some((crashed, time::now_us())));
        }
        let Some(server) = &self.server else { return Ok(None) };
        let mut server = server.lock().await;
        let crashed = time::now_us();
        server.crash().await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        server.start().await?;
        Ok(Some((crashed, time::now_us())))
    }

    /// Whether the broker scenarios crash a server (`--server-faults`) or a Galera node
    /// (`--galera-faults`).
    pub(crate) fn crashes_servers(&self) -> bool {
        self.server.is_some() || self.galera.is_some()
    }

    /// When the first server crash of a scenario happens, and how often the next.
    pub(crate) fn crash_schedule(&self) -> (Duration, Duration) {
        let every = self.settings.crash_every;
        ((self.settings.duration / 3).min(every / 2), every)
    }
}

/// Recovery after each server restart: µs from accepting connections again until the
/// first of `events` after it (`None` when nothing happened afterwards).
pub(crate) fn recoveries(restarts: &[(i64, i64)], events: &[i64]) -> Vec<Option<i64>> {
    restarts.iter().map(|&(_, up)| events.iter().filter(|&&at| at >= up).min().map(|&at| at - up)).collect()
}

/// Runs the scenarios and prints their counts, or (`consumer`) one consumer process; exits
/// non-zero when a run is invalid or fails.
#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();
    let url = cli.database_url.as_str();
    let (name, outcome) = match cli.command {
        Some(Command::Consumer(args)) => {
            ("rowbus-chaos consumer", consumer::run(url, args).await.map(|()| true))
        }
        None => ("rowbus-chaos", run(url, cli.chaos).await),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("{name}: INVALID: a count that must be 0 is not (see above)");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("{name}: error: {}", one_line(&*error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, on one line.
fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !line.contains(&cause_text) {
            line.push_str(": ");
            line.push_str(&cause_text);
        }
        source = cause.source();
    }
    line.replace('\n', " ")
}

fn check_args(args: &ChaosArgs) -> Result<(), BoxError> {
    let ident = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if !ident(&args.prefix) || args.prefix.len() > 40 {
        return Err(format!(
            "invalid --prefix {:?}: a plain identifier of at most 40 characters",
            args.prefix
        )
        .into());
    }
    for (name, value) in [
        ("--publishers", args.publishers),
        ("--consumers", args.consumers),
        ("--workers", args.workers),
        ("--notifiers", args.notifiers),
        ("--listeners", args.listeners),
    ] {
        if value == 0 || value > 64 {
            return Err(format!("{name} must be between 1 and 64").into());
        }
    }
    for (name, value) in [
        ("--duration", args.duration),
        ("--kill-every", args.kill_every),
        ("--sigkill-every", args.sigkill_every),
        ("--listener-kill-every", args.listener_kill_every),
        ("--lease", args.lease),
        ("--crash-every", args.crash_every),
    ] {
        if value < Duration::from_millis(100) {
            return Err(format!("{name} must be at least 100ms").into());
        }
    }
    Ok(())
}

async fn run(url: &str, args: ChaosArgs) -> Result<bool, BoxError> {
    check_args(&args)?;
    let backend = Backend::from_url(url)?;
    if args.server_faults && backend == Backend::Sqlite {
        return Err("--server-faults needs a postgres:// or mysql:// URL".into());
    }
    if args.galera_faults && backend != Backend::MySql {
        return Err("--galera-faults needs a mysql:// URL listing the cluster's nodes".into());
    }
    let run_id = time::now_us() % 1_000_000_000;
    let dir = std::env::temp_dir().join(format!("rowbus-chaos-{}-{run_id}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Nothing ran yet when the set-up fails: nothing to keep.
    let mut ctx = match prepare(url, &args, backend, run_id, &dir).await {
        Ok(ctx) => ctx,
        Err(error) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(error);
        }
    };

    let scenarios: &[Scenario] = match args.scenario {
        Scenario::All => &[Scenario::Broker, Scenario::BrokerTx, Scenario::Notify],
        ref one => std::slice::from_ref(one),
    };
    let mut reports: Vec<Report> = Vec::new();
    for scenario in scenarios {
        let report = match scenario {
            Scenario::Broker => broker::run(&ctx, false).await?,
            Scenario::BrokerTx => broker::run(&ctx, true).await?,
            Scenario::Notify => notify::run(&ctx).await?,
            Scenario::All => unreachable!("expanded above"),
        };
        if !args.json {
            println!("{}", report.table());
        }
        reports.push(report);
    }
    ctx.admin.close().await;
    if let Some(server) = ctx.server.take() {
        server.into_inner().destroy().await;
    }
    let valid = reports.iter().all(Report::valid);
    if args.json {
        let scenarios: Vec<_> = reports.iter().map(Report::json).collect();
        let out = serde_json::json!({
            "database": ctx.database,
            "duration_s": args.duration.as_secs_f64(),
            "valid": valid,
            "dir": if valid && !args.keep { None } else { Some(dir.display().to_string()) },
            "scenarios": scenarios,
        });
        println!("{out}");
    }
    if valid && !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    } else if !args.json {
        eprintln!("rowbus-chaos: journals, consumer logs and records kept in {}", dir.display());
    }
    Ok(valid)
}

/// Connects (starting the throwaway server first with `--server-faults`), creates the
/// tables and the roles.
async fn prepare(
    url: &str,
    args: &ChaosArgs,
    backend: Backend,
    run_id: i64,
    dir: &std::path::Path,
) -> Result<Ctx, BoxError> {
    let server = match args.server_faults {
        true => Some(server::Server::create(backend, &dir.join("server")).await?),
        false => None,
    };
    let galera = match args.galera_faults {
        true => Some(tokio::sync::Mutex::new(galera::Galera::new(url).await?)),
        false => None,
    };
    // SQLite: a scratch file of the run's own, never the file the URL names.
    let admin_url = match (&server, backend) {
        (Some(server), _) => server.url(),
        (None, Backend::Sqlite) => format!("sqlite://{}", dir.join("chaos.sqlite").display()),
        (None, _) => url.to_owned(),
    };
    // It makes the tables: on SQLite the scratch file too.
    let admin = DbPool::connect_creating(&admin_url, 4).await?;
    let ctx = Ctx {
        backend,
        database: backend.name(),
        admin_url,
        admin,
        tables: Tables::new(&args.prefix),
        run_id,
        dir: dir.to_owned(),
        settings: args.clone(),
        server: server.map(tokio::sync::Mutex::new),
        galera,
    };
    if !args.json {
        eprintln!(
            "rowbus-chaos: {} ({}), {} per scenario; records in {}",
            ctx.database,
            rowbus::redact(url),
            time::human(args.duration),
            dir.display()
        );
        if args.galera_faults {
            eprintln!(
                "rowbus-chaos: a Galera node SIGKILLed and started again every {} (broker scenarios)",
                time::human(args.crash_every)
            );
        }
        if args.server_faults {
            eprintln!(
                "rowbus-chaos: a throwaway server at {}, crashed every {}",
                ctx.admin_url,
                time::human(args.crash_every)
            );
        }
    }
    setup(&ctx).await?;
    Ok(ctx)
}

/// Creates the run's tables (as the administrator) and the roles, with their grants.
async fn setup(ctx: &Ctx) -> Result<(), BoxError> {
    // The queue, its dead letters and the broker's notify table, as Queue::deploy makes
    // them; the notify scenario's table; the records.
    let options = consumer::broker_options(&ctx.tables, ctx.settings.lease);
    match ctx.backend {
        Backend::Postgres => deploy::<Postgres>(ctx, options).await?,
        Backend::MySql => deploy::<MySql>(ctx, options).await?,
        Backend::Sqlite => deploy::<Sqlite>(ctx, options).await?,
    }
    ctx.admin.deploy_notify_table(&notify::config(&ctx.tables)).await?;
    sql::batch(&ctx.admin, &ctx.tables.create(ctx.backend)).await?;
    roles::apply(&ctx.admin, &ctx.tables).await?;
    Ok(())
}

async fn deploy<DB: Exec>(ctx: &Ctx, options: rowbus::BrokerOptions) -> Result<(), BoxError> {
    let pool = DB::typed(&ctx.admin).ok_or("the admin pool is of another database")?;
    let broker = Broker::new(pool, options).await?;
    // Dropped first: the run empties its tables anyway, and a table left by an older
    // rowbus would keep an older schema.
    let queue = broker.queue(&ctx.tables.queue)?;
    queue.undeploy().await?;
    queue.deploy().await?;
    broker.shutdown(Duration::from_secs(1)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run's durations are read by rowbus's one parser: units, decimals, plain seconds.
    #[test]
    fn durations_take_units() {
        let cli = Cli::try_parse_from([
            "rowbus-chaos",
            "--duration",
            "10m",
            "--kill-every",
            "1.5s",
            "--lease",
            "4",
        ])
        .unwrap();
        let args = cli.chaos;
        assert_eq!(
            (args.duration, args.kill_every, args.lease, args.crash_every),
            (
                Duration::from_secs(600),
                Duration::from_millis(1500),
                Duration::from_secs(4),
                Duration::from_secs(60)
            )
        );
        let err = Cli::try_parse_from(["rowbus-chaos", "--duration", "5w"]).unwrap_err().to_string();
        assert!(err.contains("invalid value '5w' for '--duration <DURATION>'"), "{err}");
    }
}
