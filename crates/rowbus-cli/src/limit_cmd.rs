//! `rowbus limit`: concurrency and rate limits on a queue or one of its groups, obeyed by
//! every consumer in every process from its next claim on.
//!
//! - `rowbus limit QUEUE [--group G] --max-running N`: at most N messages in flight at once;
//! - `rowbus limit QUEUE [--group G] --per-key N`: at most N of one ordering key at once;
//! - `rowbus limit QUEUE [--group G] --rate N/s|N/m|N/h [--burst B]`: at most N started
//!   per period, at most B of them at once (B = 1 spreads them evenly; by default N);
//! - `rowbus limit QUEUE [--group G] --clear`: removes the scope's limits;
//! - `rowbus limit QUEUE --list`, or `rowbus limit --list` for every queue found: the
//!   limits and how each scope stands (running, started, ready, held back).

use std::time::Duration;

use clap::Args;
use rowbus::limit::{Limit, LimitScope, LimitStatus, Rate};
use rowbus::sqlx::Pool;
use rowbus::{Broker, Db, NotifyConfig, Queue};

use crate::cli_error::CliError;
use crate::queue_cmd::{self, outln};

/// Options of `rowbus limit`.
#[derive(Debug, Args)]
pub(crate) struct LimitArgs {
    /// The queue table (with --list alone: every queue table found)
    #[arg(required_unless_present = "list")]
    pub(crate) table: Option<String>,
    /// Only this group (`""` is the default group) [default: the whole queue]
    #[arg(long, conflicts_with = "list")]
    group: Option<String>,
    /// At most N messages in flight at once, across every consumer and process
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    max_running: Option<u64>,
    /// At most N messages of one ordering key in flight at once (without it: one)
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    per_key: Option<u64>,
    /// At most N messages started per second, minute or hour: N/s, N/m, N/h
    #[arg(long, value_name = "N/UNIT", value_parser = rate, allow_hyphen_values = true)]
    rate: Option<Rate>,
    /// With --rate: at most N of them started at once, the rest spread over the period
    /// (1: evenly, one every period/count) [default: the rate's count]
    #[arg(long, value_name = "N", value_parser = count, requires = "rate")]
    burst: Option<u64>,
    /// Remove the limits of the queue (or of the group)
    #[arg(long, conflicts_with_all = ["max_running", "per_key", "rate", "burst", "list"])]
    clear: bool,
    /// Show the limits and how each limited scope stands
    #[arg(long, conflicts_with_all = ["max_running", "per_key", "rate", "burst"])]
    list: bool,
}

impl LimitArgs {
    /// Refuses a command that says nothing to do, in one line.
    pub(crate) fn check(&self) -> Result<(), CliError> {
        let sets = self.max_running.is_some() || self.per_key.is_some() || self.rate.is_some();
        if !sets && !self.clear && !self.list {
            return Err(CliError::Message(
                "say what to do: --max-running N, --per-key N, --rate N/s, --clear or --list".into(),
            ));
        }
        Ok(())
    }
}

/// A whole number from 1 on, as a limit's count.
fn count(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if (1..=i64::MAX.unsigned_abs()).contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number from 1 to {}, not {text:?}", i64::MAX)),
    }
}

/// A rate, `N/s`, `N/m` or `N/h`.
fn rate(text: &str) -> Result<Rate, String> {
    text.parse::<Rate>().map_err(|e| e.to_string())
}

/// Sets, clears or lists, and says what it did, a line each.
pub(crate) async fn limit<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    args: LimitArgs,
) -> Result<(), CliError> {
    // Wakes consumers elsewhere where it can, as `pause` does; a list changes nothing.
    let broker = crate::dead_cmd::waking_broker(pool, url, config, !args.list).await?;
    let result = run(&broker, url, &args).await;
    broker.shutdown(Duration::ZERO).await;
    result
}

async fn run<DB: Db>(broker: &Broker<DB>, url: &str, args: &LimitArgs) -> Result<(), CliError> {
    if args.list {
        let names: Vec<String> = args.table.iter().cloned().collect();
        let tables = crate::stats::queue_tables(broker, url, &names, false).await?;
        let mut any = false;
        for table in &tables {
            let queue = broker.queue(table.channel())?;
            let limits = match queue.limits().await {
                Ok(limits) => limits,
                // A queue of an older rowbus has no limits (listing them all skips it).
                Err(rowbus::Error::MissingLimitsTable { .. }) if args.table.is_none() => continue,
                Err(e) => return Err(e.into()),
            };
            for status in &limits {
                outln!("{}", line(&queue, status));
                any = true;
            }
        }
        if !any {
            match &args.table {
                Some(table) => outln!("queue `{table}` has no limits"),
                None => outln!("no queue has limits"),
            }
        }
        return Ok(());
    }
    let table = args.table.as_deref().expect("clap requires it without --list");
    let queue = queue_cmd::existing_queue(broker, table, url).await?;
    let scope = LimitScope::of(args.group.as_deref());
    let what = what(&queue, &scope);
    if args.clear {
        let line = match queue.clear_limit(&scope).await? {
            true => format!("cleared the limits of {what}"),
            false => format!("{what} had no limits"),
        };
        outln!("{line}");
        return Ok(());
    }
    let mut set = Vec::new();
    if let Some(n) = args.max_running {
        queue.set_limit(&scope, Limit::MaxRunning(n)).await?;
        set.push(format!("at most {n} in flight"));
    }
    if let Some(n) = args.per_key {
        queue.set_limit(&scope, Limit::PerKey(n)).await?;
        set.push(format!("at most {n} of a key in flight"));
    }
    if let Some(rate) = args.rate {
        match args.burst {
            Some(burst) => {
                queue.set_limit(&scope, Limit::Rate(rate.with_burst(burst))).await?;
                set.push(format!("at most {rate} started, {burst} at once"));
            }
            None => {
                queue.set_limit(&scope, Limit::Rate(rate)).await?;
                set.push(format!("at most {rate} started"));
            }
        }
    }
    outln!("limited {what}: {}", set.join(", "));
    Ok(())
}

/// `group "g" of queue `q`` or `queue `q``.
fn what<DB: Db>(queue: &Queue<DB>, scope: &LimitScope) -> String {
    match scope {
        LimitScope::Queue => format!("queue `{}`", queue.table()),
        LimitScope::Group(group) => format!("group {group:?} of queue `{}`", queue.table()),
    }
}

/// One scope's limits and figures on a line.
fn line<DB: Db>(queue: &Queue<DB>, status: &LimitStatus) -> String {
    let mut limits = Vec::new();
    if let Some(n) = status.max_running {
        limits.push(format!("max running {n}"));
    }
    if let Some(n) = status.per_key {
        limits.push(format!("per key {n}"));
    }
    if let Some(rate) = status.rate {
        limits.push(format!("rate {rate}"));
    }
    let mut figures = Vec::new();
    if status.max_running.is_some() {
        figures.push(format!("running {}", status.running));
    }
    if status.rate.is_some() {
        figures.push(format!("started {} in the period", status.started));
    }
    figures.push(format!("ready {}", status.ready));
    figures.push(format!("limited {}", status.held));
    format!("{}: {}; {}", what(queue, &status.scope), limits.join(", "), figures.join(", "))
}
