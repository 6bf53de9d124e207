//! `rowbus pause QUEUE [--group G]` and `rowbus resume QUEUE [--group G]`: hold a queue's
//! (or a group's) claims in every consumer, and let them go again. The state is in the
//! database; consumers running with `--listen-notify` see it at once, others at their
//! next poll.

use std::time::Duration;

use clap::Args;
use rowbus::sqlx::Pool;
use rowbus::{Db, NotifyConfig, Queue};

use crate::cli_error::CliError;
use crate::queue_cmd::{self, outln};

/// Options of `rowbus pause` and `rowbus resume`.
#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
    /// The queue table
    pub(crate) table: String,
    /// Only this group (`""` is the default group) [default: the whole queue]
    #[arg(long)]
    group: Option<String>,
}

/// Which of the two.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Action {
    Pause,
    Resume,
}

/// Pauses or resumes, and says in one line what it did.
pub(crate) async fn pause<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    action: Action,
    args: PauseArgs,
) -> Result<(), CliError> {
    // Wakes consumers elsewhere where it can: through the notify table when it exists.
    let broker = crate::dead_cmd::waking_broker(pool, url, config, true).await?;
    let result = async {
        let queue = queue_cmd::existing_queue(&broker, &args.table, url).await?;
        let line = match action {
            Action::Pause => paused(&queue, args.group.as_deref()).await?,
            Action::Resume => resumed(&queue, args.group.as_deref()).await?,
        };
        outln!("{line}");
        Ok(())
    }
    .await;
    broker.shutdown(Duration::ZERO).await;
    result
}

/// `group `g` of queue `q`` or `queue `q``.
fn what(queue: &Queue<impl Db>, group: Option<&str>) -> String {
    match group {
        Some(group) => format!("group {group:?} of queue `{}`", queue.table()),
        None => format!("queue `{}`", queue.table()),
    }
}

async fn paused<DB: Db>(queue: &Queue<DB>, group: Option<&str>) -> Result<String, CliError> {
    let what = what(queue, group);
    Ok(if queue.pause(group).await? {
        format!("paused {what}: consumers take nothing from it until `rowbus resume`")
    } else {
        format!("{what} was paused already")
    })
}

async fn resumed<DB: Db>(queue: &Queue<DB>, group: Option<&str>) -> Result<String, CliError> {
    let what = what(queue, group);
    let lifted = queue.resume(group).await?;
    let still = match group {
        Some(_) if queue.paused().await?.queue => {
            format!(" (the whole queue `{}` is still paused)", queue.table())
        }
        _ => String::new(),
    };
    Ok(match lifted {
        0 => format!("{what} was not paused{still}"),
        1 => format!("resumed {what}{still}"),
        n => format!("resumed {what}: lifted {n} pauses, the queue's and its groups'"),
    })
}
