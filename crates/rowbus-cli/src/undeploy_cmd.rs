//! The end of the lifecycle: `rowbus undeploy --queue Q` drops a queue and every table of
//! its own; `rowbus listen CHANNEL --forget NAME` deletes a durable listener's position.

use clap::Args;
use rowbus::sqlx::Pool;
use rowbus::{Broker, BrokerOptions, Db, DbPool, NotifyConfig, OnPool};

use crate::cli_error::CliError;
use crate::queue_cmd::{self, outln};

/// Options of `rowbus undeploy`.
#[derive(Debug, Args)]
pub(crate) struct UndeployArgs {
    /// A queue table to drop (repeatable), with its dead-letter, pause, schedule, tick and
    /// history tables
    #[arg(long = "queue", value_name = "TABLE", required = true)]
    queues: Vec<String>,
    /// Drop it even while messages are in flight: the consumers holding them fail their
    /// acknowledgements, and every consumer of it stops with an error
    #[arg(long)]
    force: bool,
}

/// Drops each queue, one line each. Every queue is checked before any is dropped: each
/// must be a queue table, and without `--force` none may have a message in flight (a
/// consumer at work on it). A consumer that is idle holds nothing to see: it fails at its
/// next claim.
pub(crate) async fn undeploy<DB: Db>(pool: Pool<DB>, url: &str, args: UndeployArgs) -> Result<(), CliError> {
    let broker = Broker::new(pool, BrokerOptions::default()).await?;
    let result = async {
        let mut queues = Vec::with_capacity(args.queues.len());
        for name in &args.queues {
            let queue = queue_cmd::existing_queue(&broker, name, url).await?;
            let in_flight: i64 = queue.group_stats().await?.iter().map(|g| g.in_flight).sum();
            if in_flight > 0 && !args.force {
                return Err(CliError::Message(format!(
                    "queue `{}` has {in_flight} message{} in flight: a consumer is at work on it; \
                     stop its consumers first, or drop it anyway with `rowbus undeploy --force`",
                    queue.table(),
                    if in_flight == 1 { "" } else { "s" }
                )));
            }
            queues.push(queue);
        }
        for queue in queues {
            queue.undeploy().await?;
            outln!("queue `{}` dropped, with its dead letters, schedules and history", queue.table());
        }
        Ok(())
    }
    .await;
    broker.shutdown(std::time::Duration::ZERO).await;
    result
}

/// `listen CHANNEL... --forget NAME`: deletes durable listener `name`'s position on each
/// channel, one line each.
pub(crate) async fn forget(
    db: &DbPool,
    config: &NotifyConfig,
    channels: &[String],
    name: &str,
) -> Result<(), CliError> {
    db.run(Forget { config, channels, name }).await
}

struct Forget<'a> {
    config: &'a NotifyConfig,
    channels: &'a [String],
    name: &'a str,
}

impl OnPool for Forget<'_> {
    type Output = Result<(), CliError>;

    async fn run<DB: Db>(self, pool: Pool<DB>) -> Self::Output {
        // The lease of a position an older rowbus stored without one.
        let lease = rowbus::ListenerOptions::default().durable_lease;
        for channel in self.channels {
            let name = self.name;
            if rowbus::durable::forget_durable_listener(&pool, self.config, channel, name, lease).await? {
                outln!("durable listener {name:?} on {channel:?} forgotten");
            } else {
                outln!("no durable listener {name:?} on {channel:?}: nothing to forget");
            }
        }
        Ok(())
    }
}
