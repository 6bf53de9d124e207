//! `rowbus stats [TABLE...]`: each queue table's groups as they stand (PAUSED where
//! `rowbus pause` holds them), what its consumers did (its counts table), and the notify
//! table's size and lag.

use clap::Args;
use rowbus::durable::DurableListener;
use rowbus::sqlx::Pool;
use rowbus::stats::{Counted, GroupStats, NotifyTableStats, QueueCounts};
use rowbus::{Broker, BrokerOptions, Db, NotifyConfig, QueueTable, redact};
use serde_json::json;

use crate::cli_error::CliError;
use crate::queue_cmd::{self, human, outln, parse_tables};

/// Options of `rowbus stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// Queue tables [default: every table with the queue columns in the current schema(s)
    /// or database]
    pub(crate) tables: Vec<String>,
    /// Print one JSON object {"queues": [...], "counts": {TABLE: {"cancelled", "snoozed",
    /// "timed_out", "lease_lost"} or null without a counts table}, "notify_table": {...} or
    /// null, "durable_listeners": [...]}; a part this role may not read has an "error"
    /// instead of figures (durable listeners: null, and "durable_listeners_error")
    #[arg(long)]
    json: bool,
}

/// One line of the report: a group of a queue table.
pub(crate) struct Line {
    /// The queue table.
    pub(crate) table: QueueTable,
    /// One of its groups.
    pub(crate) group: GroupStats,
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
    for table in &tables {
        match self::lines(&broker, std::slice::from_ref(table)).await {
            // Found in the catalog, dropped (`rowbus undeploy`) before it was read.
            Err(CliError::Rowbus(rowbus::Error::MissingQueueTable { .. })) if args.tables.is_empty() => {}
            read => match readable(read)? {
                Ok(found) => {
                    lines.extend(found);
                    counted.push(counts(&broker, table).await?);
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
        print_table(&lines, &counted, shown, url, config, !unreadable.is_empty())?;
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

/// What `rowbus stats` says of a part the database refuses this role.
const NOT_READABLE: &str = "not readable by this role (permission denied)";

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

/// Every group of every one of `tables`, as it stands.
pub(crate) async fn lines<DB: Db>(broker: &Broker<DB>, tables: &[QueueTable]) -> Result<Vec<Line>, CliError> {
    let mut lines = Vec::new();
    for table in tables {
        for group in broker.queue(table.channel())?.group_stats().await? {
            lines.push(Line { table: table.clone(), group });
        }
    }
    Ok(lines)
}

/// A queue table's counts table as the report shows it: what its consumers, in every
/// process, did.
pub(crate) struct Counts {
    /// The queue table.
    pub(crate) table: QueueTable,
    /// Its counts; `None` without a counts table (a queue deployed by an older rowbus),
    /// `Err(())` where this role may not read it.
    pub(crate) counts: Result<Option<QueueCounts>, ()>,
    /// Its messages ready but held back by a limit now; `None` without a limits table (a
    /// queue deployed by an older rowbus) or where this role may not read it.
    pub(crate) limited: Option<u64>,
}

/// The counts of `table`'s consumers; a counts table this role may not read is one part
/// of the report the role does not see, not a failure.
pub(crate) async fn counts<DB: Db>(broker: &Broker<DB>, table: &QueueTable) -> Result<Counts, CliError> {
    let queue = broker.queue(table.channel())?;
    let counts = readable(queue.counts().await.map_err(CliError::from))?;
    let limited = match queue.limited().await {
        Ok(held) => Some(held),
        Err(rowbus::Error::MissingLimitsTable { .. }) => None,
        Err(e) if e.is_permission_denied() => None,
        Err(e) => return Err(e.into()),
    };
    Ok(Counts { table: table.clone(), counts, limited })
}

/// The words of a counted event: `timed out` for `timed_out`.
pub(crate) fn counted_words(kind: Counted) -> String {
    kind.as_str().replace('_', " ")
}

/// Each queue's counts as JSON: `{TABLE: {"cancelled": N, "snoozed": N, "timed_out": N,
/// "lease_lost": N, "limited": N}}` ("limited": ready messages held by a limit now, absent
/// without a limits table), null without a counts table, `{"error": ...}` where not
/// readable.
pub(crate) fn counts_json(counted: &[Counts]) -> serde_json::Value {
    let entries = counted.iter().map(|c| {
        let value = match &c.counts {
            Ok(Some(counts)) => serde_json::Value::Object(
                Counted::ALL
                    .iter()
                    .map(|k| (k.as_str().to_owned(), json!(counts.get(*k))))
                    .chain(c.limited.map(|held| ("limited".to_owned(), json!(held))))
                    .collect(),
            ),
            Ok(None) => serde_json::Value::Null,
            Err(()) => json!({ "error": NOT_READABLE }),
        };
        (c.table.channel().to_owned(), value)
    });
    serde_json::Value::Object(entries.collect())
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
pub(crate) fn lag(lines: &[Line], table: &QueueTable) -> Option<std::time::Duration> {
    lines.iter().filter(|l| &l.table == table).filter_map(|l| l.group.oldest_ready).max()
}

/// The report as one JSON object.
pub(crate) fn to_json(lines: &[Line], notify: Option<&NotifyTableStats>) -> serde_json::Value {
    let queues: Vec<serde_json::Value> = lines
        .iter()
        .map(|Line { table, group: g }| {
            json!({
                "table": table.channel(),
                "group": g.group,
                "depth": g.depth,
                "ready": g.ready,
                "delayed": g.delayed(),
                "in_flight": g.in_flight,
                "oldest_age_s": g.oldest.map(|d| d.as_secs_f64()),
                "oldest_ready_age_s": g.oldest_ready.map(|d| d.as_secs_f64()),
                "dead": g.dead,
                "paused": g.paused,
            })
        })
        .collect();
    let notify = notify.map(
        |n| json!({"table": n.table, "rows": n.rows, "oldest_age_s": n.oldest.map(|d| d.as_secs_f64())}),
    );
    json!({"queues": queues, "notify_table": notify})
}

/// Each durable listener's position, lag and last check-in, as JSON.
pub(crate) fn durable_json(durable: &[DurableListener]) -> serde_json::Value {
    durable
        .iter()
        .map(|d| {
            json!({
                "channel": d.channel,
                "name": d.name,
                "mark": d.mark,
                "lag_rows": d.lag_rows,
                "lag_s": d.lag.map(|l| l.as_secs_f64()),
                "checked_in_s_ago": d.checked_in.as_secs_f64(),
                "lease_s": d.lease.as_secs_f64(),
                "owned": d.owned,
            })
        })
        .collect()
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

/// The report as an aligned table, then what each queue's consumers did and the notify
/// table's line.
fn print_table(
    lines: &[Line],
    counted: &[Counts],
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
