//! MySQL/MariaDB: the server's binary log, read as a replica reads it, on a connection of
//! its own (`mysql_async`'s binlog stream; sqlx has none). Every committed transaction
//! reaches the stream when it is written to the log; the notify table's rows in it are
//! what this source reports. It needs `log_bin`, and a user with `REPLICATION SLAVE` and,
//! to read where the log ends, `BINLOG MONITOR` on MariaDB (`REPLICATION CLIENT` on
//! MySQL); without them it is refused, and the listener polls.
//!
//! The stream sends a transaction when it is in the log, which is a moment before InnoDB
//! makes it visible to other sessions: a poll at once may miss it (3 and 11 times in 200
//! commits measured on this project's machine). So the rows are reported with their ids
//! and the session polls again, a few milliseconds later, until it has read them.

use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::EventType;
use mysql_async::binlog::events::{EventData, RowsEventData, TableMapEvent};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts, Value};

use super::task::{Pushed, Refusal, Source};

/// How often the server sends a heartbeat on an idle stream.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A stream silent this long (no event, no heartbeat) is lost.
const SILENT: Duration = Duration::from_secs(4);
/// Error codes that mean the user lacks a privilege.
const DENIED: [u16; 3] = [1045, 1227, 1044];

/// Where to read: one server, and the notify table.
#[derive(Debug, Clone)]
pub struct Target {
    /// A single-host URL, the server the listener's connection went to.
    pub url: String,
    /// The notify table's name.
    pub table: String,
}

/// An open binary-log stream, and the transaction it is in the middle of.
pub struct Binlog {
    stream: BinlogStream,
    database: String,
    table: String,
    /// What the current transaction wrote to the notify table so far.
    pending: Pushed,
    /// Whether a `BEGIN` was read and its commit was not.
    in_transaction: bool,
}

/// `mysql_async`'s options for a single-host URL of sqlx's form: its query parameters are
/// sqlx's, so they are left out (TLS among them: the stream connects without it, and a
/// server that demands it refuses the push path).
fn options(url: &str) -> Result<Opts, String> {
    let url = url.strip_prefix("mariadb:").map_or_else(|| url.to_owned(), |rest| format!("mysql:{rest}"));
    let base = url.split_once('?').map_or(url.as_str(), |(base, _)| base);
    Opts::from_url(base).map_err(|e| format!("the URL does not suit the binlog client: {e}"))
}

/// A server id no other replica of the server is likely to use: a replica connecting with
/// the id of another makes the server drop the other.
fn server_id() -> u32 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    0x8000_0000 | (hasher.finish() as u32 & 0x7fff_fffe)
}

/// The server's error code, where it is one.
fn code(error: &mysql_async::Error) -> Option<u16> {
    match error {
        mysql_async::Error::Server(e) => Some(e.code),
        _ => None,
    }
}

/// A privilege error as a refusal naming `needs`; anything else as a failure.
fn refusal(error: mysql_async::Error, needs: &str) -> Refusal {
    match code(&error) {
        Some(c) if DENIED.contains(&c) => Refusal::Refused(format!("{needs} ({error})")),
        _ => Refusal::Failed(error.to_string()),
    }
}

/// Whether `list`, a comma-separated list of databases (`binlog_do_db`,
/// `binlog_ignore_db`), names `database`.
fn names(list: &str, database: &str) -> bool {
    list.split(',').map(str::trim).any(|d| d.eq_ignore_ascii_case(database))
}

impl Source for Binlog {
    type Target = Target;

    async fn open(target: &Target) -> Result<Self, Refusal> {
        let mut conn = Conn::new(options(&target.url).map_err(Refusal::Refused)?)
            .await
            .map_err(|e| refusal(e, "the server refused the binlog client's connection"))?;
        let (log_bin, database): (i64, Option<String>) = conn
            .query_first("SELECT @@log_bin, DATABASE()")
            .await
            .map_err(|e| Refusal::Failed(e.to_string()))?
            .unwrap_or((0, None));
        if log_bin == 0 {
            return Err(Refusal::Refused("the server writes no binary log (log_bin is off)".into()));
        }
        let database = database.unwrap_or_default();
        let needs_monitor = "the user may not read where the binary log ends: it needs BINLOG MONITOR \
                             on MariaDB, REPLICATION CLIENT on MySQL";
        // MySQL 8.4 knows only the new name; MariaDB and older MySQL the old one.
        let status: Option<(String, u64, String, String)> =
            match conn.query_first("SHOW MASTER STATUS").await {
                Err(e) if code(&e) == Some(1064) => conn.query_first("SHOW BINARY LOG STATUS").await,
                other => other,
            }
            .map_err(|e| refusal(e, needs_monitor))?;
        let Some((file, position, do_db, ignore_db)) = status else {
            return Err(Refusal::Refused(format!("{needs_monitor} (SHOW MASTER STATUS returned nothing)")));
        };
        if (!do_db.is_empty() && !names(&do_db, &database)) || names(&ignore_db, &database) {
            return Err(Refusal::Refused(format!(
                "binlog_do_db / binlog_ignore_db leave the database `{database}` out of the binary log"
            )));
        }
        let heartbeat = format!("SET @master_heartbeat_period = {}", HEARTBEAT.as_nanos());
        conn.query_drop(heartbeat).await.map_err(|e| Refusal::Failed(e.to_string()))?;
        let request = BinlogStreamRequest::new(server_id()).with_filename(file.as_bytes()).with_pos(position);
        let needs_replication = "the user may not read the binary log: it needs REPLICATION SLAVE";
        let mut stream = conn.get_binlog_stream(request).await.map_err(|e| refusal(e, needs_replication))?;
        // The server answers the request with its rotate event, or its refusal.
        match tokio::time::timeout(SILENT, stream.next()).await {
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => return Err(refusal(e, needs_replication)),
            Ok(None) => return Err(Refusal::Failed("the binary log stream ended at once".into())),
            Err(_) => return Err(Refusal::Failed("the binary log stream sent nothing".into())),
        }
        Ok(Binlog {
            stream,
            database,
            table: target.table.clone(),
            pending: Pushed::default(),
            in_transaction: false,
        })
    }

    async fn next(&mut self) -> Result<Pushed, String> {
        loop {
            let event = match tokio::time::timeout(SILENT, self.stream.next()).await {
                Ok(Some(Ok(event))) => event,
                Ok(Some(Err(e))) => return Err(e.to_string()),
                Ok(None) => return Err("the server ended the binary log stream".into()),
                Err(_) => return Err(format!("no event or heartbeat for {SILENT:?}")),
            };
            let wanted = matches!(
                event.header().event_type(),
                Ok(EventType::QUERY_EVENT
                    | EventType::XID_EVENT
                    | EventType::WRITE_ROWS_EVENT
                    | EventType::WRITE_ROWS_EVENT_V1)
            );
            if !wanted {
                continue;
            }
            let committed = match event.read_data().map_err(|e| e.to_string())? {
                Some(EventData::XidEvent(_)) => true,
                Some(EventData::QueryEvent(query)) => self.query(&query.schema(), &query.query()),
                Some(EventData::RowsEvent(rows)) => {
                    self.rows(&rows);
                    false
                }
                _ => false,
            };
            if committed {
                self.in_transaction = false;
                let pushed = std::mem::take(&mut self.pending);
                if pushed.unknown || !pushed.rows.is_empty() {
                    return Ok(pushed);
                }
            }
        }
    }
}

impl Binlog {
    fn is_notify_table(&self, tme: &TableMapEvent<'_>) -> bool {
        tme.table_name().eq_ignore_ascii_case(&self.table)
            && tme.database_name().eq_ignore_ascii_case(&self.database)
    }

    /// The notify table's rows an insert event wrote: (channel, id) each.
    fn rows(&mut self, rows: &RowsEventData<'_>) {
        let Some(tme) = self.stream.get_tme(rows.table_id()) else { return };
        if !self.is_notify_table(tme) {
            return;
        }
        let iter = match rows {
            RowsEventData::WriteRowsEvent(e) => e.rows(tme),
            RowsEventData::WriteRowsEventV1(e) => e.rows(tme),
            _ => return,
        };
        for row in iter {
            let Ok((_, Some(row))) = row else {
                self.pending.unknown = true;
                continue;
            };
            let id = match row.as_ref(0) {
                Some(BinlogValue::Value(Value::UInt(id))) => Some(*id),
                Some(BinlogValue::Value(Value::Int(id))) => u64::try_from(*id).ok(),
                _ => None,
            };
            let channel = match row.as_ref(1) {
                Some(BinlogValue::Value(Value::Bytes(bytes))) => String::from_utf8(bytes.clone()).ok(),
                _ => None,
            };
            match (id, channel) {
                (Some(id), Some(channel)) => self.pending.rows.push((channel, id)),
                _ => self.pending.unknown = true,
            }
        }
    }

    /// A statement of the log: whether it ends a transaction. In a statement-based log an
    /// INSERT into the notify table is its text: it counts as rows of unknown channels.
    fn query(&mut self, schema: &str, query: &str) -> bool {
        let text = query.trim_start();
        let word = text.split_whitespace().next().unwrap_or("");
        if word.eq_ignore_ascii_case("BEGIN") {
            self.in_transaction = true;
            return false;
        }
        if word.eq_ignore_ascii_case("COMMIT") || word.eq_ignore_ascii_case("XA") {
            return true;
        }
        let names_table = text.to_ascii_lowercase().contains(&self.table.to_ascii_lowercase());
        if names_table
            && (schema.is_empty() || schema.eq_ignore_ascii_case(&self.database) || text.contains('.'))
        {
            self.pending.unknown = true;
        }
        // A statement outside a transaction (DDL, a non-transactional table) is its own.
        !self.in_transaction
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlx_urls_become_binlog_client_options() {
        let opts = options("mariadb://root:p%40ss@127.0.0.1:3361/test?ssl-mode=disabled").unwrap();
        assert_eq!(opts.ip_or_hostname(), "127.0.0.1");
        assert_eq!(opts.tcp_port(), 3361);
        assert_eq!(opts.user(), Some("root"));
        assert_eq!(opts.pass(), Some("p@ss"));
        assert_eq!(opts.db_name(), Some("test"));
    }

    #[test]
    fn server_ids_stay_clear_of_ordinary_replicas() {
        assert!(server_id() >= 0x8000_0000);
        assert_ne!(server_id(), u32::MAX);
    }

    #[test]
    fn binlog_filters_are_read_as_lists() {
        assert!(names("a, Test ,b", "test"));
        assert!(!names("", "test"));
        assert!(!names("tests", "test"));
    }
}
