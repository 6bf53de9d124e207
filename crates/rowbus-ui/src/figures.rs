//! The figures of queue tables as the dashboard shows them and `rowbus stats` prints
//! them: every group's depth and state, what each queue's consumers did (its counts
//! table), and their JSON shapes.

use rowbus::durable::DurableListener;
use rowbus::limit::{LimitScope, LimitStatus};
use rowbus::stats::{Counted, GroupStats, NotifyTableStats, QueueCounts};
use rowbus::workflow::{WorkflowCounts, WorkflowError, Workflows};
use rowbus::{Broker, Db, QueueTable};
use serde_json::json;

/// What the figures say of a part the database refuses this role.
pub const NOT_READABLE: &str = "not readable by this role (permission denied)";

/// One group of a queue table, as it stands.
#[derive(Debug, Clone)]
pub struct Line {
    /// The queue table.
    pub table: QueueTable,
    /// One of its groups.
    pub group: GroupStats,
}

/// The queue tables `names`, each checked to be a deployed queue table, or when none are
/// named every table with the queue columns whose name rowbus accepts.
pub async fn queue_tables<DB: Db>(
    broker: &Broker<DB>,
    names: &[String],
) -> Result<Vec<QueueTable>, rowbus::Error> {
    let mut tables = Vec::new();
    if names.is_empty() {
        for name in broker.queue_tables().await? {
            // Names come from the catalog: only those rowbus accepts are queried.
            if let Ok(queue) = broker.queue(&name) {
                tables.push(queue.table().clone());
            }
        }
    } else {
        for name in names {
            let queue = broker.queue(name)?;
            if !queue.is_deployed().await? {
                return Err(rowbus::Error::MissingQueueTable { table: queue.table().to_string() });
            }
            tables.push(queue.table().clone());
        }
    }
    Ok(tables)
}

/// Every group of every one of `tables`, as it stands.
pub async fn lines<DB: Db>(broker: &Broker<DB>, tables: &[QueueTable]) -> Result<Vec<Line>, rowbus::Error> {
    let mut lines = Vec::new();
    for table in tables {
        for group in broker.queue(table.channel())?.group_stats().await? {
            lines.push(Line { table: table.clone(), group });
        }
    }
    Ok(lines)
}

/// A queue table's counts table as the figures show it: what its consumers, in every
/// process, did.
#[derive(Debug, Clone)]
pub struct Counts {
    /// The queue table.
    pub table: QueueTable,
    /// Its counts; `None` without a counts table (a queue deployed by an older rowbus),
    /// `Err(())` where this role may not read it.
    pub counts: Result<Option<QueueCounts>, ()>,
    /// Its messages ready but held back by a limit now; `None` without a limits table (a
    /// queue deployed by an older rowbus) or where this role may not read it.
    pub limited: Option<u64>,
    /// Each limited scope's limits in words (`whole queue: max running 5, rate 20/s,
    /// burst 1`), the whole queue's first; empty where `limited` is `None`.
    pub limits: Vec<String>,
    /// Its workflows in each status; `None` without workflow tables or where this role
    /// may not read them.
    pub workflows: Option<WorkflowCounts>,
}

/// The counts of `table`'s consumers; a counts table this role may not read is one part
/// of the figures the role does not see, not a failure.
pub async fn counts<DB: Db>(broker: &Broker<DB>, table: &QueueTable) -> Result<Counts, rowbus::Error> {
    let queue = broker.queue(table.channel())?;
    let counts = match queue.counts().await {
        Ok(counts) => Ok(counts),
        Err(e) if e.is_permission_denied() => Err(()),
        Err(e) => return Err(e),
    };
    // One read gives both the limits and what they hold (as `Queue::limited` adds it up).
    let (limited, limits) = match queue.limits().await {
        Ok(all) => {
            let held = |queue: bool| {
                all.iter().filter(move |l| (l.scope == LimitScope::Queue) == queue).map(|l| l.held)
            };
            let limited = held(true).sum::<u64>().max(held(false).sum::<u64>());
            (Some(limited), all.iter().map(limit_words).collect())
        }
        Err(rowbus::Error::MissingLimitsTable { .. }) => (None, Vec::new()),
        Err(e) if e.is_permission_denied() => (None, Vec::new()),
        Err(e) => return Err(e),
    };
    let workflows = match Workflows::new(queue).counts().await {
        Ok(counts) => counts,
        Err(WorkflowError::Db(e)) if e.is_permission_denied() => None,
        Err(WorkflowError::Db(e)) => return Err(e),
        Err(_) => None,
    };
    Ok(Counts { table: table.clone(), counts, limited, limits, workflows })
}

/// A scope's limits in words: `group "g": max running 5, per key 2, rate 20/s, burst 1`.
pub fn limit_words(status: &LimitStatus) -> String {
    let limits: Vec<String> = [
        status.max_running.map(|n| format!("max running {n}")),
        status.per_key.map(|n| format!("per key {n}")),
        status.rate.map(|rate| format!("rate {rate}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!("{}: {}", status.scope, limits.join(", "))
}

/// The words of a counted event: `timed out` for `timed_out`.
pub fn counted_words(kind: Counted) -> String {
    kind.as_str().replace('_', " ")
}

/// Each queue's counts as JSON: `{TABLE: {"cancelled": N, "snoozed": N, "timed_out": N,
/// "lease_lost": N, "limited": N, "limits": [TEXT], "workflows": {STATUS: N}}` ("limited":
/// ready messages held by a limit now, absent without a limits table; "limits": each
/// limited scope's limits in words, absent without any; "workflows": the queue's workflows
/// by status, absent without workflow tables), null without a counts table, `{"error":
/// ...}` where not readable.
pub fn counts_json(counted: &[Counts]) -> serde_json::Value {
    let entries = counted.iter().map(|c| {
        let value = match &c.counts {
            Ok(Some(counts)) => serde_json::Value::Object(
                Counted::ALL
                    .iter()
                    .map(|k| (k.as_str().to_owned(), json!(counts.get(*k))))
                    .chain(c.limited.map(|held| ("limited".to_owned(), json!(held))))
                    .chain((!c.limits.is_empty()).then(|| ("limits".to_owned(), json!(c.limits))))
                    .chain(c.workflows.map(|w| ("workflows".to_owned(), workflows_json(&w))))
                    .collect(),
            ),
            Ok(None) => serde_json::Value::Null,
            Err(()) => json!({ "error": NOT_READABLE }),
        };
        (c.table.channel().to_owned(), value)
    });
    serde_json::Value::Object(entries.collect())
}

/// A queue's workflows by status as JSON: `{"running": N, "succeeded": N, "failed": N,
/// "cancelled": N}`.
fn workflows_json(counts: &WorkflowCounts) -> serde_json::Value {
    serde_json::Value::Object(
        counts.by_status().iter().map(|(s, n)| (s.as_str().to_owned(), json!(n))).collect(),
    )
}

/// The groups and the notify table as one JSON object: `{"queues": [...], "notify_table":
/// {...} or null}`.
pub fn to_json(lines: &[Line], notify: Option<&NotifyTableStats>) -> serde_json::Value {
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
pub fn durable_json(durable: &[DurableListener]) -> serde_json::Value {
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
