//! `rowbus ui`: the dashboard of the `rowbus-ui` crate (one page, its figures as JSON at
//! `GET /api/queues` and as Prometheus metrics at `GET /metrics`), served on its own.
//!
//! Served alone, every request must name a host the dashboard serves ([`host::require`]),
//! and operations need the token printed at start (none with --read-only).

mod host;

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use rowbus::sqlx::Pool;
use rowbus::{Db, NotifyConfig};
use rowbus_ui::{Dashboard, Token, UiError};

use crate::cli_error::CliError;
use crate::queue_cmd::{existing_queue, parse_tables};

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
    /// Mark a queue whose database's horizon a transaction (a snapshot, a replication
    /// slot) holds for longer than this, e.g. 30s, 5m, 1h
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = crate::queue_cmd::duration)]
    horizon_warn: std::time::Duration,
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
        (Some(given), false) => Some(Token::given(given).map_err(token_error)?),
        (None, false) => Some(Token::generate().map_err(token_error)?),
    };
    // Only a dashboard with operations requeues, pauses and resumes, and wakes other
    // processes' consumers when it does.
    let broker = crate::dead_cmd::waking_broker(pool, url, config, !args.read_only).await?;
    // A table named on the command line that does not exist is an error now, not a
    // page of errors later.
    for name in &args.tables {
        existing_queue(&broker, name, url).await?;
    }
    let mut dashboard = Dashboard::new(broker.clone())
        .tables(args.tables)
        .read_only(args.read_only)
        .notify_config(config.clone())
        .horizon_warn(args.horizon_warn)
        .error_words(crate::one_line);
    if let Some(token) = &token {
        dashboard = dashboard.token(token.clone());
    }
    dashboard.check().await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Message(format!("cannot listen on {}: {e}", args.listen)))?;
    let address = listener
        .local_addr()
        .map_err(|e| CliError::Message(format!("cannot tell the address listened on: {e}")))?;
    // A layer, not a route layer: unknown paths are refused to other hosts too.
    let hosts = host::Hosts::new(address, allowed);
    let router = dashboard.router().layer(axum::middleware::from_fn_with_state(hosts, host::require));
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
    broker.shutdown(Duration::ZERO).await;
    served.map_err(|e| CliError::Message(format!("the dashboard's server failed: {e}")))
}

/// A token refused or not made, in the command's words.
fn token_error(error: UiError) -> CliError {
    match error {
        UiError::BadToken => CliError::Message(format!(
            "the dashboard's token (--token or ROWBUS_UI_TOKEN) {}; leave it out to have one made",
            error.to_string().trim_start_matches("the dashboard's token ")
        )),
        other => CliError::Message(other.to_string()),
    }
}
