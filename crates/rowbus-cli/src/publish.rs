//! `rowbus publish TABLE [--group G] [--delay DURATION] PAYLOAD|-`.

use std::io::BufRead;
use std::time::Duration;

use clap::Args;
use rowbus::sqlx::Pool;
use rowbus::{Broker, BrokerOptions, Db, Message, NotifyConfig};
use tokio::sync::mpsc;

use crate::cli_error::CliError;
use crate::queue_cmd::{self, duration, outln};

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
    /// The payload; `-` publishes each line of stdin as one message, in batches
    payload: String,
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
    let listen_notify =
        Broker::new(pool.clone(), BrokerOptions::default()).await?.notify_ready(&notify_table).await?;
    let options = BrokerOptions { listen_notify, notify_table, ..BrokerOptions::default() };
    let broker = Broker::new(pool, options).await?;
    let result = publish_with(&broker, url, args).await;
    broker.shutdown(Duration::ZERO).await;
    result
}

/// Publishes on `broker`'s queue `args.table`.
async fn publish_with<DB: Db>(broker: &Broker<DB>, url: &str, args: PublishArgs) -> Result<(), CliError> {
    let queue = queue_cmd::existing_queue(broker, &args.table, url).await?;
    let message = |payload: Vec<u8>| {
        let m = Message::new(payload).group(args.group.clone());
        match args.delay {
            Some(delay) => m.delay(delay),
            None => m,
        }
    };
    if args.payload != "-" {
        queue.publish(message(args.payload.clone().into_bytes())).await?;
        outln!("published 1 message to `{}`", queue.table());
        return Ok(());
    }

    let mut lines = stdin_lines();
    let mut interrupted = std::pin::pin!(crate::interrupted());
    let mut published = 0u64;
    let mut stopped = false;
    loop {
        // A batch is published whole: Ctrl-C stops between batches.
        let first = tokio::select! {
            _ = &mut interrupted => { stopped = true; break }
            line = lines.recv() => line,
        };
        let Some(first) = first else { break };
        let mut batch = vec![first?];
        while batch.len() < BATCH {
            match lines.try_recv() {
                Ok(line) => batch.push(line?),
                Err(_) => break,
            }
        }
        published += queue.publish_batch(batch.into_iter().map(&message)).await?;
    }
    let s = if published == 1 { "" } else { "s" };
    let note = if stopped { " (interrupted)" } else { "" };
    outln!("published {published} message{s} to `{}`{note}", queue.table());
    Ok(())
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
