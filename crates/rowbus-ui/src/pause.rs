//! The dashboard's pauses: what is paused in each queue shown (`"pauses"` of
//! `GET /api/queues`), and the operations `POST /api/ops/queues/{queue}/pause` and
//! `.../resume`, on the whole queue (`{}`) or one group (`{"group": "G"}`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rowbus::stats::Paused;
use rowbus::{Broker, Db, QueueTable};
use serde_json::{Value, json};

use crate::dead::refuse;
use crate::{App, unavailable};

/// What is paused in each of `tables`, in their order. A queue deployed before pause
/// tables existed has nothing paused, as its figures say.
pub(crate) async fn states<DB: Db>(
    broker: &Broker<DB>,
    tables: &[QueueTable],
) -> Result<Vec<(QueueTable, Paused)>, rowbus::Error> {
    let mut states = Vec::with_capacity(tables.len());
    for table in tables {
        let paused = match broker.queue(table.channel())?.paused().await {
            Err(rowbus::Error::MissingPauseTable { .. }) => Paused::default(),
            other => other?,
        };
        states.push((table.clone(), paused));
    }
    Ok(states)
}

/// `states` as JSON: `{"<queue>": {"queue": true|false, "groups": ["G", ...]}}`, every
/// queue shown, those without a message included.
pub(crate) fn to_json(states: &[(QueueTable, Paused)]) -> Value {
    let map: serde_json::Map<String, Value> = states
        .iter()
        .map(|(table, p)| (table.channel().to_owned(), json!({ "queue": p.queue, "groups": p.groups })))
        .collect();
    map.into()
}

/// The group an operation's body names: `{}` is the whole queue, `{"group": "G"}` group
/// `G` (`""` is the default group) when the library accepts the name; anything else is
/// refused with why.
fn target(body: &Value) -> Result<Option<String>, String> {
    let object = body.as_object().ok_or("the body must be a JSON object: {} or {\"group\": \"G\"}")?;
    if let Some(unknown) = object.keys().find(|k| k.as_str() != "group") {
        return Err(format!(
            "unknown field {unknown:?}: give {{}} for the whole queue or {{\"group\": \"G\"}}"
        ));
    }
    match object.get("group") {
        None => Ok(None),
        Some(Value::String(group)) => match rowbus::limits::check_group(group) {
            Ok(()) => Ok(Some(group.clone())),
            Err(e) => Err(e.one_line()),
        },
        Some(_) => Err("\"group\" must be a string (\"\" is the default group)".to_owned()),
    }
}

/// Runs `run` on the queue `name` and the group `body` names; its answer as JSON.
async fn operate<DB: Db>(
    app: &App<DB>,
    name: &str,
    body: &Value,
    run: impl AsyncFnOnce(&rowbus::Queue<DB>, Option<&str>) -> Result<Value, rowbus::Error>,
) -> Response {
    let group = match target(body) {
        Ok(group) => group,
        Err(line) => return refuse(StatusCode::BAD_REQUEST, line),
    };
    let queue = match app.shown_queue(name).await {
        Ok(queue) => queue,
        Err(refusal) => return refusal,
    };
    match run(&queue, group.as_deref()).await {
        Ok(answer) => Json(answer).into_response(),
        // A queue to deploy again: trying again will not do.
        Err(e @ rowbus::Error::MissingPauseTable { .. }) => refuse(StatusCode::CONFLICT, app.say(&e)),
        Err(e) => unavailable(app.say(&e), true),
    }
}

/// `POST /api/ops/queues/{queue}/pause`: `Queue::pause`, which wakes the consumers
/// (elsewhere too, with the dashboard's listening broker); `{"paused": true}`, or `false`
/// when it was paused so already.
pub(crate) async fn pause<DB: Db>(
    State(app): State<App<DB>>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    operate(&app, &name, &body, async |queue, group| Ok(json!({ "paused": queue.pause(group).await? }))).await
}

/// `POST /api/ops/queues/{queue}/resume`: `Queue::resume` (`{}` lifts every pause of the
/// queue, its groups' included; a group's lifts its own); `{"resumed": N}`, the pauses
/// lifted.
pub(crate) async fn resume<DB: Db>(
    State(app): State<App<DB>>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    operate(&app, &name, &body, async |queue, group| Ok(json!({ "resumed": queue.resume(group).await? })))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{}` is the whole queue, a string `group` one group (`""` included); anything else
    /// is refused.
    #[test]
    fn targets() {
        assert_eq!(target(&json!({})), Ok(None));
        assert_eq!(target(&json!({ "group": "" })), Ok(Some(String::new())));
        assert_eq!(target(&json!({ "group": "g\"x" })), Ok(Some("g\"x".to_owned())));
        for bad in [
            json!([]),
            json!("x"),
            json!({ "group": 1 }),
            json!({ "group": null }),
            json!({ "all": true }),
            json!({ "group": "trailing " }),
        ] {
            assert!(target(&bad).is_err(), "{bad} accepted");
        }
    }

    /// Every queue shown is in the JSON, with its whole pause and its groups'.
    #[test]
    fn states_as_json() {
        let table = |name: &str| name.parse::<QueueTable>().unwrap();
        let states = [
            (table("jobs"), {
                let mut paused = Paused::default();
                (paused.queue, paused.groups) = (true, vec!["a".into()]);
                paused
            }),
            (table("mail"), Paused::default()),
        ];
        assert_eq!(
            to_json(&states),
            json!({ "jobs": { "queue": true, "groups": ["a"] }, "mail": { "queue": false, "groups": [] } })
        );
    }
}
