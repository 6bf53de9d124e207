//! What the queue commands (`deploy --queue`, `publish`, `consume`, `stats`, `demo`) share:
//! names, the broker's options, finding a queue table, output.

use std::time::Duration;

use rowbus::duration::DurationRange;
use rowbus::{Broker, BrokerOptions, Db, DbPool, DeployOptions, NotifyConfig, Queue, QueueTable, redact};

use crate::cli_error::CliError;

/// Writes `text` and a line end to stdout; a closed pipe (`| head`) stops the command
/// quietly ([`CliError::OutputClosed`]), any other failure is an error, never a panic.
pub(crate) fn out(text: &str) -> Result<(), CliError> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}").and_then(|()| stdout.flush()).map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe => CliError::OutputClosed,
        _ => CliError::Message(format!("cannot write to stdout: {e}")),
    })
}

/// `println!` through [`out`]: returns its error from the enclosing function.
macro_rules! outln {
    () => {
        $crate::queue_cmd::out("")?
    };
    ($($arg:tt)*) => {
        $crate::queue_cmd::out(&format!($($arg)*))?
    };
}
pub(crate) use outln;

/// `text` as it is, but for what would break its line or the terminal: line feeds and
/// carriage returns written `\n` and `\r`, other control characters (tabs aside) `\u{1b}`.
/// What `listen` and `consume` print a payload as.
pub(crate) fn on_one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\t' => out.push(c),
            c if c.is_control() => out.extend(c.escape_debug()),
            c => out.push(c),
        }
    }
    out
}

/// [`on_one_line`] of bytes: the UTF-8 in them as text, each byte that is not `\xNN`.
pub(crate) fn bytes_on_one_line(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(&on_one_line(chunk.valid()));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

pub(crate) use rowbus_ui::json::payload as json_payload;

/// A group in plain text: `-` for the default group (`""`, as JSON keeps it).
pub(crate) fn group_text(group: &str) -> String {
    if group.is_empty() { "-".to_owned() } else { group.escape_debug().to_string() }
}

/// A group in the lines of `history` and `dead list`, whose strings are quoted: `-` for the
/// default group, `"G"` for another.
pub(crate) fn group_quoted(group: &str) -> String {
    if group.is_empty() { "-".to_owned() } else { format!("{group:?}") }
}

/// A duration flag's value as clap parses it: `250ms`, `2s`, `1m`, `1h`, `7d` or plain seconds
/// ([`rowbus::duration::parse_duration`]), at most [`rowbus::limits::MAX_DURATION`], so that the server is
/// never asked to add more to its clock than it can hold.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    duration_in(text, DurationRange::Span)
}

/// Like [`duration`], greater than 0: a lease, a benchmark's length.
pub(crate) fn positive_duration(text: &str) -> Result<Duration, String> {
    duration_in(text, DurationRange::Positive)
}

fn duration_in(text: &str, range: DurationRange) -> Result<Duration, String> {
    let parsed = rowbus::duration::parse_duration(text).map_err(|e| e.to_string())?;
    if range.contains(parsed) { Ok(parsed) } else { Err(range.rule().to_owned()) }
}

/// Checks each name is a queue table name rowbus accepts (before connecting).
pub(crate) fn parse_tables(names: &[String]) -> Result<Vec<QueueTable>, CliError> {
    names.iter().map(|name| name.parse::<QueueTable>().map_err(CliError::from)).collect()
}

/// The notify table the broker wakes through with `listen_notify`: the flags' table, and
/// their poll interval when one was given; otherwise the broker's fast default (50 ms).
pub(crate) fn broker_notify_config(config: &NotifyConfig) -> NotifyConfig {
    let mut notify = config.clone();
    if config.poll_interval == NotifyConfig::DEFAULT_POLL_INTERVAL {
        notify.poll_interval = BrokerOptions::default().notify_table.poll_interval;
    }
    notify
}

/// `duration` for people: `850ms`, `12.3s`, `4m 05s`, `2h 03m`, `3d 04h`.
pub(crate) fn human(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0 => format!("{}ms", duration.as_millis()),
        1..60 => format!("{:.1}s", duration.as_secs_f64()),
        60..3600 => format!("{}m {:02}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h {:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d {:02}h", secs / 86400, secs % 86400 / 3600),
    }
}

/// `n` with thousands separators: `12,345`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The error for a queue table that is not there.
pub(crate) fn missing_table(table: &QueueTable, url: &str) -> CliError {
    CliError::Message(format!(
        "queue table `{table}` does not exist in {}: create it with `rowbus deploy --queue {table}`",
        redact(url)
    ))
}

/// The queue `name` of `broker`, checked: a valid name for this database, and a table
/// that exists with the queue columns (the library's error names those another table
/// lacks).
pub(crate) async fn existing_queue<DB: Db>(
    broker: &Broker<DB>,
    name: &str,
    url: &str,
) -> Result<Queue<DB>, CliError> {
    let queue = broker.queue(name)?;
    if queue.is_deployed().await? { Ok(queue) } else { Err(missing_table(queue.table(), url)) }
}

/// `rowbus deploy [--queue T...]`: the notify table (on PostgreSQL with `--durable`), then each
/// queue table, its claim index and its dead-letter table; one line each. Every name is
/// checked for this database, and refused where another table has it, before anything is
/// created (each queue's deploy checks again under its lock).
/// `rowbus deploy`'s flags beside its queues.
pub(crate) struct DeployFlags {
    pub keep: Option<Duration>,
    pub durable: bool,
    pub create_schema: bool,
}

pub(crate) async fn deploy<DB: Db>(
    db: &DbPool,
    pool: rowbus::sqlx::Pool<DB>,
    config: &NotifyConfig,
    tables: &[QueueTable],
    DeployFlags { keep, durable, create_schema }: DeployFlags,
) -> Result<(), CliError> {
    let broker = Broker::new(pool, BrokerOptions::default()).await?;
    let queues = tables.iter().map(|t| broker.queue(t.channel())).collect::<Result<Vec<_>, _>>()?;
    for queue in &queues {
        queue.is_deployed().await?;
    }
    let notify = if durable {
        db.deploy_durable_notify_table(config).await?
    } else {
        db.deploy_notify_table(config).await?
    };
    match notify {
        // On PostgreSQL: true words for what is there and what this run does.
        rowbus::NotifyDeploy::Native => {
            let durable_table = match broker.notify_table_stats(config).await {
                Ok(stats) => stats.is_some(),
                Err(e) if e.is_permission_denied() => true,
                Err(e) => return Err(e.into()),
            };
            outln!("{}", native_line(&config.table, durable_table, !tables.is_empty()))
        }
        ready => outln!("{ready}"),
    }
    for queue in queues {
        let table = queue.table();
        let mut options = DeployOptions::default().create_schema(create_schema);
        options.keep = keep;
        queue.deploy_with(&options).await.map_err(|e| match e {
            rowbus::Error::MissingSchema { schema } => CliError::Message(format!(
                "the schema `{schema}` does not exist: check the name in `--queue {table}`, or add \
                 `--create-schema` to create it"
            )),
            other => other.into(),
        })?;
        outln!("queue table `{table}` is ready (dead letters go to `{table}_dead`)");
        match keep {
            Some(Duration::ZERO) => {
                outln!("`{table}` keeps no history (consumers delete what `{table}_hist` kept)")
            }
            Some(keep) => outln!("`{table}` keeps handled messages in `{table}_hist` for {}", human(keep)),
            None => {}
        }
    }
    Ok(())
}

/// What `deploy` says of the notify table on PostgreSQL: none is needed there, unless for
/// durable listeners (`durable_table`: one `deploy --durable` made is there); and nothing
/// else to do only when no queue is deployed (`queues`).
fn native_line(table: &str, durable_table: bool, queues: bool) -> String {
    let builtin = "PostgreSQL has LISTEN/NOTIFY built in";
    match (durable_table, queues) {
        (true, _) => format!(
            "{builtin}; the notify table `{table}` of durable listeners is there (made by `rowbus deploy --durable`)"
        ),
        (false, true) => format!(
            "{builtin}: no notify table needed (durable listeners need one: `rowbus deploy --durable`)"
        ),
        (false, false) => format!(
            "{builtin}: no notify table needed, nothing to do (durable listeners need one: `rowbus deploy --durable`)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_with_units_within_their_range() {
        assert_eq!(duration("0.05"), Ok(Duration::from_millis(50)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert_eq!(duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(duration("1.5d"), Ok(Duration::from_secs(36 * 3600)));
        assert!(duration("99999999d").unwrap_err().contains("at most 100 years"));
        assert_eq!(positive_duration("4s"), Ok(Duration::from_secs(4)));
        assert_eq!(positive_duration("0"), Err("must be greater than 0 and at most 100 years".to_owned()));
        assert_eq!(duration("1000000000000"), Err("must be at most 100 years".to_owned()));
        for text in ["-1", "soon", "1e12", "NaN", "inf"] {
            let err = duration(text).unwrap_err();
            assert!(err.starts_with(&format!("`{text}` is not a duration")), "{err}");
        }
    }

    #[test]
    fn payload_lines_keep_the_text_but_line_breaks_and_controls() {
        assert_eq!(on_one_line("a \"q\" \\ b\tc: é ✓"), "a \"q\" \\ b\tc: é ✓");
        assert_eq!(on_one_line("one\ntwo\r\u{1b}[0m"), "one\\ntwo\\r\\u{1b}[0m");
        assert_eq!(bytes_on_one_line(b"\xffok\n\"x\""), "\\xffok\\n\"x\"");
        let mut line = serde_json::json!({});
        json_payload(&mut line, b"\xff\x00");
        assert_eq!(line, serde_json::json!({"payload": null, "payload_hex": "ff00"}));
        json_payload(&mut line, b"ok");
        assert_eq!(line["payload"], "ok");
        assert_eq!((group_text(""), group_text("g\n")), ("-".to_owned(), "g\\n".to_owned()));
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(human(Duration::from_secs(245)), "4m 05s");
        assert_eq!(human(Duration::from_secs(7380)), "2h 03m");
        assert_eq!(human(Duration::from_secs(3 * 86400 + 4 * 3600)), "3d 04h");
    }

    #[test]
    fn separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
