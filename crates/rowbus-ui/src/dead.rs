//! The dashboard's dead letters: `GET /api/queues/{queue}/dead` lists a queue's newest,
//! and the operations `POST /api/ops/queues/{queue}/dead/requeue` and `.../purge` put
//! them back or delete them, by `{"ids": [...]}` or `{"all": true}`.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use rowbus::dead::{DeadLetterPage, DeadLetters};
use rowbus::{Db, Queue};
use serde_json::{Value, json};

use crate::json::dead_letter as json_line;
use crate::{App, unavailable};

/// How many dead letters the page shows of a queue: the newest.
pub(crate) const SHOWN: u32 = 100;

/// A refusal: its status and a line saying why, as JSON `{"error": ...}`.
pub(crate) fn refuse(status: StatusCode, line: String) -> Response {
    (status, Json(json!({ "error": line }))).into_response()
}

impl<DB: Db> App<DB> {
    /// The queue `name`, if this dashboard shows it: a name the library accepts
    /// (`QueueTable`), among those named on the command line if any were, deployed.
    pub(crate) async fn shown_queue(&self, name: &str) -> Result<Queue<DB>, Response> {
        let queue = self.broker.queue(name).map_err(|e| refuse(StatusCode::BAD_REQUEST, self.say(&e)))?;
        let named = |given: &String| self.broker.queue(given).is_ok_and(|q| q.table() == queue.table());
        if !self.tables.is_empty() && !self.tables.iter().any(named) {
            return Err(refuse(
                StatusCode::NOT_FOUND,
                format!("`{}` is not one of the queues this dashboard was started with", queue.table()),
            ));
        }
        match queue.is_deployed().await {
            Ok(true) => Ok(queue),
            Ok(false) => Err(refuse(StatusCode::NOT_FOUND, format!("no queue table `{}`", queue.table()))),
            Err(e) => Err(unavailable(self.say(&e), true)),
        }
    }
}

/// `GET /api/queues/{queue}/dead`: the queue's newest [`SHOWN`] dead letters, newest
/// first, as `rowbus dead list --json` has them: `{"queue", "limit", "dead_letters": [...]}`.
pub(crate) async fn list<DB: Db>(State(app): State<App<DB>>, Path(name): Path<String>) -> Response {
    let queue = match app.shown_queue(&name).await {
        Ok(queue) => queue,
        Err(refusal) => return refusal,
    };
    let page = DeadLetterPage { limit: SHOWN, ..DeadLetterPage::default() };
    match queue.dead_letters(&page).await {
        Ok(letters) => {
            let letters: Vec<Value> = letters.iter().map(json_line).collect();
            let body = json!({ "queue": queue.table().channel(), "limit": SHOWN, "dead_letters": letters });
            (StatusCode::OK, [(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
        }
        Err(e) => unavailable(app.say(&e), true),
    }
}

/// Which dead letters an operation's body names: `{"all": true}` or `{"ids": [ID, ...]}`
/// (whole numbers from 1), not both.
fn selection(body: &Value) -> Result<DeadLetters, String> {
    let object = body.as_object().ok_or("the body must be a JSON object")?;
    if let Some(unknown) = object.keys().find(|k| !matches!(k.as_str(), "all" | "ids")) {
        return Err(format!("unknown field {unknown:?}: give \"all\": true or \"ids\": [...]"));
    }
    let all = match object.get("all") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err("\"all\" must be true or false".to_owned()),
    };
    let ids = match object.get("ids") {
        None => Vec::new(),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|id| {
                id.as_i64().filter(|id| *id >= 1).ok_or_else(|| {
                    format!("the id {id} is not a whole number from 1 to {} (ids are row ids)", i64::MAX)
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("\"ids\" must be an array of integers".to_owned()),
    };
    match (all, ids.is_empty()) {
        (true, true) => Ok(DeadLetters::All),
        (false, false) => Ok(DeadLetters::Ids(ids)),
        (true, false) => Err("give \"all\": true or \"ids\", not both".to_owned()),
        (false, true) => Err("name the dead letters: \"ids\": [...] or \"all\": true".to_owned()),
    }
}

/// An operation on `name`'s dead letters named by `body`: `{"<done>": how many}`.
async fn operate<DB: Db>(
    app: &App<DB>,
    name: &str,
    body: &Value,
    done: &str,
    run: impl AsyncFnOnce(&Queue<DB>, &DeadLetters) -> Result<u64, rowbus::Error>,
) -> Response {
    let which = match selection(body) {
        Ok(which) => which,
        Err(line) => return refuse(StatusCode::BAD_REQUEST, line),
    };
    let queue = match app.shown_queue(name).await {
        Ok(queue) => queue,
        Err(refusal) => return refusal,
    };
    match run(&queue, &which).await {
        Ok(n) => Json(json!({ done: n })).into_response(),
        Err(e) => unavailable(app.say(&e), true),
    }
}

/// `POST /api/ops/queues/{queue}/dead/requeue`: puts the dead letters back, claimable at
/// once; `{"requeued": N}`.
pub(crate) async fn requeue<DB: Db>(
    State(app): State<App<DB>>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    operate(&app, &name, &body, "requeued", async |queue, which| {
        queue.requeue_dead(which, Duration::ZERO).await
    })
    .await
}

/// `POST /api/ops/queues/{queue}/dead/purge`: deletes the dead letters; `{"purged": N}`.
pub(crate) async fn purge<DB: Db>(
    State(app): State<App<DB>>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    operate(&app, &name, &body, "purged", async |queue, which| queue.purge_dead(which).await).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `all` or `ids` (whole numbers from 1), one of them; anything else is refused with why.
    #[test]
    fn selections() {
        assert_eq!(selection(&json!({ "all": true })), Ok(DeadLetters::All));
        assert_eq!(selection(&json!({ "ids": [3, 1] })), Ok(DeadLetters::Ids(vec![3, 1])));
        assert_eq!(selection(&json!({ "all": false, "ids": [7] })), Ok(DeadLetters::Ids(vec![7])));
        for bad in [
            json!({}),
            json!([1]),
            json!({ "ids": [] }),
            json!({ "all": true, "ids": [1] }),
            json!({ "ids": ["1"] }),
            json!({ "ids": [1.5] }),
            json!({ "ids": [3, -1] }),
            json!({ "ids": [0] }),
            json!({ "ids": [1e20] }),
            json!({ "ids": 1 }),
            json!({ "all": "yes" }),
            json!({ "all": true, "older_than": 5 }),
        ] {
            assert!(selection(&bad).is_err(), "{bad} accepted");
        }
    }
}
