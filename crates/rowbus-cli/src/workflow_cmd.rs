//! `rowbus workflow list|show|cancel|emit`: a queue's durable workflows, their recorded
//! steps, sleeps and awaited events; cancelling one, emitting an event to one.

use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use rowbus::sqlx::Pool;
use rowbus::workflow::{Status, StepInfo, StepState, WorkflowError, WorkflowInfo, Workflows};
use rowbus::{Broker, Db, NotifyConfig};
use serde_json::{Value, json};

use crate::cli_error::CliError;
use crate::dead_cmd::{broker_waking_where_it_can, rfc3339};
use crate::queue_cmd::{self, outln};

/// What `rowbus workflow` does.
#[derive(Debug, Subcommand)]
pub(crate) enum WorkflowCommand {
    /// A queue's workflows, newest first: id, status, name, version, started, ended
    List(ListArgs),
    /// One workflow: its row, then each recorded step (state, attempts, times, output size),
    /// its sleeps and the events it waits for
    Show(ShowArgs),
    /// Cancel a running workflow: marked cancelled, its run asked to stop
    Cancel(IdArgs),
    /// Emit an event to a workflow (kept until a wait for it takes it; a workflow waiting
    /// for it is made due at once)
    Emit(EmitArgs),
}

impl WorkflowCommand {
    /// The queue table it names.
    pub(crate) fn table(&self) -> &String {
        match self {
            WorkflowCommand::List(args) => &args.table,
            WorkflowCommand::Show(args) => &args.id.table,
            WorkflowCommand::Cancel(args) => &args.table,
            WorkflowCommand::Emit(args) => &args.id.table,
        }
    }
}

/// `rowbus workflow list`'s options.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// The queue table the workflows run on
    table: String,
    /// Only the workflows of this status: running, succeeded, failed or cancelled
    #[arg(long, value_name = "S", value_parser = status)]
    status: Option<Status>,
    /// Print at most this many
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: u32,
    /// Print JSON lines {"id", "name", "version", "status", "idempotency_key", "parent",
    /// "message_id", "created_at", "updated_at", "input_bytes", "output_bytes", "error"}; times
    /// in RFC 3339 (UTC, microseconds)
    #[arg(long)]
    json: bool,
}

/// A queue and a workflow of it.
#[derive(Debug, Args)]
pub(crate) struct IdArgs {
    /// The queue table the workflow runs on
    table: String,
    /// The workflow's id
    id: String,
}

/// `rowbus workflow show`'s options.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    #[command(flatten)]
    id: IdArgs,
    /// Print one JSON object: the workflow's fields (as `list --json`, with "input",
    /// "output") and "steps": [{"seq", "name", "state", "attempts", "started_at",
    /// "ended_at", "output_bytes", "output", "error", "wakes_at", "event", "deadline"}]
    #[arg(long)]
    json: bool,
}

/// `rowbus workflow emit`'s options.
#[derive(Debug, Args)]
pub(crate) struct EmitArgs {
    #[command(flatten)]
    id: IdArgs,
    /// The event's name
    event: String,
    /// Its payload, as JSON (`'"card"'`, `'{"cents": 1999}'`); text that is not JSON is sent
    /// as a JSON string [default: null]
    payload: Option<String>,
}

/// A `--status`.
fn status(text: &str) -> Result<Status, String> {
    Status::parse(text).ok_or_else(|| "one of running, succeeded, failed, cancelled".to_owned())
}

/// A workflow error in the command's words: the library's own for the database, its text
/// otherwise.
fn cli_error(error: WorkflowError) -> CliError {
    match error {
        WorkflowError::Db(error) => CliError::Rowbus(error),
        other => CliError::Message(other.to_string()),
    }
}

/// Runs `command` on the queue it names. A cancel or an emit wakes consumers in other
/// processes where it can (a workflow made due, a run asked to stop).
pub(crate) async fn workflow<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    command: WorkflowCommand,
) -> Result<(), CliError> {
    let wakes = matches!(command, WorkflowCommand::Cancel(_) | WorkflowCommand::Emit(_));
    let (broker, _wake_ups_off) = broker_waking_where_it_can(pool, url, config, wakes).await?;
    let result = run(&broker, url, command).await;
    broker.shutdown(Duration::ZERO).await;
    result
}

async fn run<DB: Db>(broker: &Broker<DB>, url: &str, command: WorkflowCommand) -> Result<(), CliError> {
    let queue = queue_cmd::existing_queue(broker, command.table(), url).await?;
    let table = queue.table().to_string();
    let workflows = Workflows::new(queue);
    let found = |id: &str| CliError::Message(format!("no workflow `{id}` in `{table}`"));
    match command {
        WorkflowCommand::List(args) => {
            for info in workflows.list(args.status, args.limit).await.map_err(cli_error)? {
                match args.json {
                    true => outln!("{}", info_json(&info)),
                    false => outln!("{}", info_line(&info)),
                }
            }
        }
        WorkflowCommand::Show(args) => {
            let id = &args.id.id;
            let info = workflows.get(id).await.map_err(cli_error)?.ok_or_else(|| found(id))?;
            let steps = workflows.steps(id).await.map_err(cli_error)?;
            match args.json {
                true => {
                    let mut object = info_json(&info);
                    object["input"] = json_or_text(&info.input);
                    object["output"] = info.output.as_deref().map_or(Value::Null, json_or_text);
                    object["steps"] = steps.iter().map(step_json).collect();
                    outln!("{object}")
                }
                false => {
                    outln!("{}", info_line(&info));
                    outln!("  input {}", queue_cmd::on_one_line(&info.input));
                    if let Some(output) = &info.output {
                        outln!("  output {}", queue_cmd::on_one_line(output));
                    }
                    if let Some(error) = &info.error {
                        outln!("  error {error:?}");
                    }
                    match steps.is_empty() {
                        true => outln!("  no step recorded"),
                        false => outln!("  steps:"),
                    }
                    for step in &steps {
                        outln!("    {}", step_line(step));
                    }
                }
            }
        }
        WorkflowCommand::Cancel(args) => {
            let id = &args.id;
            match workflows.cancel(id).await {
                Ok(true) => outln!("cancelled workflow `{id}` of `{table}`"),
                Ok(false) => {
                    let status = workflows.get(id).await.map_err(cli_error)?.map(|i| i.status);
                    let status = status.map_or_else(|| "gone".to_owned(), |s| s.to_string());
                    outln!("workflow `{id}` of `{table}` had ended ({status}): nothing cancelled")
                }
                Err(WorkflowError::NotFound(_)) => return Err(found(id)),
                Err(e) => return Err(cli_error(e)),
            }
        }
        WorkflowCommand::Emit(args) => {
            let id = &args.id.id;
            let payload = args.payload.as_deref().map_or(Value::Null, json_or_text);
            match workflows.emit_event(id, &args.event, &payload).await {
                Ok(()) => outln!("emitted `{}` to workflow `{id}` of `{table}`", args.event),
                Err(WorkflowError::NotFound(_)) => return Err(found(id)),
                Err(e) => return Err(cli_error(e)),
            }
        }
    }
    Ok(())
}

/// `text` as JSON when it is JSON, else as a JSON string.
fn json_or_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// A time stored as microseconds since the Unix epoch (a sleep's wake, a wait's deadline).
fn micros(text: Option<&str>) -> Option<SystemTime> {
    let us: u64 = text?.trim().parse().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_micros(us))
}

/// One workflow on one line.
fn info_line(info: &WorkflowInfo) -> String {
    let ended = match info.status.is_end() {
        true => rfc3339(info.updated_at),
        false => "-".to_owned(),
    };
    let version = if info.version.is_empty() { "-" } else { &info.version };
    format!(
        "{}  {}  {:?}  version {version}  started {}  ended {ended}",
        info.id,
        info.status,
        info.name,
        rfc3339(info.created_at)
    )
}

/// One workflow as a JSON object.
fn info_json(info: &WorkflowInfo) -> Value {
    json!({
        "id": info.id,
        "name": info.name,
        "version": info.version,
        "status": info.status.as_str(),
        "idempotency_key": info.idempotency_key,
        "parent": info.parent,
        "message_id": info.message_id,
        "created_at": rfc3339(info.created_at),
        "updated_at": rfc3339(info.updated_at),
        "input_bytes": info.input.len(),
        "output_bytes": info.output.as_ref().map(String::len),
        "error": info.error,
    })
}

/// The event a wait step waits for, from its name.
fn awaited(step: &StepInfo) -> Option<&str> {
    step.name.strip_prefix("rowbus.event:")
}

/// One step on one line: `#2 "charge" done attempts 1 started T took 3ms output 12 B`; a
/// sleep says when it wakes, a wait which event and until when.
fn step_line(step: &StepInfo) -> String {
    let mut line = format!("#{} {:?} {}", step.seq, step.name, step.state.as_str());
    match step.state {
        StepState::Sleep => {
            let wakes = micros(step.output.as_deref()).map_or_else(|| "?".to_owned(), rfc3339);
            line += &format!("  wakes {wakes}");
        }
        StepState::Wait => {
            let deadline = micros(step.output.as_deref()).map_or_else(|| "none".to_owned(), rfc3339);
            line += &format!("  for event {:?}  deadline {deadline}", awaited(step).unwrap_or(&step.name));
        }
        _ => {}
    }
    line += &format!("  attempts {}  started {}", step.attempts, rfc3339(step.started_at));
    if let Some(ended) = step.ended_at {
        let took = ended.duration_since(step.started_at).unwrap_or_default();
        line += &format!("  took {}", queue_cmd::human(took));
    }
    if matches!(step.state, StepState::Done | StepState::TimedOut) {
        line += &format!("  output {} B", step.output.as_ref().map_or(0, String::len));
    }
    if let Some(error) = &step.error {
        line += &format!("  error {error:?}");
    }
    line
}

/// One step as a JSON object.
fn step_json(step: &StepInfo) -> Value {
    let time = |state| match step.state == state {
        true => micros(step.output.as_deref()).map(rfc3339),
        false => None,
    };
    let output = match step.state {
        StepState::Done | StepState::TimedOut => step.output.as_deref().map(json_or_text),
        _ => None,
    };
    json!({
        "seq": step.seq,
        "name": step.name,
        "state": step.state.as_str(),
        "attempts": step.attempts,
        "started_at": rfc3339(step.started_at),
        "ended_at": step.ended_at.map(rfc3339),
        "output_bytes": step.output.as_ref().map(String::len),
        "output": output,
        "error": step.error,
        "wakes_at": time(StepState::Sleep),
        "event": awaited(step),
        "deadline": time(StepState::Wait),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_json_or_strings() {
        assert_eq!(json_or_text(r#"{"a":1}"#), json!({"a": 1}));
        assert_eq!(json_or_text("card"), json!("card"));
        assert_eq!(json_or_text("\"card\""), json!("card"));
    }

    #[test]
    fn statuses_parse_by_name() {
        assert_eq!(status("failed"), Ok(Status::Failed));
        assert!(status("done").is_err());
    }
}
