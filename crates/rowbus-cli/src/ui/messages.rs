//! The dashboard's view of a queue's messages: `GET /api/queues/{queue}/messages` lists a
//! page of those in the queue table (queued, delayed, in flight, retrying), lowest id
//! first, `?after=ID` for the page after the one that ended with `next`, `&limit=N`.
//! Read-only: operations on them would live under `/api/ops/`, behind the token, as the
//! dead letters' do.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use rowbus::{Db, MessagePage, QueuedMessage};
use serde_json::{Value, json};

use super::dead::refuse;
use super::{App, unavailable};
use crate::dead_cmd::rfc3339;
use crate::queue_cmd;

/// How many messages a page shows unless the request says.
pub(super) const PAGE: u32 = 50;

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

/// One message as JSON: its id, group, key, priority, attempts, state, when it is
/// claimable or how long its lease has left, publish time, last error and payload (as
/// text, or null with `payload_hex`).
pub(super) fn json_message(m: &QueuedMessage) -> Value {
    let mut line = json!({
        "id": m.id,
        "group": m.group,
        "key": m.key,
        "priority": m.priority,
        "attempts": m.attempts,
        "state": m.state.as_str(),
        "visible_in_s": m.visible_in.as_secs_f64(),
        "lease_left_s": m.lease_left.map(|d| d.as_secs_f64()),
        "published_at": rfc3339(m.published_at),
        "last_error": m.last_error,
    });
    queue_cmd::json_payload(&mut line, &m.payload);
    line
}

/// `GET /api/queues/{queue}/messages`: `{"queue", "limit", "after", "messages": [...],
/// "next": ID or null}`.
pub(super) async fn list<DB: Db>(
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
            let messages: Vec<Value> = found.messages.iter().map(json_message).collect();
            let body = json!({
                "queue": queue.table().channel(),
                "limit": page.limit,
                "after": page.after_id,
                "messages": messages,
                "next": found.next,
            });
            (StatusCode::OK, [(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
        }
        Err(e) => unavailable(&e.into(), true),
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
