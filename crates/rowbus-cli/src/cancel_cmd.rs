//! `rowbus cancel QUEUE --id ID... | [--group G] --all`: messages removed whatever their
//! state; a consumer running one is told to stop it.

use std::time::Duration;

use clap::{ArgGroup, Args};
use rowbus::control::{Cancel, Cancelled};
use rowbus::sqlx::Pool;
use rowbus::{Db, NotifyConfig};

use crate::cli_error::CliError;
use crate::dead_cmd::broker_waking_where_it_can;
use crate::queue_cmd::{self, outln};

/// Options of `rowbus cancel`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").args(["all", "ids"]).required(true)))]
pub(crate) struct CancelArgs {
    /// The queue table
    pub(crate) table: String,
    /// This message (repeatable): ready, delayed, waiting for a retry or running
    #[arg(long = "id", value_name = "ID", value_parser = message_id, allow_negative_numbers = true)]
    ids: Vec<i64>,
    /// Every message of the group (--group; the default group without it), whatever its state
    #[arg(long)]
    all: bool,
    /// With --all: this group's messages [default: the default group] (an --id names its
    /// message whatever its group)
    #[arg(long, value_name = "G", requires = "all", conflicts_with = "ids")]
    group: Option<String>,
}

/// An `--id`: a message id, a whole number from 1 up.
fn message_id(text: &str) -> Result<i64, String> {
    match text.parse::<i64>() {
        Ok(id) if id >= 1 => Ok(id),
        _ => Err(format!("not a whole number from 1 to {}", i64::MAX)),
    }
}

/// Cancels what `args` names and says what it cancelled: the ids, and which of them were
/// running (their consumers stop them within their poll interval, at once with
/// `--listen-notify`).
pub(crate) async fn cancel<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    args: CancelArgs,
) -> Result<(), CliError> {
    let (broker, wake_ups_off) = broker_waking_where_it_can(pool, url, config, true).await?;
    let result: Result<(), CliError> = async {
        let queue = queue_cmd::existing_queue(&broker, &args.table, url).await?;
        let which = match args.all {
            true => Cancel::Group(args.group.unwrap_or_default()),
            false => Cancel::Ids(args.ids),
        };
        let done = queue.cancel_which(&which).await?;
        outln!("{}", said(&done, &queue.table().to_string()));
        // Only a running message's consumer had to be told.
        if wake_ups_off && !done.running.is_empty() {
            eprintln!(
                "rowbus: warning: through PgBouncer (pgbouncer=true) without --listen-url, consumers in \
                 other processes are not told at once: they stop the running messages at their next poll \
                 (give a direct URL with --listen-url or ROWBUS_LISTEN_URL)"
            );
        }
        Ok(())
    }
    .await;
    broker.shutdown(Duration::ZERO).await;
    result
}

/// `cancelled 2 messages from `jobs`: 7, 9 (running: 9; its consumer stops it)`.
fn said(done: &Cancelled, table: &str) -> String {
    let n = done.ids.len();
    let mut line = format!("cancelled {n} message{} from `{table}`", if n == 1 { "" } else { "s" });
    if n == 0 {
        return line;
    }
    let list = |ids: &[i64]| ids.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    line += &format!(": {}", list(&done.ids));
    if !done.running.is_empty() {
        let their =
            if done.running.len() == 1 { "its consumer stops it" } else { "their consumers stop them" };
        line += &format!(" (running: {}; {their})", list(&done.running));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_what_it_cancelled() {
        let mut done = Cancelled::default();
        (done.ids, done.running) = (vec![7, 9], vec![9]);
        assert_eq!(
            said(&done, "jobs"),
            "cancelled 2 messages from `jobs`: 7, 9 (running: 9; its consumer stops it)"
        );
        assert_eq!(said(&Cancelled::default(), "jobs"), "cancelled 0 messages from `jobs`");
    }
}
