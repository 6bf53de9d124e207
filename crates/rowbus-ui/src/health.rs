//! Each queue's health as the dashboard, `/metrics` and `rowbus stats` show it: its dead
//! rows, its size on disk and what holds the database's horizon
//! ([`Queue::health`](rowbus::Queue::health)), with the warning past a threshold.

use std::time::Duration;

use rowbus::stats::{Holder, QueueHealth, Reading};
use rowbus::{Broker, Db, QueueTable};
use serde_json::json;

/// How long a transaction may hold the horizon before the figures warn of it, unless
/// told otherwise (`--horizon-warn`): longer than a report or a backup's usual
/// transaction, short enough that a queue at a few thousand messages a second has not
/// yet grown far.
pub const DEFAULT_HORIZON_WARN: Duration = Duration::from_secs(300);

/// The health of each of `tables`.
pub async fn healths<DB: Db>(
    broker: &Broker<DB>,
    tables: &[QueueTable],
) -> Result<Vec<QueueHealth>, rowbus::Error> {
    let mut healths = Vec::with_capacity(tables.len());
    for table in tables {
        healths.push(broker.queue(table.channel())?.health().await?);
    }
    Ok(healths)
}

/// A figure as JSON: its value, null where the database keeps none, `{"error": why}`
/// where this user may not read it.
fn reading<T>(figure: &Reading<T>, value: impl Fn(&T) -> serde_json::Value) -> serde_json::Value {
    match figure {
        Ok(Some(v)) => value(v),
        Ok(None) => serde_json::Value::Null,
        Err(unreadable) => json!({ "error": unreadable.to_string() }),
    }
}

/// A holder as JSON.
fn holder_json(h: &Holder) -> serde_json::Value {
    json!({
        "kind": h.kind.as_str(),
        "pid": h.pid,
        "name": h.name,
        "application": h.application,
        "age_s": reading(&h.age, |d| json!(d.as_secs_f64())),
        "xid_age": h.xid_age,
    })
}

/// Each queue's health as JSON: `{TABLE: {"dead_rows": N, "dead_rows_server_wide": bool,
/// "bytes": N, "holder": {"kind", "pid", "name", "application", "age_s", "xid_age"} or
/// null, "wal": {"bytes", "frames", "frames_left"} or null, "held_past_warn": bool}}`,
/// a figure this user may not read `{"error": why}`.
pub fn health_json(healths: &[QueueHealth], warn: Duration) -> serde_json::Value {
    let entries = healths.iter().map(|h| {
        let value = json!({
            "dead_rows": reading(&h.dead_rows, |d| json!(d.rows)),
            "dead_rows_server_wide": matches!(&h.dead_rows, Ok(Some(d)) if d.server_wide),
            "bytes": reading(&h.bytes, |b| json!(b)),
            "holder": reading(&h.holder, holder_json),
            "wal": h.wal.map(|w| json!({"bytes": w.bytes, "frames": w.frames, "frames_left": w.frames_left})),
            "held_past_warn": h.held_past(warn),
        });
        (h.table.clone(), value)
    });
    serde_json::Value::Object(entries.collect())
}
