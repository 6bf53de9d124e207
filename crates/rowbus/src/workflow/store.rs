//! The statements on a queue's workflow tables, run: rows in, [`WorkflowInfo`],
//! [`StepInfo`] and [`Recorded`] out.

use std::sync::Arc;

use super::replay::Recorded;
use super::{Status, StepInfo, StepState, WorkflowError, WorkflowInfo, time_of};
use crate::driver::{Arg, TextsAndInts};
use crate::sql::{Db, WorkflowSql};

/// `Some(text)` as a bind, or NULL.
pub(super) fn opt(text: Option<&str>) -> Arg<'_> {
    text.map_or(Arg::Null, Arg::Text)
}

/// `text` unless `null` says the column was NULL, or it is empty and `empty_is_null`.
fn unless(text: &str, null: bool) -> Option<String> {
    (!null).then(|| text.to_owned())
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// A workflow row of [`WorkflowSql::load`]'s columns, after `skip` text columns.
fn info(id: &str, row: &TextsAndInts, skip: usize) -> Result<WorkflowInfo, WorkflowError> {
    let t = |i: usize| row.text(skip + i);
    let status =
        Status::parse(t(2)).ok_or_else(|| WorkflowError::Json(format!("unknown status `{}`", t(2))))?;
    Ok(WorkflowInfo {
        id: id.to_owned(),
        name: t(0).to_owned(),
        version: t(1).to_owned(),
        status,
        input: t(3).to_owned(),
        output: unless(t(4), row.int(3) == 1),
        error: non_empty(t(5)),
        idempotency_key: non_empty(t(6)),
        parent: non_empty(t(7)),
        message_id: row.ints.first().copied().flatten(),
        created_at: time_of(row.int(1)),
        updated_at: time_of(row.int(2)),
    })
}

/// The workflow `id`, if there is one.
pub(super) async fn load<DB: Db>(
    conn: &mut DB::Connection,
    sql: &WorkflowSql,
    id: &str,
) -> Result<Option<WorkflowInfo>, WorkflowError> {
    let rows = DB::fetch_rows(conn, &sql.load, &[Arg::Text(id)], 8).await?;
    rows.first().map(|row| info(id, row, 0)).transpose()
}

/// Up to `limit` workflows, newest first, of `status` or every one.
pub(super) async fn list<DB: Db>(
    conn: &mut DB::Connection,
    sql: &WorkflowSql,
    status: Option<Status>,
    limit: u32,
) -> Result<Vec<WorkflowInfo>, WorkflowError> {
    let s = status.map_or("", Status::as_str);
    let rows =
        DB::fetch_rows(conn, &sql.list, &[Arg::Text(s), Arg::Text(s), Arg::Int(limit.into())], 9).await?;
    rows.iter().map(|row| info(row.text(0), row, 1)).collect()
}

/// The recorded steps of workflow `id`, in order.
pub(super) async fn steps<DB: Db>(
    conn: &mut DB::Connection,
    sql: &WorkflowSql,
    id: &str,
) -> Result<Vec<StepInfo>, WorkflowError> {
    let rows = DB::fetch_rows(conn, &sql.steps, &[Arg::Text(id)], 4).await?;
    Ok(rows
        .iter()
        .map(|row| StepInfo {
            seq: u32::try_from(row.int(0)).unwrap_or(0),
            name: row.text(0).to_owned(),
            state: StepState::parse(row.text(1)).unwrap_or(StepState::Done),
            output: unless(row.text(2), row.int(4) == 1),
            error: non_empty(row.text(3)),
            attempts: u32::try_from(row.int(1)).unwrap_or(0),
            started_at: time_of(row.int(2)),
            ended_at: row.ints.get(3).copied().flatten().map(time_of),
        })
        .collect())
}

/// The recorded steps of workflow `id` as a replay reads them.
pub(super) async fn recorded<DB: Db>(
    conn: &mut DB::Connection,
    sql: &WorkflowSql,
    id: &str,
) -> Result<Vec<Recorded>, WorkflowError> {
    Ok(steps::<DB>(conn, sql, id)
        .await?
        .into_iter()
        .map(|s| Recorded {
            seq: s.seq,
            name: s.name,
            state: s.state.as_str().to_owned(),
            output: s.output,
            error: s.error,
        })
        .collect())
}

/// The step at `seq` of workflow `id`, as recorded.
pub(super) async fn recorded_at<DB: Db>(
    conn: &mut DB::Connection,
    sql: &WorkflowSql,
    id: &str,
    seq: u32,
) -> Result<Option<Recorded>, WorkflowError> {
    Ok(recorded::<DB>(conn, sql, id).await?.into_iter().find(|r| r.seq == seq))
}

/// A step to record.
pub(super) struct NewStep<'a> {
    pub id: &'a str,
    pub seq: u32,
    pub name: &'a str,
    pub state: StepState,
    pub output: Option<&'a str>,
    pub error: Option<&'a str>,
    pub attempts: u32,
    pub started_us: i64,
    pub ended_us: Option<i64>,
}

/// Records `step` unless its position is taken: whether it did.
pub(super) async fn insert_step<DB: Db>(
    conn: &mut DB::Connection,
    sql: &WorkflowSql,
    step: &NewStep<'_>,
) -> Result<bool, WorkflowError> {
    let args = [
        Arg::Text(step.id),
        Arg::Int(step.seq.into()),
        Arg::Text(step.name),
        Arg::Text(step.state.as_str()),
        opt(step.output),
        opt(step.error),
        Arg::Int(step.attempts.into()),
        Arg::Int(step.started_us),
        Arg::Int(step.ended_us.unwrap_or(-1)),
    ];
    Ok(DB::execute(conn, &sql.insert_step, &args).await? == 1)
}

/// Moves step `seq` of `id` from `from` to `to` with `output`: whether it was in `from`.
pub(super) async fn move_step<DB: Db>(
    conn: &mut DB::Connection,
    sql: &WorkflowSql,
    (id, seq): (&str, u32),
    from: StepState,
    to: StepState,
    output: Option<&str>,
    ended_us: i64,
) -> Result<bool, WorkflowError> {
    let args = [
        Arg::Text(to.as_str()),
        opt(output),
        Arg::Int(ended_us),
        Arg::Text(id),
        Arg::Int(seq.into()),
        Arg::Text(from.as_str()),
    ];
    Ok(DB::execute(conn, &sql.move_step, &args).await? == 1)
}

/// The oldest unconsumed event `name` of workflow `id`: its id and payload (JSON; `null`
/// for a NULL payload). Locked until the transaction ends where `lock`.
pub(super) async fn event<DB: Db>(
    conn: &mut DB::Connection,
    sql: &WorkflowSql,
    id: &str,
    name: &str,
    lock: bool,
) -> Result<Option<(i64, String)>, WorkflowError> {
    let statement: &Arc<str> = if lock { &sql.take_event } else { &sql.peek_event };
    let rows = DB::fetch_rows(conn, statement, &[Arg::Text(id), Arg::Text(name)], 1).await?;
    Ok(rows.first().map(|row| {
        let payload = if row.int(1) == 1 { "null".to_owned() } else { row.text(0).to_owned() };
        (row.int(0), payload)
    }))
}
