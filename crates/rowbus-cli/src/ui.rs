//! `rowbus ui`: a dashboard of the queues (one page, served from the binary), their
//! figures as JSON (`GET /api/queues`) and as Prometheus metrics (`GET /metrics`).
//!
//! Every request must name a host the dashboard serves ([`host::require`]). Operations
//! that change state live under `/api/ops/`, behind [`token::require`]: a POST carrying
//! the token printed at start. With --read-only there are none. The dead letters of a
//! queue, and their operations, are in [`dead`]; pauses and theirs in [`pause`]; a page of
//! a queue's messages in [`messages`].

mod dead;
mod host;
mod messages;
mod metrics;
mod pause;
mod throughput;
mod token;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use clap::Args;
use rowbus::sqlx::Pool;
use rowbus::stats::{NotifyTableStats, Paused};
use rowbus::{Broker, Db, NotifyConfig, QueueTable};
use serde_json::json;

use crate::cli_error::CliError;
use crate::queue_cmd::parse_tables;
use crate::stats::{self, Line};
use token::Token;

/// The page: HTML, CSS and script in one file, no external resource.
const PAGE: &str = include_str!("ui/page.html");

/// How often the server samples the queues for the page's chart.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// How far back the chart goes.
const WINDOW: Duration = Duration::from_secs(600);

/// Options of `rowbus ui`.
#[derive(Debug, Args)]
pub(crate) struct UiArgs {
    /// Queue tables to show [default: every table with the queue columns in the current
    /// schema(s) or database, looked up again at each refresh]
    tables: Vec<String>,
    /// Address to serve on, IP:PORT (port 0 picks a free one); keep it on loopback unless
    /// the network in between is trusted: the page shows queue names and figures to whoever
    /// reaches it
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:7474")]
    listen: SocketAddr,
    /// Serve the figures only: no operation that changes state, no token
    #[arg(long)]
    read_only: bool,
    /// The token operations must carry (at least 16 of letters, digits, '-', '_', '.')
    /// [default: a random one, printed at start]
    #[arg(long, env = "ROWBUS_UI_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    token: Option<String>,
    /// A host name or address the dashboard also answers for, with a port when not the
    /// listening one (a proxy's): requests must name localhost, 127.0.0.1, \[::1\], the
    /// address listened on or reached, or one of these (repeatable)
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    allow_host: Vec<String>,
}

use throughput::Sample;

/// What the server shares between its handlers and its sampler.
struct App<DB: Db> {
    broker: Broker<DB>,
    url: Arc<str>,
    config: Arc<NotifyConfig>,
    /// The tables named on the command line (none: every queue table).
    tables: Arc<[String]>,
    /// The samples of the last [`WINDOW`], by queue table.
    history: Arc<Mutex<BTreeMap<String, VecDeque<Sample>>>>,
    read_only: bool,
}

impl<DB: Db> Clone for App<DB> {
    fn clone(&self) -> Self {
        App {
            broker: self.broker.clone(),
            url: self.url.clone(),
            config: self.config.clone(),
            tables: self.tables.clone(),
            history: self.history.clone(),
            read_only: self.read_only,
        }
    }
}

/// The figures of the tables shown, as they stand.
struct Figures {
    /// Every group of every table.
    lines: Vec<Line>,
    /// The notify table's figures (`None` on PostgreSQL or when it does not exist).
    notify: Option<NotifyTableStats>,
    /// What is paused in each table, in their order (empty unless asked for).
    pauses: Vec<(QueueTable, Paused)>,
    /// The durable listeners' positions and lag.
    durable: Vec<rowbus::durable::DurableListener>,
    /// What each table's consumers did, from its counts table (empty unless asked for).
    counts: Vec<stats::Counts>,
}

impl<DB: Db> App<DB> {
    /// The figures of the tables shown, what is paused in each and what their consumers
    /// did when `more` (the chart's samples need neither).
    async fn gather(&self, more: bool) -> Result<Figures, CliError> {
        let tables = stats::queue_tables(&self.broker, &self.url, &self.tables, false).await?;
        let lines = stats::lines(&self.broker, &tables).await?;
        let notify = self.broker.notify_table_stats(&self.config).await?;
        let pauses = if more { pause::states(&self.broker, &tables).await? } else { Vec::new() };
        let durable = rowbus::durable::durable_listeners(self.broker.pool(), &self.config).await?;
        let mut counts = Vec::new();
        for table in tables.iter().filter(|_| more) {
            counts.push(stats::counts(&self.broker, table).await?);
        }
        Ok(Figures { lines, notify, pauses, durable, counts })
    }

    /// Adds a sample of `lines` and the tables' `published` totals taken at `now`, and
    /// forgets those older than [`WINDOW`].
    fn record(&self, lines: &[Line], published: &BTreeMap<String, u64>, now: u64) {
        let mut per_table: BTreeMap<&str, (i64, Option<i64>)> = BTreeMap::new();
        for Line { table, group } in lines {
            let (depth, dead) = per_table.entry(table.channel()).or_default();
            *depth += group.depth;
            *dead = match (*dead, group.dead) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            };
        }
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        for (table, (depth, dead)) in per_table {
            let sample = (now, depth, dead, published.get(table).copied());
            history.entry(table.to_owned()).or_default().push_back(sample);
        }
        let oldest = now.saturating_sub(WINDOW.as_millis() as u64);
        history.retain(|_, samples| {
            while samples.front().is_some_and(|s| s.0 < oldest) {
                samples.pop_front();
            }
            !samples.is_empty()
        });
    }
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Serves the dashboard until interrupted.
pub(crate) async fn ui<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    args: UiArgs,
) -> Result<(), CliError> {
    parse_tables(&args.tables)?;
    let allowed = args.allow_host.iter().map(|h| host::Allowed::given(h)).collect::<Result<Vec<_>, _>>()?;
    let token = match (&args.token, args.read_only) {
        (_, true) => None,
        (Some(given), false) => Some(Token::given(given)?),
        (None, false) => Some(Token::generate()?),
    };
    let app = App {
        // Only a dashboard with operations requeues, pauses and resumes, and wakes other
        // processes' consumers when it does.
        broker: crate::dead_cmd::waking_broker(pool, url, config, !args.read_only).await?,
        url: url.into(),
        config: Arc::new(config.clone()),
        tables: args.tables.into(),
        history: Arc::default(),
        read_only: args.read_only,
    };
    // A table named on the command line that does not exist is an error now, not a
    // page of errors later.
    let figures = app.gather(false).await?;
    app.record(&figures.lines, &app.published_totals(&figures.lines).await, now_ms());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Message(format!("cannot listen on {}: {e}", args.listen)))?;
    let address = listener
        .local_addr()
        .map_err(|e| CliError::Message(format!("cannot tell the address listened on: {e}")))?;
    let sampler = tokio::spawn(sample(app.clone()));
    let broker = app.broker.clone();
    let router = routes(app, token.clone(), host::Hosts::new(address, allowed));
    if !address.ip().is_loopback() {
        eprintln!(
            "rowbus: warning: serving on {address}, beyond this machine: anyone who reaches it sees the queues (by its address; a name needs --allow-host)"
        );
    }
    match &token {
        Some(token) => eprintln!(
            "rowbus: dashboard on http://{address}/#token={} (metrics at /metrics; operations need this token)",
            token.as_str()
        ),
        None => eprintln!("rowbus: dashboard on http://{address}/ (read-only; metrics at /metrics)"),
    }
    let served = axum::serve(listener, router.into_make_service_with_connect_info::<host::Reached>())
        .with_graceful_shutdown(crate::interrupted())
        .await;
    sampler.abort();
    broker.shutdown(Duration::ZERO).await;
    served.map_err(|e| CliError::Message(format!("the dashboard's server failed: {e}")))
}

/// The routes: the page, its JSON, the metrics and, unless read-only, the operations
/// behind the token; all of them, and the answer to a path that is none, for `hosts` only.
fn routes<DB: Db>(app: App<DB>, token: Option<Token>, hosts: host::Hosts) -> Router {
    let router = Router::new()
        .route("/", get(page))
        .route("/api/queues", get(queues::<DB>))
        .route("/api/queues/{queue}/dead", get(dead::list::<DB>))
        .route("/api/queues/{queue}/messages", get(messages::list::<DB>))
        .route("/metrics", get(metrics_text::<DB>));
    let router = match token {
        Some(token) => router.merge(
            // Any other path under /api/ops/ is an unknown operation, still behind the
            // token check. A route layer, not a layer: a layer would take in the fallback,
            // putting every path outside the routes behind the token too (405 by GET, 403
            // by POST) rather than answering 404.
            Router::new()
                .route("/api/ops/queues/{queue}/dead/requeue", post(dead::requeue::<DB>))
                .route("/api/ops/queues/{queue}/dead/purge", post(dead::purge::<DB>))
                .route("/api/ops/queues/{queue}/pause", post(pause::pause::<DB>))
                .route("/api/ops/queues/{queue}/resume", post(pause::resume::<DB>))
                .route("/api/ops/queues/{queue}/cancel", post(messages::cancel::<DB>))
                .route("/api/ops/{*operation}", any(no_such_operation))
                .route_layer(axum::middleware::from_fn_with_state(token, token::require)),
        ),
        None => router,
    };
    // A layer, not a route layer: unknown paths are refused to other hosts too.
    router.with_state(app).layer(axum::middleware::from_fn_with_state(hosts, host::require))
}

/// Samples the queues every [`SAMPLE_EVERY`] for the chart; a failed sample is skipped
/// (the page's own request reports the error).
async fn sample<DB: Db>(app: App<DB>) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the start took a sample.
    every.tick().await;
    loop {
        every.tick().await;
        if let Ok(figures) = app.gather(false).await {
            let published = app.published_totals(&figures.lines).await;
            app.record(&figures.lines, &published, now_ms());
        }
    }
}

/// `GET /`: the page. It may not be framed (clicks on a page elsewhere must not land on
/// its buttons) and loads nothing from elsewhere.
async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
            ),
        ],
        PAGE,
    )
        .into_response()
}

/// A failure to read the database, as a 503 whose body says why.
fn unavailable(error: &CliError, json: bool) -> Response {
    let line = error.line();
    if json {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({ "error": line }))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{line}\n")).into_response()
    }
}

/// `GET /api/queues`: the figures as `rowbus stats --json` has them (each queue's counts
/// included), with the samples for the chart, what is paused in each queue, this
/// process's counters and whether operations are on.
async fn queues<DB: Db>(State(app): State<App<DB>>) -> Response {
    let figures = match app.gather(true).await {
        Ok(figures) => figures,
        Err(e) => return unavailable(&e, true),
    };
    let mut body = stats::to_json(&figures.lines, figures.notify.as_ref());
    let (history, throughput): (serde_json::Map<_, _>, serde_json::Map<_, _>) = {
        let history = app.history.lock().unwrap_or_else(|e| e.into_inner());
        history
            .iter()
            .map(|(table, samples)| {
                let samples: Vec<Sample> = samples.iter().copied().collect();
                let rates = throughput::rates(&samples, throughput::RATE_STEP);
                let rates: Vec<serde_json::Value> = rates.iter().map(throughput::Rates::to_json).collect();
                ((table.clone(), json!(samples)), (table.clone(), json!(rates)))
            })
            .unzip()
    };
    let counters = app.broker.stats();
    body["history"] = history.into();
    body["throughput"] = throughput.into();
    body["rate_step_s"] = throughput::RATE_STEP.as_secs_f64().into();
    body["pauses"] = pause::to_json(&figures.pauses);
    body["counts"] = stats::counts_json(&figures.counts);
    body["durable_listeners"] = stats::durable_json(&figures.durable);
    body["sample_every_s"] = SAMPLE_EVERY.as_secs_f64().into();
    body["window_s"] = WINDOW.as_secs_f64().into();
    body["now_ms"] = now_ms().into();
    body["read_only"] = app.read_only.into();
    body["counters"] = json!({
        "published": counters.published,
        "acknowledged": counters.acked,
        "retried": counters.retried,
        "dead_lettered": counters.dead_lettered,
        "dead_letter_failures": counters.dead_letter_failures,
        "claims": counters.claims,
        "claim_failures": counters.claim_errors,
        "snoozed": counters.snoozed,
    });
    (StatusCode::OK, [(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response()
}

/// `GET /metrics`: the Prometheus text format.
async fn metrics_text<DB: Db>(State(app): State<App<DB>>) -> Response {
    match app.gather(true).await {
        Ok(f) => (
            [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
            metrics::render(&f.lines, f.notify.as_ref(), &f.pauses, &f.counts, &app.broker.stats()),
        )
            .into_response(),
        Err(e) => unavailable(&e, false),
    }
}

/// An operation this server does not have.
async fn no_such_operation() -> Response {
    (StatusCode::NOT_FOUND, "no such operation\n").into_response()
}
