//! `rowbus publish TABLE [--group G] [--delay D] [--priority N] [--key K] [--dedup ID]
//! [--header k=v]... PAYLOAD|-`.

use std::io::BufRead;
use std::time::Duration;

use clap::Args;
use rowbus::sqlx::Pool;
use rowbus::{Broker, BrokerOptions, Db, Message, NotifyConfig};
use tokio::sync::mpsc;

use crate::cli_error::CliError;
use crate::queue_cmd::{self, duration, outln, positive_duration};

/// Most messages one `publish_batch` carries when reading stdin.
const BATCH: usize = 1000;

/// Options of `rowbus publish`.
#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    /// The queue table (create it with `rowbus deploy --queue TABLE`)
    pub(crate) table: String,
    /// The group to publish in [default: the default group]
    #[arg(long, value_name = "G", default_value = "", hide_default_value = true)]
    group: String,
    /// Wait before the message can be claimed, e.g. 250ms, 2s, 1m (plain seconds too)
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    delay: Option<Duration>,
    /// How long a consumer may handle the message, e.g. 30s, 5m: past it the handler is
    /// stopped (an --exec command gets SIGTERM, then SIGKILL after the consumer's --grace)
    /// and the attempt fails with "timed out after ..." (retried, then dead-lettered)
    #[arg(long, value_name = "DURATION", value_parser = positive_duration)]
    timeout: Option<Duration>,
    /// Priority: lower is handled sooner, negative allowed
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true)]
    priority: i16,
    /// Ordering key: messages of one key are handled one at a time, in publish order
    #[arg(long, value_name = "K")]
    key: Option<String>,
    /// Deduplication id: nothing is published while a message with this id is in the queue
    #[arg(long, value_name = "ID")]
    dedup: Option<String>,
    /// A header, `name=value` (repeatable, each name once: a name given twice is refused)
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = header)]
    headers: Vec<(String, String)>,
    /// The payload; `-` publishes each line of stdin as one message, in batches (Ctrl-C or
    /// SIGTERM stops between batches: it says what was published and exits with status 1)
    payload: String,
    /// With `-`: publish empty lines too (skipped by default)
    #[arg(long)]
    keep_empty: bool,
    /// Print a JSON line per message instead: {"id": N} for one stored (the id `rowbus
    /// cancel --id` takes), {"id": null, "duplicate": "ID"} for one a --dedup id kept out.
    /// Each message then goes in a statement of its own
    #[arg(long)]
    json: bool,
}

/// Publishes the payload, or stdin's lines; prints how many were published. Wakes
/// consumers in other processes that run with `--listen-notify` (through `pg_notify` on
/// PostgreSQL, through the notify table elsewhere when it is deployed).
pub(crate) async fn publish<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    args: PublishArgs,
) -> Result<(), CliError> {
    let notify_table = queue_cmd::broker_notify_config(config);
    let listen_url = crate::listen_url(url);
    let notify_ready =
        Broker::new(pool.clone(), BrokerOptions::default()).await?.notify_ready(&notify_table).await?;
    let listen_notify = notify_ready && listen_url.is_some();
    if notify_ready && !listen_notify {
        crate::warn_no_wake_ups();
    }
    if !notify_ready {
        eprintln!(
            "rowbus: warning: the notify table `{}` does not exist: consumers in other processes are not \
             woken, they find the message at their next poll (create it with `rowbus deploy`)",
            notify_table.table
        );
    }
    let options = BrokerOptions { listen_notify, notify_table, listen_url, ..BrokerOptions::default() };
    let broker = Broker::new(pool, options).await?;
    let result = publish_with(&broker, url, args).await;
    broker.shutdown(Duration::ZERO).await;
    result
}

impl PublishArgs {
    /// What the flags say together, checked before connecting: each header name once,
    /// `--dedup` of one message.
    pub(crate) fn check(&self) -> Result<(), CliError> {
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &self.headers {
            if !seen.insert(name.as_str()) {
                return Err(CliError::Message(format!(
                    "--header {name:?} is given twice: a message holds one value per header name (give each \
                     name once)"
                )));
            }
        }
        if self.payload == "-" && self.dedup.is_some() {
            return Err(CliError::Message(
                "--dedup names one message: with `-` every line would carry the same id (publish lines one by \
                 one to give each its own)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// A published message's JSON line: its id, or none and the dedup id that kept it out.
fn id_line(id: Option<i64>, dedup: Option<&str>) -> serde_json::Value {
    match id {
        Some(id) => serde_json::json!({ "id": id }),
        None => serde_json::json!({ "id": null, "duplicate": dedup }),
    }
}

/// `name=value`.
fn header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not NAME=VALUE (e.g. --header trace=abc)")),
    }
}

/// Publishes on `broker`'s queue `args.table`.
async fn publish_with<DB: Db>(broker: &Broker<DB>, url: &str, args: PublishArgs) -> Result<(), CliError> {
    args.check()?;
    let queue = queue_cmd::existing_queue(broker, &args.table, url).await?;
    let message = |payload: Vec<u8>| {
        let mut m = Message::new(payload).group(args.group.clone()).priority(args.priority);
        if let Some(delay) = args.delay {
            m = m.delay(delay);
        }
        if let Some(key) = &args.key {
            m = m.key(key.clone());
        }
        if let Some(timeout) = args.timeout {
            m = m.timeout(timeout);
        }
        if let Some(id) = &args.dedup {
            m = m.dedup_id(id.clone());
        }
        for (name, value) in &args.headers {
            m = m.header(name.clone(), value.clone());
        }
        m
    };
    if args.payload != "-" && args.json {
        let id = queue.publish_with_id(message(args.payload.clone().into_bytes())).await?;
        outln!("{}", id_line(id, args.dedup.as_deref()));
        return Ok(());
    }
    if args.payload != "-" {
        let done = queue.publish(message(args.payload.clone().into_bytes())).await?;
        match done.duplicates.first() {
            Some(id) => outln!(
                "duplicate: a message with dedup id {id:?} is in `{}`; nothing published",
                queue.table()
            ),
            None => outln!("published 1 message to `{}`", queue.table()),
        }
        return Ok(());
    }

    let limit = queue.max_message_bytes().await?;
    let mut lines = stdin_lines();
    let mut interrupted = std::pin::pin!(crate::interrupted());
    let mut published = Published { messages: 0, lines: 0, table: queue.table().to_string() };
    let mut stopped = false;
    let mut refused = None;
    loop {
        // A batch is published whole: Ctrl-C stops between batches.
        let first = tokio::select! {
            _ = &mut interrupted => { stopped = true; break }
            line = lines.recv() => line,
        };
        let Some(first) = first else { break };
        let mut batch = Vec::new();
        let mut next = Some(first);
        let mut read = 0;
        while let Some(line) = next.take() {
            let line = line.map_err(|e| published.failed(e))?;
            if line.len() as u64 > limit {
                // Everything before it goes; nothing from it on is read.
                refused = Some((published.lines + read + 1, line.len()));
                break;
            }
            read += 1;
            if args.keep_empty || !line.is_empty() {
                batch.push(message(line));
            }
            if batch.len() < BATCH {
                next = lines.try_recv().ok();
            }
        }
        if args.json {
            // One statement each, to learn each id (stdin's lines carry no dedup id).
            for m in batch {
                let id = queue.publish_with_id(m).await.map_err(|e| published.failed(e.into()))?;
                published.messages += u64::from(id.is_some());
                outln!("{}", id_line(id, None));
            }
        } else {
            let n = queue.publish_batch(batch).await.map_err(|e| published.failed(e.into()))?;
            published.messages += n.stored;
        }
        published.lines += read;
        if let Some((line, bytes)) = refused {
            return Err(published.failed(CliError::Message(format!(
                "line {line} is {bytes} bytes, over the {limit}-byte limit of a message on this database \
                 (on MySQL/MariaDB, its max_allowed_packet): nothing from it on was published"
            ))));
        }
    }
    if stopped {
        // Not the end of the input: a script must not take it for a complete run.
        return Err(CliError::Message(format!(
            "interrupted: published {} from the first {} lines of stdin; the rest was not published",
            published.said(),
            published.lines
        )));
    }
    if !args.json {
        outln!("published {}", published.said());
    }
    Ok(())
}

/// What `publish -` has committed so far.
struct Published {
    messages: u64,
    /// Lines of stdin read and published (or skipped, when empty).
    lines: u64,
    table: String,
}

impl Published {
    /// `3 messages to `jobs``.
    fn said(&self) -> String {
        let s = if self.messages == 1 { "" } else { "s" };
        format!("{} message{s} to `{}`", self.messages, self.table)
    }

    /// `error`, saying exactly what was published before it.
    fn failed(&self, error: CliError) -> CliError {
        CliError::Message(format!(
            "{}; published {} from the first {} lines of stdin before this",
            error.line(),
            self.said(),
            self.lines
        ))
    }
}

/// Stdin's lines (bytes, without the line end), read on a thread of their own.
fn stdin_lines() -> mpsc::Receiver<Result<Vec<u8>, CliError>> {
    let (tx, rx) = mpsc::channel(4 * BATCH);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        loop {
            let mut line = Vec::new();
            match stdin.read_until(b'\n', &mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if line.last() == Some(&b'\n') {
                        line.pop();
                        if line.last() == Some(&b'\r') {
                            line.pop();
                        }
                    }
                    if tx.blocking_send(Ok(line)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(CliError::Message(format!("cannot read stdin: {e}"))));
                    return;
                }
            }
        }
    });
    rx
}
