//! rowbus's dashboard as a library: an axum [`Router`] that a service mounts under a path
//! of its own, behind its own authentication, showing the queues of a [`Broker`].
//!
//! The router serves one page (HTML, CSS and script in one file, nothing loaded from
//! elsewhere), the figures as JSON (`GET api/queues`, the shape of `rowbus stats --json`
//! with the chart's samples), a page of a queue's messages and its dead letters, and the
//! Prometheus text format (`GET metrics`). Operations that change state (requeue and purge
//! dead letters, pause and resume, cancel messages) are POSTs under `api/ops/`; a
//! [`Dashboard::read_only`] one has none.
//!
//! ```no_run
//! use axum::Router;
//! use rowbus::{Broker, BrokerOptions};
//! use rowbus_ui::Dashboard;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = rowbus::sqlx::SqlitePool::connect("sqlite://app.db").await?;
//! let broker = Broker::new(pool, BrokerOptions::default()).await?;
//! // Operations are on: the service's own authentication layer guards `/rowbus` (no token
//! // needed), and cross-site POSTs are refused.
//! let app: Router = Router::new().nest("/rowbus", Dashboard::new(broker).router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Guarding the operations
//!
//! A page on another site can make an operator's browser send requests to the dashboard.
//! Two guards keep it from triggering an operation:
//!
//! - With a [token](Dashboard::token) (what `rowbus ui` does), every operation must carry it
//!   in the `x-rowbus-token` header; the page learns it from its URL's fragment
//!   (`#token=...`), which no server sees.
//! - Without one (the host service authenticates its users), an operation must be a
//!   same-origin request: one whose `Origin` names another host, or that the browser marks
//!   `Sec-Fetch-Site: cross-site`, is refused. Requests without those headers (curl, a
//!   script) pass: the host's authentication is what admits them.
//!
//! Either way an operation is a POST with a JSON body, which a plain HTML form on another
//! site cannot send.
//!
//! # Sampling
//!
//! The page's chart draws the depth and throughput of the last ten minutes from samples
//! the router takes every two seconds. [`Dashboard::router`] starts that sampler on the
//! current Tokio runtime; it stops when the router (every clone of it) is dropped.

mod dead;
pub mod figures;
mod guard;
pub mod health;
pub mod json;
mod messages;
mod metrics;
mod pause;
mod throughput;
mod token;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use rowbus::stats::{NotifyTableStats, Paused};
use rowbus::{Broker, Db, NotifyConfig, QueueTable};
use serde_json::json;

use figures::Line;
use throughput::Sample;
pub use token::{TOKEN_HEADER, Token};

/// The page: HTML, CSS and script in one file, no external resource.
const PAGE: &str = include_str!("page.html");

/// How often the router samples the queues for the page's chart.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// How far back the chart goes.
pub const WINDOW: Duration = Duration::from_secs(600);

/// The content type of `GET metrics`: the Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = metrics::CONTENT_TYPE;

/// Why a dashboard could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UiError {
    /// A given token is too short or has characters that do not fit a header and a URL.
    #[error(
        "the dashboard's token must be at least {} characters of letters, digits, '-', '_' and '.'",
        token::MIN_GIVEN
    )]
    BadToken,
    /// The operating system's random source failed while making a token.
    #[error("cannot make the dashboard's token: {0}")]
    Random(String),
}

/// How a failure to read the database is said on the page and in the API.
pub type ErrorWords = fn(&rowbus::Error) -> String;

/// The dashboard of a [`Broker`]'s queues, to be turned into a [`Router`].
///
/// By default it shows every queue table of the broker's database (looked up again at
/// each refresh), with operations on and no token: mount it behind the service's own
/// authentication. [`read_only`](Dashboard::read_only) takes the operations away;
/// [`token`](Dashboard::token) requires a token of them.
///
/// A broker whose [`BrokerOptions::listen_notify`](rowbus::BrokerOptions) is on wakes
/// consumers in other processes when the dashboard requeues dead letters or resumes a
/// queue; with it off they find the messages at their next poll.
#[must_use = "a dashboard does nothing until its router is served"]
pub struct Dashboard<DB: Db> {
    broker: Broker<DB>,
    tables: Vec<String>,
    read_only: bool,
    token: Option<Token>,
    config: NotifyConfig,
    words: ErrorWords,
    horizon_warn: Duration,
}

impl<DB: Db> Dashboard<DB> {
    /// A dashboard of every queue table `broker` reaches, operations on, no token.
    pub fn new(broker: Broker<DB>) -> Self {
        Dashboard {
            broker,
            tables: Vec::new(),
            read_only: false,
            token: None,
            config: NotifyConfig::default(),
            words: rowbus::Error::one_line,
            horizon_warn: health::DEFAULT_HORIZON_WARN,
        }
    }

    /// Shows only these queue tables (names as [`Broker::queue`] takes them), in this
    /// order. A name that is not a deployed queue table makes the figures fail with why.
    pub fn tables<I, S>(mut self, tables: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tables = tables.into_iter().map(Into::into).collect();
        self
    }

    /// Serves the figures only: no operation that changes state.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Requires `token` of every operation, in the [`TOKEN_HEADER`] header. The page takes
    /// it from its URL's fragment: open it as `.../#token=TOKEN`.
    pub fn token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// The notify table whose size and lag the figures show (MySQL/MariaDB and SQLite;
    /// default: [`NotifyConfig::default`]), and whose durable listeners they list.
    pub fn notify_config(mut self, config: NotifyConfig) -> Self {
        self.config = config;
        self
    }

    /// How a failure to read the database is put on the page and in the API's `error`
    /// (default: [`rowbus::Error::one_line`]).
    pub fn error_words(mut self, words: ErrorWords) -> Self {
        self.words = words;
        self
    }

    /// How long a transaction may hold the database's horizon before the page marks it
    /// and `/metrics`' `rowbus_horizon_held` says 1 (default:
    /// [`DEFAULT_HORIZON_WARN`](health::DEFAULT_HORIZON_WARN), 5 minutes).
    pub fn horizon_warn(mut self, threshold: Duration) -> Self {
        self.horizon_warn = threshold;
        self
    }

    /// Checks that the tables named with [`tables`](Dashboard::tables) can be read now,
    /// so that a wrong name fails at start rather than as a page of errors later.
    pub async fn check(&self) -> Result<(), rowbus::Error> {
        let tables = figures::queue_tables(&self.broker, &self.tables).await?;
        figures::lines(&self.broker, &tables).await.map(drop)
    }

    /// The router: `GET /` (the page), `GET /api/queues`, `GET /api/queues/{queue}/dead`,
    /// `GET /api/queues/{queue}/messages`, `GET /metrics`, and unless read-only the
    /// operations `POST /api/ops/queues/{queue}/{dead/requeue, dead/purge, pause, resume,
    /// cancel}`. Mount it with [`Router::nest`]; the page's requests are relative to it.
    ///
    /// Starts the chart's sampler on the current Tokio runtime (it panics outside one);
    /// the sampler stops when the router is dropped. Each request runs to its end on a
    /// task of its own, also when its client goes away meanwhile.
    pub fn router(self) -> Router {
        let app = App {
            broker: self.broker,
            config: Arc::new(self.config),
            tables: self.tables.into(),
            history: Arc::default(),
            read_only: self.read_only,
            token_required: self.token.is_some(),
            words: self.words,
            horizon_warn: self.horizon_warn,
        };
        let sampler = Sampler(tokio::spawn(sample(app.clone())).abort_handle());
        // The router's layer holds the sampler's guard: dropping the router stops it.
        routes(app, self.token, self.read_only).layer(axum::Extension(Arc::new(sampler)))
    }
}

/// The sampler's task, aborted when the router that holds this goes.
struct Sampler(tokio::task::AbortHandle);

impl Drop for Sampler {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the router shares between its handlers and its sampler.
struct App<DB: Db> {
    broker: Broker<DB>,
    config: Arc<NotifyConfig>,
    /// The tables named (none: every queue table).
    tables: Arc<[String]>,
    /// The samples of the last [`WINDOW`], by queue table.
    history: Arc<Mutex<BTreeMap<String, VecDeque<Sample>>>>,
    read_only: bool,
    token_required: bool,
    words: ErrorWords,
    /// Past this, a holder of the horizon is marked.
    horizon_warn: Duration,
}

impl<DB: Db> Clone for App<DB> {
    fn clone(&self) -> Self {
        App {
            broker: self.broker.clone(),
            config: self.config.clone(),
            tables: self.tables.clone(),
            history: self.history.clone(),
            read_only: self.read_only,
            token_required: self.token_required,
            words: self.words,
            horizon_warn: self.horizon_warn,
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
    counts: Vec<figures::Counts>,
    /// Each table's health: dead rows, size, what holds the horizon (empty unless asked
    /// for).
    health: Vec<rowbus::stats::QueueHealth>,
}

impl<DB: Db> App<DB> {
    /// `error` in this dashboard's words.
    fn say(&self, error: &rowbus::Error) -> String {
        (self.words)(error).replace('\n', " ")
    }

    /// The figures of the tables shown, what is paused in each and what their consumers
    /// did when `more` (the chart's samples need neither).
    async fn gather(&self, more: bool) -> Result<Figures, rowbus::Error> {
        let tables = figures::queue_tables(&self.broker, &self.tables).await?;
        let lines = figures::lines(&self.broker, &tables).await?;
        let notify = self.broker.notify_table_stats(&self.config).await?;
        let pauses = if more { pause::states(&self.broker, &tables).await? } else { Vec::new() };
        let durable = rowbus::durable::durable_listeners(self.broker.pool(), &self.config).await?;
        let mut counts = Vec::new();
        for table in tables.iter().filter(|_| more) {
            counts.push(figures::counts(&self.broker, table).await?);
        }
        let health = if more { health::healths(&self.broker, &tables).await? } else { Vec::new() };
        Ok(Figures { lines, notify, pauses, durable, counts, health })
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

/// The routes: the page, its JSON, the metrics and, unless read-only, the operations
/// behind their guard.
fn routes<DB: Db>(app: App<DB>, token: Option<Token>, read_only: bool) -> Router {
    let router = Router::new()
        .route("/", get(page))
        .route("/api/queues", get(queues::<DB>))
        .route("/api/queues/{queue}/dead", get(dead::list::<DB>))
        .route("/api/queues/{queue}/messages", get(messages::list::<DB>))
        .route("/metrics", get(metrics_text::<DB>));
    let router = if read_only {
        router
    } else {
        // Any other path under /api/ops/ is an unknown operation, still behind the guard.
        // A route layer, not a layer: a layer would take in the fallback, putting every
        // path outside the routes behind the guard too (405 by GET, 403 by POST) rather
        // than answering 404.
        router.merge(
            Router::new()
                .route("/api/ops/queues/{queue}/dead/requeue", post(dead::requeue::<DB>))
                .route("/api/ops/queues/{queue}/dead/purge", post(dead::purge::<DB>))
                .route("/api/ops/queues/{queue}/pause", post(pause::pause::<DB>))
                .route("/api/ops/queues/{queue}/resume", post(pause::resume::<DB>))
                .route("/api/ops/queues/{queue}/cancel", post(messages::cancel::<DB>))
                .route("/api/ops/{*operation}", any(no_such_operation))
                .route_layer(axum::middleware::from_fn_with_state(token, guard::require)),
        )
    };
    router.with_state(app).layer(axum::middleware::from_fn(to_the_end))
}

/// Runs each request to its end on a task of its own. hyper drops a handler's future
/// when its client goes away, and a handler cut off in the middle of a statement cost a
/// MariaDB pool that connection for good (sqlx's MySQL driver does not recover it).
async fn to_the_end(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    match tokio::spawn(next.run(request)).await {
        Ok(response) => response,
        Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// Samples the queues every [`SAMPLE_EVERY`] for the chart, until the router is dropped;
/// a failed sample is skipped (the page's own request reports the error).
async fn sample<DB: Db>(app: App<DB>) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
fn unavailable(line: String, json: bool) -> Response {
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
        Err(e) => return unavailable(app.say(&e), true),
    };
    let mut body = figures::to_json(&figures.lines, figures.notify.as_ref());
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
    body["counts"] = figures::counts_json(&figures.counts);
    body["durable_listeners"] = figures::durable_json(&figures.durable);
    body["health"] = health::health_json(&figures.health, app.horizon_warn);
    body["horizon_warn_s"] = app.horizon_warn.as_secs_f64().into();
    body["sample_every_s"] = SAMPLE_EVERY.as_secs_f64().into();
    body["window_s"] = WINDOW.as_secs_f64().into();
    body["now_ms"] = now_ms().into();
    body["read_only"] = app.read_only.into();
    body["token_required"] = app.token_required.into();
    body["counters"] = json!({
        "published": counters.published,
        "acknowledged": counters.acked,
        "retried": counters.retried,
        "dead_lettered": counters.dead_lettered,
        "dead_letter_failures": counters.dead_letter_failures,
        "claims": counters.claims,
        "handed_off": counters.handed_off,
        "claim_failures": counters.claim_errors,
        "snoozed": counters.snoozed,
    });
    (StatusCode::OK, [(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response()
}

/// `GET /metrics`: the Prometheus text format.
async fn metrics_text<DB: Db>(State(app): State<App<DB>>) -> Response {
    match app.gather(true).await {
        Ok(f) => {
            let mut text =
                metrics::render(&f.lines, f.notify.as_ref(), &f.pauses, &f.counts, &app.broker.stats());
            text.push_str(&metrics::render_health(&f.health, app.horizon_warn));
            ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response()
        }
        Err(e) => unavailable(app.say(&e), false),
    }
}

/// An operation this dashboard does not have.
async fn no_such_operation() -> Response {
    (StatusCode::NOT_FOUND, "no such operation\n").into_response()
}

/// The Rust blocks of docs/dashboard.md, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/dashboard.md")]
struct DashboardPage;

/// The page's rendering, read from its script (no browser here): what each cell and chart
/// is made of.
#[cfg(test)]
mod page_tests {
    use super::PAGE;

    /// The body of the script's function `name`, up to the next function.
    fn function(name: &str) -> &'static str {
        let start = PAGE.find(&format!("function {name}(")).unwrap_or_else(|| panic!("no function {name}"));
        let rest = &PAGE[start..];
        let end = rest[1..].find("\nfunction ").map_or(rest.len(), |e| e + 1);
        &rest[..end]
    }

    #[test]
    fn payloads_wrap_between_words_or_parts() {
        // `break-all` broke a payload anywhere, mid-word.
        assert!(!PAGE.contains("break-all"), "a payload's CSS breaks words anywhere");
        for row in ["renderDead", "messageRow"] {
            assert!(function(row).contains("...breakable(payload)"), "{row} renders its payload unbroken");
        }
        assert!(function("breakable").contains("wbr"), "breakable marks where a line may break");
    }

    #[test]
    fn no_error_is_a_muted_dash() {
        for row in ["renderDead", "messageRow"] {
            let body = function(row);
            assert!(body.contains("errorCell("), "{row} makes its error cell itself");
            assert!(!body.contains(r#"last_error === null ? "-""#), "{row} writes its dash as an error");
        }
        let cell = function("errorCell");
        assert!(
            cell.contains(r#"{ class: "none""#) && PAGE.contains("td.error .none { color: var(--muted); }")
        );
    }

    #[test]
    fn charts_have_a_time_axis() {
        let chart = function("chart");
        assert!(
            chart.contains("timeTicks(from, now)") && chart.contains(r#"class: "tick""#),
            "a chart without time axis"
        );
        assert!(function("timeTicks").contains("toLocaleTimeString"), "ticks labelled with the time");
    }

    #[test]
    fn a_queue_is_named_once() {
        let row = function("groupRow");
        assert!(row.contains(r#"el("td", { class: "queue" })"#), "each group's row names its queue again");
        assert!(!row.contains(r#"{ class: "queue" }, q.table"#));
    }
}
