//! The `rowbus` command: LISTEN/NOTIFY on PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! Past 800 lines: the one `Command` enum (every subcommand's help) and its dispatch, which
//! read best whole; each command's work is in a module of its own.

mod bench;
mod cancel_cmd;
mod cli_error;
mod consume;
mod dead_cmd;
mod demo;
mod exec;
mod group;
mod history_cmd;
mod limit_cmd;
mod pause_cmd;
mod publish;
mod queue_cmd;
mod relay_cmd;
mod schedule_cmd;
mod stats;
mod ui;
mod undeploy_cmd;
mod workflow_cmd;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use rowbus::durable::Resume;
use rowbus::{Db, DbPool, Event, Listener, ListenerOptions, Notifier, NotifyConfig, OnPool, QueueTable};

use crate::cli_error::CliError;

/// The database used when neither --database-url nor DATABASE_URL is given.
const DEFAULT_URL: &str = "sqlite://rowbus.sqlite";

#[derive(Debug, Parser)]
#[command(name = "rowbus", version, about = "Messaging over the SQL database you already run")]
struct Cli {
    /// Database URL: postgres://, mysql://, mariadb:// or sqlite:
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, global = true)]
    database_url: String,

    /// A direct URL to listen on (`listen`, `consume --listen-notify`, the wake-ups of
    /// `publish` and `dead requeue`), when --database-url goes through PgBouncer in
    /// transaction pooling mode (`?pgbouncer=true`): LISTEN needs a session of its own
    /// [default: --database-url]
    #[arg(long, env = "ROWBUS_LISTEN_URL", global = true, value_name = "URL")]
    listen_url: Option<String>,

    #[command(flatten)]
    notify_table: NotifyTableArgs,

    #[command(subcommand)]
    command: Command,
}

/// The heading of the notify table's flags in `--help`: they are global, and say where
/// they matter.
const NOTIFY_TABLE_HEADING: &str = "Notify table (MySQL/MariaDB and SQLite; PostgreSQL has LISTEN/NOTIFY)";

/// The notify table's settings (MySQL/MariaDB and SQLite).
#[derive(Debug, Args)]
struct NotifyTableArgs {
    /// Notify table name [default: rowbus_notify]
    #[arg(long, global = true, help_heading = NOTIFY_TABLE_HEADING, value_name = "NAME")]
    notify_table: Option<String>,
    /// Time between two polls of the notify table, at least 1ms, e.g. 50ms, 0.05, 2s
    /// [default: 1s]
    #[arg(long, global = true, help_heading = NOTIFY_TABLE_HEADING, value_name = "DURATION")]
    poll_interval: Option<String>,
    /// How long a notifying transaction may stay open and still be caught, e.g. 30s, 2m
    /// [default: 1m]
    #[arg(long, global = true, help_heading = NOTIFY_TABLE_HEADING, value_name = "DURATION")]
    lookback: Option<String>,
    /// How long a notification is kept before cleanup, e.g. 1h; 0 turns cleanup off
    /// [default: 1h]
    #[arg(long, global = true, help_heading = NOTIFY_TABLE_HEADING, value_name = "DURATION")]
    retention: Option<String>,
    /// Rows one cleanup statement deletes at most [default: 1000]
    #[arg(long, global = true, help_heading = NOTIFY_TABLE_HEADING, value_name = "N")]
    cleanup_limit: Option<String>,
}

impl NotifyTableArgs {
    fn config(&self) -> Result<NotifyConfig, rowbus::Error> {
        self.applied_to(NotifyConfig::default())
    }

    /// `config` with the settings given on the command line.
    fn applied_to(&self, mut config: NotifyConfig) -> Result<NotifyConfig, rowbus::Error> {
        for (key, value) in [
            ("table", &self.notify_table),
            ("poll_interval", &self.poll_interval),
            ("lookback", &self.lookback),
            ("retention", &self.retention),
            ("cleanup_limit", &self.cleanup_limit),
        ] {
            if let Some(value) = value {
                config.set(key, value)?;
            }
        }
        config.validate()?;
        Ok(config)
    }
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Notify-to-receive latency and the notifications/s one listener keeps up with; off
    /// PostgreSQL (and with --durable) on a notify table of the run's own, dropped at the
    /// end (--notify-table: that one), polled every 50ms as the broker's is (--poll-interval
    /// sets it; the latency follows it)
    Notify(bench::NotifyBench),
    /// Table broker: publish and drain rates against a raw sqlx loop, and wake-up latency
    /// (minutes with the defaults, more on a slow disk; --messages and --rounds shorten it;
    /// progress on a terminal)
    Broker(bench::broker::BrokerBench),
    /// A queue at a steady rate before, while and after another connection holds the
    /// database's horizon open (a REPEATABLE READ transaction on PostgreSQL, a consistent
    /// snapshot on MySQL/MariaDB): handled a second, claim and publish-to-handler
    /// percentiles, dead rows, size and memory, a line per window (minutes: run it on a
    /// server of its own, see benches/horizon)
    Horizon(bench::horizon::HorizonBench),
    /// Durable workflows: N workflows of no-op steps started while the workers run
    /// (workflows/s, steps/s), then start-to-result latency on idle workers (p50, p99)
    Workflows(bench::workflows::WorkflowsBench),
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create what rowbus needs: the notify table (on PostgreSQL only with --durable), queue
    /// tables, and a missing SQLite file (no other command makes one)
    Deploy {
        /// On PostgreSQL, also the notify table and the positions table that durable
        /// listeners (`listen --durable`) and durable notifications (`notify --durable`)
        /// use; elsewhere they are always made
        #[arg(long)]
        durable: bool,
        /// Also create this queue table, its claim index, its dead-letter table
        /// `<TABLE>_dead` and its pause table `<TABLE>_pause` (repeatable; again on a queue
        /// made by an older rowbus adds what it lacks)
        #[arg(long = "queue", value_name = "TABLE")]
        queues: Vec<String>,
        /// Keep each queue's handled messages (acknowledged, dropped, dead-lettered) this
        /// long in `<TABLE>_hist` (read with `rowbus history`), e.g. 7d, 12h; 0 stops
        /// keeping and lets the consumers delete what was kept [default: as it was]
        #[arg(long, value_name = "DURATION", value_parser = queue_cmd::duration, requires = "queues")]
        keep: Option<std::time::Duration>,
        /// On PostgreSQL, create the schema of a `--queue SCHEMA.TABLE` that does not exist
        /// (without it a missing schema is refused, so that a typo creates nothing). On
        /// MySQL/MariaDB the qualifier is a database, which rowbus never creates
        #[arg(long, requires = "queues")]
        create_schema: bool,
    },
    /// Publish a message (or each line of stdin) to a queue table
    Publish(publish::PublishArgs),
    /// Handle a queue table's messages until interrupted: print them, or run a command on each
    #[command(after_help = consume::AFTER_HELP)]
    Consume(consume::ConsumeArgs),
    /// Relay a queue table's messages to a message broker (NATS JetStream, Redis Streams,
    /// RabbitMQ, MQTT), each removed once the broker confirmed it: the transactional outbox
    #[command(after_help = relay_cmd::AFTER_HELP)]
    Relay(relay_cmd::RelayArgs),
    /// Print the handled messages a queue deployed with `--keep` keeps, newest first (on a
    /// queue that keeps none, it says so on stderr)
    History(history_cmd::HistoryArgs),
    /// Print notifications on the channels, one line each, until interrupted (a closed
    /// stdout, `| head -1`, ends it quietly with status 0)
    Listen {
        /// Print JSON lines {"channel": ..., "payload": ..., "pid": ...} instead of
        /// `CHANNEL: PAYLOAD`, where the payload is as sent but for line feeds, carriage
        /// returns and other control characters (tabs aside), written \n, \r, \u{1b}; a
        /// plain notification on a durable channel (PostgreSQL) has "durable": false
        #[arg(long)]
        json: bool,
        /// Listen durably under this name: resume after the last line written by a
        /// `listen` with the same name, so that nothing committed while none ran is missed
        /// (a line written just before a crash may come again). On PostgreSQL it reads what
        /// `notify --durable` sent (deploy with `deploy --durable`); a plain `notify` is
        /// printed while it runs, but not resumed
        #[arg(long, value_name = "NAME")]
        durable: Option<String>,
        /// How long the durable name stays this process's after it stops checking in
        /// (a crash): another `listen --durable` with the name waits until then
        #[arg(long, value_name = "DURATION", value_parser = queue_cmd::positive_duration, requires = "durable")]
        lease: Option<std::time::Duration>,
        /// Refuse at once when another process holds the durable name, instead of waiting
        /// (at most until its lease runs out: a crashed owner's name is taken then)
        #[arg(long, requires = "durable")]
        no_wait: bool,
        /// Instead of listening, forget durable listener NAME on the channels: its position
        /// is deleted (a later `listen --durable NAME` starts afresh) and it leaves `rowbus
        /// stats`. Refused while a process holds the name
        #[arg(long, value_name = "NAME", conflicts_with_all = ["durable", "json"])]
        forget: Option<String>,
        /// The channels
        #[arg(required = true)]
        channels: Vec<String>,
    },
    /// Drop queue tables with every table of their own (dead letters, pause, schedules,
    /// history...) and every message in them; refused while messages are in flight
    Undeploy(undeploy_cmd::UndeployArgs),
    /// Send one notification
    Notify {
        /// The channel
        channel: String,
        /// The payload (empty when left out)
        #[arg(default_value = "")]
        payload: String,
        /// On PostgreSQL, also write it to the notify table (in the same transaction as its
        /// pg_notify), for durable listeners (`listen --durable`), which otherwise get it
        /// only while they run; elsewhere it always is
        #[arg(long)]
        durable: bool,
    },
    /// Queue tables as they stand (per group: depth, ready, delayed, in flight, oldest, dead, paused)
    /// and the notify table's size and lag
    ///
    /// A part the database refuses this role (a queue table, the notify table, the durable
    /// listeners) gets a line saying so, "not readable by this role (permission denied)",
    /// and the rest is shown. Exits 1 when a queue table could not be read, 0 otherwise
    /// (the notify table or durable listeners unreadable alone do not fail it).
    Stats(stats::StatsArgs),
    /// Stop every consumer of a queue (or of one group) from taking messages, in every
    /// process, until `rowbus resume`; publishing goes on
    Pause(pause_cmd::PauseArgs),
    /// Let consumers take a paused queue's (or group's) messages again
    Resume(pause_cmd::PauseArgs),
    /// Limit a queue (or one group) across every consumer and process: messages in flight
    /// at once (--max-running), of one key at once (--per-key), started per period
    /// (--rate 100/s); --clear them, --list them
    Limit(limit_cmd::LimitArgs),
    /// See a queue at work: publishers, workers, retries, latency; nothing to set up
    Demo(demo::DemoArgs),
    /// Publish a message to a queue on a timetable (--every, --cron), from every running
    /// consumer of it, each tick once; --remove one, --list them
    Schedule(schedule_cmd::ScheduleArgs),
    /// Cancel messages whatever their state: removed from the queue (kept as cancelled
    /// where the queue keeps history); a consumer running one is told to stop it (--exec:
    /// SIGTERM, SIGKILL after its --grace); prints what it cancelled
    Cancel(cancel_cmd::CancelArgs),
    /// A queue's durable workflows: list them, show one's steps, sleeps and awaited
    /// events, cancel one, emit an event to one
    Workflow {
        #[command(subcommand)]
        what: workflow_cmd::WorkflowCommand,
    },
    /// A queue's dead letters: list them, put them back, purge them
    Dead {
        #[command(subcommand)]
        what: dead_cmd::DeadCommand,
    },
    /// Measure rowbus on the chosen database
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Serve a dashboard of the queues (a page, its JSON at /api/queues) and Prometheus
    /// metrics at /metrics, on loopback unless told otherwise
    Ui(ui::UiArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // lapin logs an error of its own when RabbitMQ closes a connection; `rowbus relay`
    // says what happened, and what it does about it, in its own words.
    // `bench horizon` times the library's claims beside the log, with a filter of its own.
    use tracing_subscriber::prelude::*;
    let log_filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error,rowbus_relay=warn,lapin=off"));
    // Colour only for a person at a terminal who did not ask for none (NO_COLOR): a log
    // file or a pipe gets the plain words.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(colour)
                .with_filter(log_filter),
        )
        .with(bench::claim_times::layer())
        .init();
    match run(cli).await {
        // As a pipeline expects of `rowbus listen | head -1`.
        Ok(()) | Err(CliError::OutputClosed) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rowbus: error: {}", error.line());
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, on one line.
fn one_line(error: &rowbus::Error) -> String {
    cli_error::in_cli_words(&error.one_line())
}

/// `--listen-url`, set once from the command line before any command runs.
static LISTEN_URL: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// The URL to listen on for a command on `url`: `--listen-url`, else `url` itself unless
/// it goes through PgBouncer in transaction pooling mode (`None` then: no session to
/// LISTEN on).
pub(crate) fn listen_url(url: &str) -> Option<String> {
    match LISTEN_URL.get().and_then(Option::as_ref) {
        Some(listen) => Some(listen.clone()),
        None if rowbus::uses_pgbouncer(url).unwrap_or(false) => None,
        None => Some(url.to_owned()),
    }
}

/// Says that the wake-ups a command would send are off: its URL goes through PgBouncer
/// and no `--listen-url` was given.
pub(crate) fn warn_no_wake_ups() {
    eprintln!(
        "rowbus: warning: through PgBouncer (pgbouncer=true) without --listen-url, consumers in other \
         processes are not woken: they find the messages at their next poll (give a direct URL with \
         --listen-url or ROWBUS_LISTEN_URL)"
    );
}

async fn run(cli: Cli) -> Result<(), CliError> {
    let config = cli.notify_table.config()?;
    let url = cli.database_url.as_str();
    let _ = LISTEN_URL.set(cli.listen_url.clone());
    match cli.command {
        Command::Deploy { queues, keep, durable, create_schema } => {
            let tables = queue_cmd::parse_tables(&queues)?;
            on_database(url, 1, &config, QueueCommand::Deploy(tables, keep, durable, create_schema)).await?;
        }
        Command::History(args) => {
            queue_cmd::parse_tables(std::slice::from_ref(&args.table))?;
            on_database(url, 1, &config, QueueCommand::History(args)).await?;
        }
        Command::Publish(args) => {
            queue_cmd::parse_tables(std::slice::from_ref(&args.table))?;
            args.check()?;
            on_database(url, 2, &config, QueueCommand::Publish(args)).await?;
        }
        Command::Consume(args) => {
            queue_cmd::parse_tables(std::slice::from_ref(&args.table))?;
            on_database(url, args.pool_size(), &config, QueueCommand::Consume(args)).await?;
        }
        Command::Relay(args) => {
            queue_cmd::parse_tables(std::slice::from_ref(&args.table))?;
            args.target()?;
            on_database(url, args.pool_size(), &config, QueueCommand::Relay(args)).await?;
        }
        Command::Stats(args) => {
            queue_cmd::parse_tables(&args.tables)?;
            on_database(url, 1, &config, QueueCommand::Stats(args)).await?;
        }
        Command::Demo(args) => on_database(url, 16, &config, QueueCommand::Demo(args)).await?,
        Command::Cancel(args) => {
            queue_cmd::parse_tables(std::slice::from_ref(&args.table))?;
            on_database(url, 2, &config, QueueCommand::Cancel(args)).await?;
        }
        Command::Dead { what } => {
            queue_cmd::parse_tables(std::slice::from_ref(what.table()))?;
            what.check()?;
            on_database(url, 2, &config, QueueCommand::Dead(what)).await?;
        }
        Command::Workflow { what } => {
            queue_cmd::parse_tables(std::slice::from_ref(what.table()))?;
            on_database(url, 2, &config, QueueCommand::Workflow(what)).await?;
        }
        Command::Pause(args) => {
            queue_cmd::parse_tables(std::slice::from_ref(&args.table))?;
            on_database(url, 1, &config, QueueCommand::Pause(pause_cmd::Action::Pause, args)).await?;
        }
        Command::Resume(args) => {
            queue_cmd::parse_tables(std::slice::from_ref(&args.table))?;
            on_database(url, 1, &config, QueueCommand::Pause(pause_cmd::Action::Resume, args)).await?;
        }
        Command::Limit(args) => {
            args.check()?;
            if let Some(table) = &args.table {
                queue_cmd::parse_tables(std::slice::from_ref(table))?;
            }
            on_database(url, 1, &config, QueueCommand::Limit(args)).await?;
        }
        Command::Notify { channel, payload, durable } => {
            let notifier = if durable { Notifier::durable(config)? } else { Notifier::new(config)? };
            let db = DbPool::connect_with_size(url, 1).await?;
            let sent = db.notify_with(&notifier, &channel, &payload).await;
            db.close().await;
            sent?;
        }
        Command::Listen { forget: Some(name), channels, .. } => {
            let db = DbPool::connect_with_size(url, 1).await?;
            let forgotten = undeploy_cmd::forget(&db, &config, &channels, &name).await;
            db.close().await;
            forgotten?;
        }
        Command::Listen { json, channels, durable, lease, no_wait, forget: None } => {
            if let Some(name) = &durable {
                durable_name(name)?;
            }
            let durable = durable.as_deref().map(|name| Durably { name, lease, wait: !no_wait });
            listen(url, config, &channels, json, durable).await?
        }
        Command::Bench { what: BenchCommand::Notify(args) } => {
            // The broker's notify table defaults (50 ms polls), with what was given, on a
            // table of the run's own unless one was named.
            let mut config = cli.notify_table.applied_to(rowbus::BrokerOptions::default().notify_table)?;
            let own = cli.notify_table.notify_table.is_none();
            if own {
                config
                    .set("table", &format!("rowbus_bench_{}", std::process::id()))
                    .map_err(rowbus::Error::from)?;
            }
            bench::notify(url, config, own, args).await?
        }
        Command::Bench { what: BenchCommand::Broker(args) } => {
            // The broker's own notify table defaults (50 ms polls), with what was given.
            let notify_table = cli.notify_table.applied_to(rowbus::BrokerOptions::default().notify_table)?;
            bench::broker::broker(url, notify_table, args).await?
        }
        Command::Bench { what: BenchCommand::Horizon(args) } => {
            let notify_table = cli.notify_table.applied_to(rowbus::BrokerOptions::default().notify_table)?;
            bench::horizon::horizon(url, notify_table, args).await?
        }
        Command::Bench { what: BenchCommand::Workflows(args) } => {
            bench::workflows::workflows(url, args).await?
        }
        Command::Ui(args) => on_database(url, 4, &config, QueueCommand::Ui(args)).await?,
        Command::Undeploy(args) => on_database(url, 1, &config, QueueCommand::Undeploy(args)).await?,
        Command::Schedule(args) => schedule_cmd::schedule(url, args).await?,
    }
    Ok(())
}

/// A command that works on a pool of the URL's database, written once for all three.
enum QueueCommand {
    Deploy(Vec<QueueTable>, Option<std::time::Duration>, bool, bool),
    History(history_cmd::HistoryArgs),
    Publish(publish::PublishArgs),
    Consume(consume::ConsumeArgs),
    Relay(relay_cmd::RelayArgs),
    Stats(stats::StatsArgs),
    Demo(demo::DemoArgs),
    Dead(dead_cmd::DeadCommand),
    Workflow(workflow_cmd::WorkflowCommand),
    Cancel(cancel_cmd::CancelArgs),
    Ui(ui::UiArgs),
    Pause(pause_cmd::Action, pause_cmd::PauseArgs),
    Undeploy(undeploy_cmd::UndeployArgs),
    Limit(limit_cmd::LimitArgs),
}

/// A [`QueueCommand`] with what every one of them needs.
struct OnDatabase<'a> {
    db: &'a DbPool,
    url: &'a str,
    config: &'a NotifyConfig,
    command: QueueCommand,
}

impl OnPool for OnDatabase<'_> {
    type Output = Result<(), CliError>;

    async fn run<DB: Db>(self, pool: rowbus::sqlx::Pool<DB>) -> Self::Output {
        let (url, config) = (self.url, self.config);
        match self.command {
            QueueCommand::Deploy(tables, keep, durable, create_schema) => {
                let options = queue_cmd::DeployFlags { keep, durable, create_schema };
                queue_cmd::deploy(self.db, pool, config, &tables, options).await
            }
            QueueCommand::History(args) => history_cmd::history(pool, url, args).await,
            QueueCommand::Publish(args) => publish::publish(pool, url, config, args).await,
            QueueCommand::Consume(args) => consume::consume(pool, url, config, args).await,
            QueueCommand::Relay(args) => relay_cmd::relay(pool, url, config, args).await,
            QueueCommand::Stats(args) => stats::stats(pool, url, config, args).await,
            QueueCommand::Demo(args) => demo::demo(pool, url, config, args).await,
            QueueCommand::Dead(what) => dead_cmd::dead(pool, url, config, what).await,
            QueueCommand::Workflow(what) => workflow_cmd::workflow(pool, url, config, what).await,
            QueueCommand::Cancel(args) => cancel_cmd::cancel(pool, url, config, args).await,
            QueueCommand::Ui(args) => ui::ui(pool, url, config, args).await,
            QueueCommand::Pause(action, args) => pause_cmd::pause(pool, url, config, action, args).await,
            QueueCommand::Undeploy(args) => undeploy_cmd::undeploy(pool, url, args).await,
            QueueCommand::Limit(args) => limit_cmd::limit(pool, url, config, args).await,
        }
    }
}

/// Connects a pool of up to `max` connections, runs `command` on it, and closes it. Only
/// the commands that make tables (`deploy`, `demo`) make a missing SQLite file: the
/// others would leave an empty database behind a mistyped URL.
async fn on_database(
    url: &str,
    max: u32,
    config: &NotifyConfig,
    command: QueueCommand,
) -> Result<(), CliError> {
    let db = match command {
        QueueCommand::Deploy(..) | QueueCommand::Demo(_) => DbPool::connect_creating(url, max).await?,
        QueueCommand::Publish(_)
        | QueueCommand::Consume(_)
        | QueueCommand::Relay(_)
        | QueueCommand::Stats(_)
        | QueueCommand::Dead(_)
        | QueueCommand::Workflow(_)
        | QueueCommand::Cancel(_)
        | QueueCommand::History(_)
        | QueueCommand::Ui(_)
        | QueueCommand::Pause(..)
        | QueueCommand::Undeploy(_) => DbPool::connect_with_size(url, max).await?,
        QueueCommand::Limit(_) => DbPool::connect_with_size(url, max).await?,
    };
    let done = db.run(OnDatabase { db: &db, url, config, command }).await;
    // Closing waits for every connection to come back. One may be held by a statement
    // that finishes by itself after its caller went (a claim blocked behind another
    // session's lock when a consumer was stopped): not waited for long, as the process
    // ends anyway and the server then drops the connection.
    let _ = tokio::time::timeout(POOL_CLOSE_WAIT, db.close()).await;
    done
}

/// The longest a command waits, as it ends, for its pool's connections to come back.
const POOL_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// `listen --durable NAME`: the name, the lease, whether to wait for a name another holds.
#[derive(Clone, Copy)]
struct Durably<'a> {
    name: &'a str,
    lease: Option<std::time::Duration>,
    wait: bool,
}

async fn listen(
    url: &str,
    config: NotifyConfig,
    channels: &[String],
    json: bool,
    durably: Option<Durably<'_>>,
) -> Result<(), CliError> {
    let durable = durably.map(|d| d.name);
    let mut options = ListenerOptions { notify_table: config, ..ListenerOptions::default() };
    if let Some(lease) = durably.and_then(|d| d.lease) {
        options.durable_lease = lease;
    }
    // A URL through PgBouncer is refused there, naming --listen-url.
    let listen = listen_url(url).unwrap_or_else(|| url.to_owned());
    let mut listener = Listener::connect_with(&listen, options).await?;
    for channel in channels {
        match durably {
            None => listener.listen(channel).await?,
            Some(Durably { name, wait, .. }) => match take_name(&mut listener, channel, name, wait).await? {
                Resume::New => {}
                Resume::Resumed => eprintln!("rowbus: {channel}: resuming {name:?} after its last line"),
                Resume::Gap => eprintln!(
                    "rowbus: {channel}: resuming {name:?}, which was away longer than the notify table keeps \
                     rows: notifications it had not received may have been cleaned up"
                ),
            },
        }
    }
    let mut interrupted = std::pin::pin!(interrupted());
    // Install the signal handlers (on first poll) before announcing that we listen.
    if futures::poll!(interrupted.as_mut()).is_ready() {
        return release(&listener, channels, durable).await;
    }
    eprintln!("rowbus: listening on {}", channels.join(", "));
    let mut written = std::collections::BTreeSet::new();
    loop {
        let event = tokio::select! {
            _ = &mut interrupted => return release(&listener, channels, durable).await,
            event = listener.recv() => event?,
        };
        print_event(event, json, &mut written)?;
        if durable.is_none() || written.is_empty() {
            continue;
        }
        // The lines of a burst are written, then acknowledged at once.
        while let std::task::Poll::Ready(event) = futures::poll!(std::pin::pin!(listener.recv())) {
            print_event(event?, json, &mut written)?;
        }
        for channel in std::mem::take(&mut written) {
            listener.ack(&channel).await?;
        }
    }
}

/// Checks `listen --durable NAME`'s name before connecting, saying what is wrong with it
/// in the flag's words (the name itself may be hundreds of characters: not repeated).
fn durable_name(name: &str) -> Result<(), CliError> {
    match rowbus::durable::check_durable_name(name) {
        Err(rowbus::Error::InvalidDurableName { reason, .. }) => {
            Err(CliError::Message(format!("listen --durable NAME: {reason}")))
        }
        other => Ok(other?),
    }
}

/// Takes durable name `name` on `channel`; when another process holds it and `wait`,
/// says so once and waits at most until its lease runs out.
async fn take_name(
    listener: &mut Listener,
    channel: &str,
    name: &str,
    wait: bool,
) -> Result<Resume, CliError> {
    match listener.try_listen_durable(channel, name).await {
        Err(rowbus::Error::DurableNameTaken { since, expires_in, .. }) if wait => {
            eprintln!(
                "rowbus: {channel}: the durable name {name:?} is held by another process (it checked in {} ago); \
                 waiting at most {} for its lease to run out",
                queue_cmd::human(since),
                queue_cmd::human(expires_in)
            );
            Ok(listener.listen_durable(channel, name).await?)
        }
        other => Ok(other?),
    }
}

/// Gives the durable names up, so that a `listen` started next may take them at once.
async fn release(listener: &Listener, channels: &[String], durable: Option<&str>) -> Result<(), CliError> {
    if durable.is_some() {
        for channel in channels {
            listener.unlisten(channel).await?;
        }
    }
    Ok(())
}

/// Writes a notification's line (noting its channel in `written`) or the event's word on
/// stderr.
fn print_event(
    event: Event,
    json: bool,
    written: &mut std::collections::BTreeSet<String>,
) -> Result<(), CliError> {
    match event {
        Event::Notification(n) => {
            if json {
                queue_cmd::outln!(
                    "{}",
                    serde_json::json!({"channel": n.channel, "payload": n.payload, "pid": n.pid})
                )
            } else {
                queue_cmd::outln!("{}: {}", n.channel, queue_cmd::on_one_line(&n.payload))
            }
            written.insert(n.channel);
        }
        // A plain `notify` on a durable channel (PostgreSQL): printed, not resumed after a restart.
        Event::Transient(n) => {
            if json {
                queue_cmd::outln!(
                    "{}",
                    serde_json::json!({"channel": n.channel, "payload": n.payload, "pid": n.pid, "durable": false})
                )
            } else {
                queue_cmd::outln!("{}: {}", n.channel, n.payload.escape_debug())
            }
        }
        Event::Disconnected(error) => {
            eprintln!("rowbus: connection lost ({}); reconnecting", one_line(&error))
        }
        Event::Reconnected { missed } if missed.is_empty() => {
            eprintln!("rowbus: reconnected; resumed every channel where it was")
        }
        Event::Reconnected { missed } => eprintln!(
            "rowbus: reconnected; notifications sent while disconnected on {} may not have been received",
            missed.join(", ")
        ),
        Event::Stopped { channel, error } => {
            eprintln!("rowbus: stopped listening on {channel}");
            return Err(error.into());
        }
        other => eprintln!("rowbus: {other:?}"),
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser as _;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("rowbus").chain(args.iter().copied()))
    }

    /// Every duration flag takes units and plain seconds, through the one parser.
    #[test]
    fn duration_flags_take_units() {
        for args in [
            &["bench", "notify", "--duration", "2s"][..],
            &["bench", "notify", "--duration", "0.5"],
            &["consume", "q", "--lease", "4s", "--retry-delay", "250ms", "--shutdown-timeout", "1m"],
            &["publish", "q", "--delay", "1h", "x"],
            &["publish", "q", "--delay", "2.5", "x"],
        ] {
            parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
        let cli =
            parse(&["--poll-interval", "250ms", "--lookback", "2m", "--retention", "1h", "stats"]).unwrap();
        let config = cli.notify_table.config().unwrap();
        assert_eq!(
            (config.poll_interval, config.lookback, config.retention),
            (Duration::from_millis(250), Duration::from_secs(120), Duration::from_secs(3600))
        );
    }

    /// Every duration flag takes days, as every other unit, through the one parser; each
    /// keeps its own range.
    #[test]
    fn duration_flags_take_days() {
        let day = Duration::from_secs(86_400);
        for args in [
            &["publish", "q", "--delay", "1d", "x"][..],
            &["schedule", "q", "nightly", "--every", "2d"],
            &["deploy", "--queue", "q", "--keep", "7d"],
            &["deploy", "--queue", "q", "--keep", "1.5d"],
            &["consume", "q", "--lease", "1d", "--retry-delay", "0.5d", "--shutdown-timeout", "1d"],
            &["listen", "ch", "--durable", "n", "--lease", "1d"],
            &["dead", "requeue", "q", "--all", "--delay", "1d"],
            &["dead", "purge", "q", "--older-than", "30d"],
            &["bench", "notify", "--duration", "1d"],
        ] {
            parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
        let Command::Deploy { keep, .. } =
            parse(&["deploy", "--queue", "q", "--keep", "1.5d"]).unwrap().command
        else {
            panic!("not deploy")
        };
        assert_eq!(keep, Some(day * 3 / 2));
        let cli =
            parse(&["--poll-interval", "0.001d", "--lookback", "1d", "--retention", "2d", "stats"]).unwrap();
        let config = cli.notify_table.config().unwrap();
        assert_eq!(
            (config.poll_interval, config.lookback, config.retention),
            (Duration::from_millis(86_400), day, day * 2)
        );
        // Each flag's range holds in days too.
        for (args, flag) in [
            (&["publish", "q", "--delay", "36501d", "x"][..], "--delay <DURATION>"),
            (&["deploy", "--queue", "q", "--keep", "36501d"], "--keep <DURATION>"),
            (&["consume", "q", "--lease", "0d"], "--lease <DURATION>"),
            (&["listen", "ch", "--durable", "n", "--lease", "0d"], "--lease <DURATION>"),
        ] {
            let message = parse(args).err().unwrap_or_else(|| panic!("{args:?} accepted")).to_string();
            assert!(message.contains(&format!("for '{flag}'")), "{message}");
        }
    }

    /// A negative number is a value out of its flag's range, said as such, not an
    /// unexpected argument.
    #[test]
    fn negative_numbers_are_out_of_range() {
        for (args, flag) in [
            (&["cancel", "q", "--id", "-1"][..], "--id <ID>"),
            (&["limit", "q", "--rate", "-5/s"], "--rate <N/UNIT>"),
            (&["limit", "q", "--max-running", "-3"], "--max-running <N>"),
            (&["limit", "q", "--per-key", "-1"], "--per-key <N>"),
        ] {
            let error = parse(args).err().unwrap_or_else(|| panic!("{args:?} accepted"));
            assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation, "{args:?}: {error}");
            let message = error.to_string();
            assert!(message.contains(&format!("for '{flag}'")), "{message}");
            assert!(!message.contains("unexpected argument"), "{message}");
        }
    }

    /// `cancel --group G` names the group of `--all`; with `--id`, which names a message
    /// whatever its group, it is refused rather than passed over.
    #[test]
    fn cancel_refuses_a_group_with_ids() {
        let error = parse(&["cancel", "q", "--group", "g", "--id", "5"]).expect_err("accepted");
        assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict, "{error}");
        parse(&["cancel", "q", "--group", "g", "--all"]).unwrap();
        parse(&["cancel", "q", "--id", "5", "--id", "6"]).unwrap();
    }

    /// A duration out of its flag's range is a clap error naming the flag.
    #[test]
    fn duration_flags_refuse_out_of_range_naming_the_flag() {
        for (args, flag) in [
            (&["bench", "notify", "--duration", "0"][..], "--duration <DURATION>"),
            (&["consume", "q", "--lease", "1e12"], "--lease <DURATION>"),
            (&["consume", "q", "--lease", "0s"], "--lease <DURATION>"),
            (&["publish", "q", "--delay", "1000000h", "x"], "--delay <DURATION>"),
        ] {
            let message = parse(args).err().unwrap_or_else(|| panic!("{args:?} accepted")).to_string();
            assert!(message.contains(&format!("for '{flag}'")), "{message}");
        }
    }
}
