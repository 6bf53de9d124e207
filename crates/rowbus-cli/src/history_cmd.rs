//! `rowbus history QUEUE`: the handled messages a queue deployed with `--keep` keeps,
//! newest first.

use clap::Args;
use rowbus::history::{HistoryEntry, HistoryPage};
use rowbus::sqlx::Pool;
use rowbus::{Broker, BrokerOptions, Db};
use serde_json::json;

use crate::cli_error::CliError;
use crate::dead_cmd::rfc3339;
use crate::queue_cmd::{self, outln};

/// Options of `rowbus history`.
#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// The queue table (its history is in `<TABLE>_hist`)
    pub(crate) table: String,
    /// Only this group's messages (`--group ""`: the default group, which the lines show as
    /// `group -` and JSON as "")
    #[arg(long, value_name = "G")]
    group: Option<String>,
    /// Print at most this many
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: u32,
    /// Skip this many newer ones first (the pages before)
    #[arg(long, value_name = "N", default_value_t = 0)]
    offset: u64,
    /// Print JSON lines {"id", "group", "payload", "attempts", "outcome", "last_error",
    /// "published_at", "handled_at"}: outcome "acked", "dropped", "dead" or "cancelled"; times in
    /// RFC 3339 (UTC, microseconds); a payload that is not UTF-8 is null, with its bytes in
    /// "payload_hex"
    #[arg(long)]
    json: bool,
}

/// Prints a page of the queue's history, one line each.
pub(crate) async fn history<DB: Db>(pool: Pool<DB>, url: &str, args: HistoryArgs) -> Result<(), CliError> {
    let broker = Broker::new(pool, BrokerOptions::default()).await?;
    let queue = queue_cmd::existing_queue(&broker, &args.table, url).await?;
    if queue.keep().await?.is_none() {
        // Said before whatever is left from when it kept: an empty answer is not "nothing
        // was handled".
        let table = queue.table();
        eprintln!(
            "rowbus: `{table}` keeps no history (what it kept before is deleted as consumers run): turn it on \
             with `rowbus deploy --queue {table} --keep DURATION`, e.g. --keep 7d"
        );
    }
    let page = HistoryPage { group: args.group, limit: args.limit, offset: args.offset };
    for entry in queue.history(&page).await? {
        match args.json {
            true => outln!("{}", json_line(&entry)),
            false => outln!("{}", text_line(&entry)),
        }
    }
    Ok(())
}

/// One entry for people: its strings quoted and escaped, so that it stays on one line.
fn text_line(entry: &HistoryEntry) -> String {
    let payload = match std::str::from_utf8(&entry.payload) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("<{} bytes, not UTF-8>", entry.payload.len()),
    };
    format!(
        "id {}  {}  group {}  attempts {}  handled {}  published {}  error {}  payload {payload}",
        entry.id,
        entry.outcome.as_str(),
        queue_cmd::group_quoted(&entry.group),
        entry.attempts,
        rfc3339(entry.handled_at),
        rfc3339(entry.published_at),
        entry.last_error.as_deref().map_or_else(|| "-".to_owned(), |e| format!("{e:?}")),
    )
}

/// One entry as a JSON line.
fn json_line(entry: &HistoryEntry) -> serde_json::Value {
    let mut line = json!({
        "id": entry.id,
        "group": entry.group,
        "attempts": entry.attempts,
        "outcome": entry.outcome.as_str(),
        "last_error": entry.last_error,
        "published_at": rfc3339(entry.published_at),
        "handled_at": rfc3339(entry.handled_at),
    });
    queue_cmd::json_payload(&mut line, &entry.payload);
    line
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use rowbus::history::HistoryOutcome;

    use super::*;

    #[test]
    fn lines_say_the_outcome_and_stay_one_line() {
        let mut entry = HistoryEntry::default();
        entry.id = 7;
        entry.group = "g".into();
        entry.payload = vec![0xff];
        entry.attempts = 2;
        entry.outcome = HistoryOutcome::DeadLettered;
        entry.last_error = Some("boom\nagain".into());
        entry.published_at = SystemTime::UNIX_EPOCH;
        entry.handled_at = SystemTime::UNIX_EPOCH;
        let text = text_line(&entry);
        assert!(!text.contains('\n') && text.contains("  dead  ") && text.contains("<1 bytes"), "{text}");
        let line = json_line(&entry);
        assert_eq!((line["outcome"].clone(), line["payload_hex"].clone()), (json!("dead"), json!("ff")));
        assert_eq!(line["handled_at"], "1970-01-01T00:00:00.000000Z");
    }
}
