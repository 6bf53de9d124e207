//! `rowbus dead list|requeue|purge QUEUE`: a queue's dead letters, read, put back or
//! deleted.

use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};
use rowbus::dead::{DeadLetter, DeadLetterPage, DeadLetters};
use rowbus::sqlx::Pool;
use rowbus::{Broker, BrokerOptions, Db, NotifyConfig};

use crate::cli_error::CliError;
use crate::queue_cmd::{self, duration, outln};
pub(crate) use rowbus_ui::json::{dead_letter as json_line, rfc3339};

/// What `rowbus dead` does.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadCommand {
    /// Print a queue's dead letters, newest first, one line each
    List(ListArgs),
    /// Put dead letters back in their queue: same id, group, payload and publish time,
    /// attempts counted from 0; prints how many
    Requeue(RequeueArgs),
    /// Delete dead letters for good; prints how many
    Purge(PurgeArgs),
}

impl DeadCommand {
    /// Checks, before connecting, that a requeue or purge names its dead letters.
    pub(crate) fn check(&self) -> Result<(), CliError> {
        let message = match self {
            DeadCommand::Requeue(args) if !args.which.any() => {
                "dead requeue needs --all (every dead letter) or --id ID (repeatable): which dead letters to put back"
            }
            DeadCommand::Purge(args) if !args.which.any() && args.older_than.is_none() => {
                "dead purge needs --all (every dead letter), --id ID (repeatable) or --older-than DURATION: which \
                 dead letters to delete"
            }
            _ => return Ok(()),
        };
        Err(CliError::Message(message.to_owned()))
    }

    /// The queue table it works on.
    pub(crate) fn table(&self) -> &String {
        match self {
            DeadCommand::List(args) => &args.table,
            DeadCommand::Requeue(args) => &args.table,
            DeadCommand::Purge(args) => &args.table,
        }
    }
}

/// Options of `rowbus dead list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// The queue table (its dead letters are in `<TABLE>_dead`)
    table: String,
    /// Only this group's dead letters (`--group ""`: the default group, which the lines
    /// show as `group -` and JSON as "")
    #[arg(long, value_name = "G")]
    group: Option<String>,
    /// Print at most this many
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: u32,
    /// Skip this many newer ones first (the pages before)
    #[arg(long, value_name = "N", default_value_t = 0)]
    offset: u64,
    /// Print JSON lines {"id", "group", "payload", "attempts", "last_error", "published_at",
    /// "died_at", "priority", "key", "headers"}: times in RFC 3339 (UTC, microseconds); a
    /// payload that is not UTF-8 is null, with its bytes in "payload_hex"
    #[arg(long)]
    json: bool,
}

/// The dead letters a requeue or purge names: `--all` or `--id`s.
#[derive(Debug, Args)]
pub(crate) struct Selection {
    /// Every dead letter
    #[arg(long)]
    all: bool,
    /// This dead letter (repeatable)
    #[arg(long = "id", value_name = "ID", value_parser = dead_id)]
    ids: Vec<i64>,
}

impl Selection {
    /// Whether it names any dead letter.
    fn any(&self) -> bool {
        self.all || !self.ids.is_empty()
    }
}

/// An `--id`: a message id, a whole number from 1 up.
fn dead_id(text: &str) -> Result<i64, String> {
    match text.parse::<i64>() {
        Ok(id) if id >= 1 => Ok(id),
        _ => Err(format!("not a whole number from 1 to {}", i64::MAX)),
    }
}

/// Options of `rowbus dead requeue`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").args(["all", "ids"])))]
pub(crate) struct RequeueArgs {
    /// The queue table
    table: String,
    #[command(flatten)]
    which: Selection,
    /// Claimable only after this delay, e.g. 30s, 5m (plain seconds too) [default: at once]
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    delay: Option<Duration>,
}

/// Options of `rowbus dead purge`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").args(["all", "ids", "older_than"])))]
pub(crate) struct PurgeArgs {
    /// The queue table
    table: String,
    #[command(flatten)]
    which: Selection,
    /// Those dead-lettered longer ago than this, e.g. 168h, 30m (plain seconds too)
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    older_than: Option<Duration>,
}

/// Which dead letters `--all`, `--id` and `--older-than` name (one of them: clap refuses
/// two, [`DeadCommand::check`] none).
fn which(selection: Selection, older_than: Option<Duration>) -> DeadLetters {
    match (selection.all, older_than) {
        (true, _) => DeadLetters::All,
        (false, Some(age)) => DeadLetters::OlderThan(age),
        (false, None) => DeadLetters::Ids(selection.ids),
    }
}

/// Runs `command` on the queue it names. A requeue wakes consumers in other processes
/// ([`waking_broker`]).
pub(crate) async fn dead<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    command: DeadCommand,
) -> Result<(), CliError> {
    let broker = waking_broker(pool, url, config, matches!(command, DeadCommand::Requeue(_))).await?;
    let result = run(&broker, url, command).await;
    broker.shutdown(Duration::ZERO).await;
    result
}

/// A broker on `pool` that, when `requeues` and the notify table `config` names is there
/// (always on PostgreSQL), wakes consumers in other processes running with
/// `--listen-notify` when it puts messages back or resumes a queue, listening on `url`
/// (every host it lists); call its `shutdown` when done.
pub(crate) async fn waking_broker<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    requeues: bool,
) -> Result<Broker<DB>, CliError> {
    let (broker, wake_ups_off) = broker_waking_where_it_can(pool, url, config, requeues).await?;
    if wake_ups_off {
        crate::warn_no_wake_ups();
    }
    Ok(broker)
}

/// [`waking_broker`] without the warning, and whether wake-ups would have been sent but
/// are off (PgBouncer without `--listen-url`): for a command that says so only when what
/// it did needed them.
pub(crate) async fn broker_waking_where_it_can<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    wakes: bool,
) -> Result<(Broker<DB>, bool), CliError> {
    let notify_table = queue_cmd::broker_notify_config(config);
    let listen_url = crate::listen_url(url);
    let ready = wakes
        && Broker::new(pool.clone(), BrokerOptions::default()).await?.notify_ready(&notify_table).await?;
    let listen_notify = ready && listen_url.is_some();
    let broker = Broker::new(
        pool,
        BrokerOptions { listen_notify, notify_table, listen_url, ..BrokerOptions::default() },
    )
    .await?;
    Ok((broker, ready && !listen_notify))
}

async fn run<DB: Db>(broker: &Broker<DB>, url: &str, command: DeadCommand) -> Result<(), CliError> {
    let queue = queue_cmd::existing_queue(broker, command.table(), url).await?;
    let table = queue.table().clone();
    match command {
        DeadCommand::List(args) => {
            let page = DeadLetterPage { group: args.group, limit: args.limit, offset: args.offset };
            for letter in queue.dead_letters(&page).await? {
                match args.json {
                    true => outln!("{}", json_line(&letter)),
                    false => outln!("{}", text_line(&letter)),
                }
            }
        }
        DeadCommand::Requeue(args) => {
            let which = which(args.which, None);
            let n = queue.requeue_dead(&which, args.delay.unwrap_or_default()).await?;
            outln!("requeued {n} dead letter{} to `{table}`", plural(n));
        }
        DeadCommand::Purge(args) => {
            let n = queue.purge_dead(&which(args.which, args.older_than)).await?;
            outln!("purged {n} dead letter{} from `{table}_dead`", plural(n));
        }
    }
    Ok(())
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// One dead letter for people: its strings quoted and escaped, so that it stays on one
/// line whatever its error or payload hold.
fn text_line(letter: &DeadLetter) -> String {
    let payload = match std::str::from_utf8(&letter.payload) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("<{} bytes, not UTF-8>", letter.payload.len()),
    };
    format!(
        "id {}  group {}  attempts {}  died {}  published {}  error {}  payload {payload}",
        letter.id,
        queue_cmd::group_quoted(&letter.group),
        letter.attempts,
        rfc3339(letter.died_at),
        rfc3339(letter.published_at),
        letter.last_error.as_deref().map_or_else(|| "-".to_owned(), |e| format!("{e:?}")),
    )
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use serde_json::json;

    use super::*;

    #[test]
    fn lines_stay_one_line() {
        let mut letter = DeadLetter::default();
        letter.id = 7;
        letter.group = "g".into();
        letter.payload = vec![0xff, 0x00];
        letter.attempts = 3;
        letter.last_error = Some("exit status 1\nstderr: no".into());
        letter.published_at = SystemTime::UNIX_EPOCH;
        letter.died_at = SystemTime::UNIX_EPOCH;
        letter.priority = -2;
        letter.key = Some("k".into());
        letter.headers = [("h".to_owned(), "v".to_owned())].into();
        let text = text_line(&letter);
        assert!(!text.contains('\n') && text.contains("<2 bytes, not UTF-8>"), "{text}");
        let line = json_line(&letter);
        assert_eq!((line["payload"].clone(), line["payload_hex"].clone()), (json!(null), json!("ff00")));
        assert_eq!(line["last_error"], "exit status 1\nstderr: no");
        assert_eq!((line["priority"].clone(), line["key"].clone()), (json!(-2), json!("k")));
        assert_eq!(line["headers"], json!({"h": "v"}));
    }
}
