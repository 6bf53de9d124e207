//! The dashboard's view of a queue's messages: `GET /api/queues/{queue}/messages` lists a
//! page of those in the queue table (queued, delayed, in flight, retrying), lowest id
//! first, `?after=ID` for the page after the one that ended with `next`, `&limit=N`.
//! `POST /api/ops/queues/{queue}/cancel` with `{"ids": [...]}` cancels some of them
//! (behind the token, as the dead letters' operations are): a running one's handler is
//! told to stop, in whichever process runs it.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use rowbus::{Db, MessagePage};
use serde_json::{Value, json};

use crate::dead::refuse;
use crate::{App, unavailable};

/// How many messages a page shows unless the request says.
pub(crate) const PAGE: u32 = 50;

/// The page a query string asks for: `after=ID` (a whole number from 0) and `limit=N`
/// (1 to [`rowbus::limits::MAX_MESSAGE_PAGE`]), both optional, nothing else.
fn page(query: Option<&str>) -> Result<MessagePage, String> {
    let mut page = MessagePage::default().limit(PAGE);
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "after" => match value.parse::<i64>() {
                Ok(id) if id >= 0 => page = page.after(id),
                _ => return Err(format!("after={value:?} is not a whole number from 0 to {}", i64::MAX)),
            },
            "limit" => match value.parse::<u32>() {
                Ok(n @ 1..=rowbus::limits::MAX_MESSAGE_PAGE) => page = page.limit(n),
                _ => {
                    return Err(format!(
                        "limit={value:?} is not a whole number from 1 to {}",
                        rowbus::limits::MAX_MESSAGE_PAGE
                    ));
                }
            },
            _ => return Err(format!("unknown parameter {name:?}: give after=ID and limit=N")),
        }
    }
    Ok(page)
}

/// `GET /api/queues/{queue}/messages`: `{"queue", "limit", "after", "messages": [...],
/// "next": ID or null}`.
pub(crate) async fn list<DB: Db>(
    State(app): State<App<DB>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let page = match page(query.as_deref()) {
        Ok(page) => page,
        Err(line) => return refuse(StatusCode::BAD_REQUEST, line),
    };
    let queue = match app.shown_queue(&name).await {
        Ok(queue) => queue,
        Err(refusal) => return refusal,
    };
    match queue.messages(&page).await {
        Ok(found) => {
            let messages: Vec<Value> = found.messages.iter().map(crate::json::message).collect();
            let body = json!({
                "queue": queue.table().channel(),
                "limit": page.limit,
                "after": page.after_id,
                "messages": messages,
                "next": found.next,
            });
            (StatusCode::OK, [(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
        }
        Err(e) => unavailable(app.say(&e), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `after` and `limit`, each optional and in range; anything else is refused with why.
    #[test]
    fn pages() {
        assert_eq!(page(None), Ok(MessagePage::default().limit(PAGE)));
        assert_eq!(page(Some("after=42&limit=7")), Ok(MessagePage::default().after(42).limit(7)));
        assert_eq!(page(Some("limit=1000")), Ok(MessagePage::default().limit(1000)));
        for bad in ["after=-1", "after=x", "limit=0", "limit=1001", "limit=", "group=a", "after=1e3"] {
            assert!(page(Some(bad)).is_err(), "{bad} accepted");
        }
    }
}

/// `POST /api/ops/queues/{queue}/cancel`: cancels the messages `{"ids": [ID, ...]}` names
/// (whole numbers from 1; ids no longer in the queue are passed over); `{"cancelled": N,
/// "running": M}`, M of them running when cancelled.
pub(crate) async fn cancel<DB: Db>(
    State(app): State<App<DB>>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let ids = match cancel_ids(&body) {
        Ok(ids) => ids,
        Err(line) => return refuse(StatusCode::BAD_REQUEST, line),
    };
    let queue = match app.shown_queue(&name).await {
        Ok(queue) => queue,
        Err(refusal) => return refusal,
    };
    match queue.cancel(&ids).await {
        Ok(done) => Json(json!({ "cancelled": done.count(), "running": done.running.len() })).into_response(),
        Err(e) => unavailable(app.say(&e), true),
    }
}

/// The ids a cancel's body names: `{"ids": [ID, ...]}`, at least one, each from 1.
fn cancel_ids(body: &Value) -> Result<Vec<i64>, String> {
    let object = body.as_object().ok_or("the body must be a JSON object")?;
    if let Some(unknown) = object.keys().find(|k| k.as_str() != "ids") {
        return Err(format!("unknown field {unknown:?}: give \"ids\": [...]"));
    }
    let Some(Value::Array(ids)) = object.get("ids") else {
        return Err("name the messages: \"ids\": [...]".to_owned());
    };
    if ids.is_empty() {
        return Err("name the messages: \"ids\" is empty".to_owned());
    }
    ids.iter()
        .map(|id| {
            id.as_i64().filter(|id| *id >= 1).ok_or_else(|| {
                format!("the id {id} is not a whole number from 1 to {} (ids are row ids)", i64::MAX)
            })
        })
        .collect()
}

#[cfg(test)]
mod cancel_tests {
    use serde_json::json;

    use super::cancel_ids;

    #[test]
    fn a_cancel_names_its_ids() {
        assert_eq!(cancel_ids(&json!({ "ids": [3, 5] })), Ok(vec![3, 5]));
        for refused in
            [json!({}), json!({ "ids": [] }), json!({ "ids": [0] }), json!({ "all": true }), json!([1])]
        {
            assert!(cancel_ids(&refused).is_err(), "{refused}");
        }
    }
}
