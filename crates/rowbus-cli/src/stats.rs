//! `rowbus stats [TABLE...]`: each queue table's groups as they stand (PAUSED where
//! `rowbus pause` holds them), what its consumers did (its counts table), its health (dead
//! rows, size on disk, what holds the database's horizon, with a warning past
//! `--horizon-warn`), and the notify table's size and lag.

use std::time::Duration;

use clap::Args;
use rowbus::durable::DurableListener;
use rowbus::sqlx::Pool;
use rowbus::stats::{Counted, Holder, HolderKind, NotifyTableStats, QueueHealth, Reading};
use rowbus::{Broker, BrokerOptions, Db, NotifyConfig, QueueTable, redact};
use rowbus_ui::figures::{
    self, Counts, Line, NOT_READABLE, counted_words, counts_json, durable_json, to_json,
};
use rowbus_ui::health;
use serde_json::json;

use crate::cli_error::CliError;
use crate::queue_cmd::{self, human, outln, parse_tables, thousands};

/// Options of `rowbus stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// Queue tables [default: every table with the queue columns in the current schema(s)
    /// or database]
    pub(crate) tables: Vec<String>,
    /// Print one JSON object {"queues": [...], "counts": {TABLE: {"cancelled", "snoozed",
    /// "timed_out", "lease_lost", "workflows": {STATUS: N} with workflow tables} or null
    /// without a counts table}, "notify_table": {...} or
    /// null, "durable_listeners": [...]}; a part this role may not read has an "error"
    /// instead of figures (durable listeners: null, and "durable_listeners_error"),
    /// "health": {TABLE: {"dead_rows", "bytes", "holder", "wal", "held_past_warn"}} and
    /// "horizon_warn_s"
    #[arg(long)]
    json: bool,
    /// Warn of a transaction (a snapshot, a replication slot) holding the database's
    /// horizon for longer than this, e.g. 30s, 5m, 1h: the rows the queues delete
    /// meanwhile are not cleaned up
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = crate::queue_cmd::duration)]
    horizon_warn: Duration,
}

/// Prints the figures.
pub(crate) async fn stats<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    args: StatsArgs,
) -> Result<(), CliError> {
    parse_tables(&args.tables)?;
    let broker = Broker::new(pool, BrokerOptions::default()).await?;
    let tables = queue_tables(&broker, url, &args.tables, true).await?;
    // Each part this role may not read is said once; the others are shown.
    let mut lines = Vec::new();
    let mut unreadable = Vec::new();
    let mut counted = Vec::new();
    let mut healths = Vec::new();
    for table in &tables {
        match figures::lines(&broker, std::slice::from_ref(table)).await {
            // Found in the catalog, dropped (`rowbus undeploy`) before it was read.
            Err(rowbus::Error::MissingQueueTable { .. }) if args.tables.is_empty() => {}
            read => match readable(read.map_err(CliError::from))? {
                Ok(found) => {
                    lines.extend(found);
                    counted.push(figures::counts(&broker, table).await?);
                    healths.extend(health::healths(&broker, std::slice::from_ref(table)).await?);
                }
                Err(()) => unreadable.push(table),
            },
        }
    }
    let notify = readable(broker.notify_table_stats(config).await.map_err(CliError::from))?;
    let durable =
        readable(rowbus::durable::durable_listeners(broker.pool(), config).await.map_err(CliError::from))?;
    if args.json {
        let mut report = to_json(&lines, notify.as_ref().ok().and_then(Option::as_ref));
        report["counts"] = counts_json(&counted);
        report["health"] = health::health_json(&healths, args.horizon_warn);
        report["horizon_warn_s"] = json!(args.horizon_warn.as_secs_f64());
        for table in &unreadable {
            let entry = json!({"table": table.channel(), "error": NOT_READABLE});
            report["queues"].as_array_mut().expect("an array").push(entry);
        }
        if notify.is_err() {
            report["notify_table"] = json!({"table": config.table, "error": NOT_READABLE});
        }
        match &durable {
            Ok(durable) => report["durable_listeners"] = durable_json(durable),
            Err(_) => {
                report["durable_listeners"] = serde_json::Value::Null;
                report["durable_listeners_error"] = json!(NOT_READABLE);
            }
        }
        outln!("{report}");
    } else {
        let shown = notify.as_ref().ok().and_then(Option::as_ref);
        let health = (healths.as_slice(), args.horizon_warn);
        print_table(&lines, &counted, health, shown, url, config, !unreadable.is_empty())?;
        for table in &unreadable {
            outln!("queue table `{table}`: {NOT_READABLE}");
        }
        if notify.is_err() {
            outln!("notify table `{}`: {NOT_READABLE}", config.table);
        }
        match &durable {
            Ok(durable) => print_durable(durable)?,
            Err(_) => outln!("durable listeners: {NOT_READABLE}"),
        }
    }
    if !unreadable.is_empty() {
        return Err(CliError::Message(format!(
            "{} of {} queue tables not readable by this role (permission denied); what it may read is shown",
            unreadable.len(),
            tables.len()
        )));
    }
    Ok(())
}

/// A queue's health on one line: its dead rows, size on disk, SQLite's WAL and what holds
/// the horizon; a figure this role may not read says what is missing.
fn health_line(h: &QueueHealth) -> String {
    let mut parts = Vec::new();
    match &h.dead_rows {
        Ok(Some(d)) if d.server_wide => {
            parts.push(format!("{} dead rows (the server's history list)", thousands(d.rows)))
        }
        Ok(Some(d)) => parts.push(format!("{} dead rows", thousands(d.rows))),
        Ok(None) => {}
        Err(e) => parts.push(format!("dead rows {e}")),
    }
    match &h.bytes {
        Ok(Some(b)) => parts.push(format!("{} on disk", bytes(*b))),
        Ok(None) => {}
        Err(e) => parts.push(format!("size {e}")),
    }
    if let Some(w) = &h.wal {
        parts.push(format!(
            "WAL {}, {} of {} frames not checkpointed",
            bytes(w.bytes),
            w.frames_left,
            w.frames
        ));
    }
    parts.push(match &h.holder {
        Ok(None) => "horizon: nothing holds it".to_owned(),
        Err(e) => format!("horizon {e}"),
        Ok(Some(holder)) => {
            let age = age_words(&holder.age);
            let xids =
                holder.xid_age.map_or_else(String::new, |x| format!(", {} transactions old", thousands(x)));
            format!("horizon held by {}{age}{xids}", holder_words(holder))
        }
    });
    format!("health of `{}`: {}", h.table, parts.join(", "))
}

/// Who holds the horizon: `session pid 4711 of role app, application "report"`,
/// `transaction thread 12 of root@10.0.0.5`, `replication slot "standby" (pid 99)`.
fn holder_words(holder: &Holder) -> String {
    let mut words = holder.kind.as_str().to_owned();
    match holder.kind {
        HolderKind::ReplicationSlot | HolderKind::ReplicationSlotCatalog => {
            if let Some(name) = &holder.name {
                words.push_str(&format!(" {name:?}"));
            }
            if let Some(pid) = holder.pid {
                words.push_str(&format!(" (pid {pid})"));
            }
        }
        kind => {
            let (id, of) = if kind == HolderKind::Transaction { ("thread", "") } else { ("pid", "role ") };
            if let Some(pid) = holder.pid {
                words.push_str(&format!(" {id} {pid}"));
            }
            if let Some(name) = &holder.name {
                words.push_str(&format!(" of {of}{name}"));
            }
        }
    }
    if let Some(app) = &holder.application {
        words.push_str(&format!(", application {app:?}"));
    }
    words
}

/// How long a holder's transaction has been open, in words (`, open 4m 05s`).
fn age_words(age: &Reading<Duration>) -> String {
    match age {
        Ok(Some(age)) => format!(", open {}", human(*age)),
        Ok(None) => String::new(),
        Err(e) => format!(", its age {e}"),
    }
}

/// The warning of a horizon held past `threshold`, if it is.
fn warning(h: &QueueHealth, threshold: Duration) -> Option<String> {
    if !h.held_past(threshold) {
        return None;
    }
    Some(match &h.wal {
        Some(_) => format!(
            "WARNING: a reader's transaction keeps `{}`'s WAL from being checkpointed: it grows with every write until that transaction ends",
            h.table
        ),
        None => format!(
            "WARNING: the horizon of `{}` is held past {}: rows deleted meanwhile are not cleaned up until that transaction ends",
            h.table,
            human(threshold)
        ),
    })
}

/// A size in bytes with its unit: `1.5 MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut size = n as f64 / 1024.0;
    let mut unit = 0;
    while size >= 1024.0 && unit < UNITS.len() - 1 {
        size /= 1024.0;
        unit += 1;
    }
    format!("{size:.1} {}", UNITS[unit])
}

/// A part of the report: `Err(())` where the database refused this role the privilege
/// to read it; any other failure stays one.
fn readable<T>(part: Result<T, CliError>) -> Result<Result<T, ()>, CliError> {
    match part {
        Ok(found) => Ok(Ok(found)),
        Err(CliError::Rowbus(e)) if e.is_permission_denied() => Ok(Err(())),
        Err(e) => Err(e),
    }
}

/// The queue tables `names` (each checked to exist), or when none are named every table
/// with the queue columns; a catalog name rowbus does not accept is skipped, with a word
/// on stderr when `warn`.
pub(crate) async fn queue_tables<DB: Db>(
    broker: &Broker<DB>,
    url: &str,
    names: &[String],
    warn: bool,
) -> Result<Vec<QueueTable>, CliError> {
    let mut tables = Vec::new();
    if names.is_empty() {
        for name in broker.queue_tables().await? {
            // Names come from the catalog: only those rowbus accepts are queried.
            match broker.queue(&name) {
                Ok(queue) => tables.push(queue.table().clone()),
                Err(e) if warn => eprintln!("rowbus: skipping table {name:?}: {}", crate::one_line(&e)),
                Err(_) => {}
            }
        }
    } else {
        for name in names {
            tables.push(queue_cmd::existing_queue(broker, name, url).await?.table().clone());
        }
    }
    Ok(tables)
}

/// One line per queue: what its consumers did; and one more for a queue that relays
/// relayed from: what they did, and the lag (the age of its oldest ready message).
fn print_counts(counted: &[Counts], lines: &[Line]) -> Result<(), CliError> {
    for c in counted {
        let what = match &c.counts {
            Ok(Some(counts)) => Counted::CONSUMERS
                .iter()
                .map(|k| format!("{} {}", counted_words(*k), counts.get(*k)))
                .chain(c.limited.map(|held| format!("held by a limit now {held}")))
                .collect::<Vec<_>>()
                .join(", "),
            Ok(None) => format!("not counted: no counts table (`rowbus deploy --queue {}` adds it)", c.table),
            Err(()) => NOT_READABLE.to_owned(),
        };
        outln!("events of `{}`: {what}", c.table);
        if let Some(workflows) = &c.workflows {
            let each: Vec<String> =
                workflows.by_status().iter().map(|(status, n)| format!("{} {n}", status.as_str())).collect();
            outln!("workflows of `{}`: {}", c.table, each.join(", "));
        }
        if let Ok(Some(counts)) = &c.counts
            && Counted::RELAY.iter().any(|k| counts.get(*k) > 0)
        {
            let relayed: Vec<String> =
                Counted::RELAY.iter().map(|k| format!("{} {}", counted_words(*k), counts.get(*k))).collect();
            let lag = lag(lines, &c.table).map_or_else(|| "-".to_owned(), human);
            outln!("relays of `{}`: {}, lag {lag}", c.table, relayed.join(", "));
        }
    }
    Ok(())
}

/// The age of `table`'s oldest ready message, over its groups: how far behind its relays
/// (or consumers) are.
fn lag(lines: &[Line], table: &QueueTable) -> Option<std::time::Duration> {
    lines.iter().filter(|l| &l.table == table).filter_map(|l| l.group.oldest_ready).max()
}

/// One line per durable listener.
fn print_durable(durable: &[DurableListener]) -> Result<(), CliError> {
    for d in durable {
        let lag = match d.lag {
            Some(lag) => format!("{} rows behind, the oldest {} old", d.lag_rows, human(lag)),
            None => "up to date".to_owned(),
        };
        let mark = d.mark.map_or_else(|| "none stored".to_owned(), |m| format!("at id {m}"));
        // Held only within the owner's lease: one that crashed frees the name when it runs out.
        let owner = if d.owned { "held" } else { "free" };
        outln!(
            "durable listener {:?} on {:?}: {mark}, {lag}; checked in {} ago ({owner})",
            d.name,
            d.channel,
            human(d.checked_in)
        );
    }
    Ok(())
}

/// The report as an aligned table, then what each queue's consumers did, each queue's
/// health (and the warning of a horizon held past `horizon_warn`) and the notify table's
/// line.
fn print_table(
    lines: &[Line],
    counted: &[Counts],
    (healths, horizon_warn): (&[QueueHealth], Duration),
    notify: Option<&NotifyTableStats>,
    url: &str,
    config: &NotifyConfig,
    unreadable_queues: bool,
) -> Result<(), CliError> {
    if lines.is_empty() {
        if !unreadable_queues {
            outln!("no queue tables in {}: create one with `rowbus deploy --queue TABLE`", redact(url));
        }
    } else {
        let header = ["TABLE", "GROUP", "DEPTH", "READY", "DELAYED", "IN FLIGHT", "OLDEST", "DEAD", ""];
        let rows: Vec<[String; 9]> = lines
            .iter()
            .map(|Line { table, group: g }| {
                [
                    table.to_string(),
                    if g.group.is_empty() { "-".to_owned() } else { g.group.escape_debug().to_string() },
                    g.depth.to_string(),
                    g.ready.to_string(),
                    g.delayed().to_string(),
                    g.in_flight.to_string(),
                    g.oldest.map_or_else(|| "-".to_owned(), human),
                    g.dead.map_or_else(|| "-".to_owned(), |d| d.to_string()),
                    if g.paused { "PAUSED".to_owned() } else { String::new() },
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let format = |cells: &[&str]| {
            let mut line = String::new();
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                let pad = " ".repeat(w - cell.chars().count());
                // Names and the paused mark left-aligned, figures right-aligned.
                if i < 2 || i == 8 {
                    line.push_str(&format!("{cell}{pad}  "));
                } else {
                    line.push_str(&format!("{pad}{cell}  "));
                }
            }
            line.trim_end().to_owned()
        };
        outln!("{}", format(&header));
        for row in &rows {
            outln!("{}", format(&row.each_ref().map(String::as_str)));
        }
    }
    print_counts(counted, lines)?;
    for h in healths {
        outln!("{}", health_line(h));
        if let Some(warning) = warning(h, horizon_warn) {
            outln!("{warning}");
        }
    }
    if let Some(n) = notify {
        let oldest = n.oldest.map_or_else(String::new, |d| format!(", oldest {} old", human(d)));
        let cleanup = if config.retention.is_zero() {
            "cleanup off".to_owned()
        } else {
            format!("rows older than {} are cleaned up", human(config.retention))
        };
        outln!("notify table `{}`: {} rows{oldest} ({cleanup})", n.table, n.rows);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--horizon-warn`'s default is the dashboard's.
    #[test]
    fn the_default_threshold_is_the_dashboard_s() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            stats: StatsArgs,
        }
        let cli = Cli::try_parse_from(["stats"]).unwrap();
        assert_eq!(cli.stats.horizon_warn, rowbus_ui::health::DEFAULT_HORIZON_WARN);
    }

    #[test]
    fn sizes_with_their_unit() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
    }
}
