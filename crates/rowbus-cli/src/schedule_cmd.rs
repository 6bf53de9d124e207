//! `rowbus schedule QUEUE NAME (--every DURATION | --cron EXPR) [--payload TEXT] [--group G]`,
//! `rowbus schedule QUEUE NAME --remove` and `rowbus schedule --list [QUEUE] [--json]`:
//! the schedules every running `rowbus consume` of the queue publishes (each tick once,
//! whatever the number of consumers; see docs/schedules.md).

use std::time::{Duration, SystemTime};

use clap::{ArgGroup, Args};
use rowbus::schedule::{Schedule, ScheduleChange, ScheduleInfo, When};
use rowbus::sqlx::Pool;
use rowbus::{Broker, BrokerOptions, Db, DbPool, Error, OnPool, Queue};
use serde_json::json;

use crate::cli_error::CliError;
use crate::dead_cmd::rfc3339;
use crate::queue_cmd::{self, duration, outln};

/// Options of `rowbus schedule`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("action").args(["every", "cron", "remove", "list"]).required(true)))]
pub(crate) struct ScheduleArgs {
    /// The queue table (with --list: only its schedules)
    #[arg(required_unless_present = "list")]
    queue: Option<String>,
    /// The schedule's name, unique within the queue: letters, digits, `_`, `-`, `.`, `:`
    #[arg(required_unless_present = "list", conflicts_with = "list")]
    name: Option<String>,
    /// Publish every DURATION (at least 100ms; e.g. 30s, 5m, 1h), counted from now
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    every: Option<Duration>,
    /// Publish at the times of a cron expression, in UTC: "MIN HOUR DAY MONTH WEEKDAY"
    /// (e.g. "0 3 * * *", "*/15 * * * MON-FRI"), six fields with seconds first, or @hourly,
    /// @daily... (no year field)
    #[arg(long, value_name = "EXPR")]
    cron: Option<String>,
    /// Each tick's message payload [default: empty]
    #[arg(long, value_name = "TEXT", default_value = "", hide_default_value = true,
          conflicts_with_all = ["remove", "list"])]
    payload: String,
    /// Each tick's message group [default: the default group]
    #[arg(long, value_name = "G", default_value = "", hide_default_value = true,
          conflicts_with_all = ["remove", "list"])]
    group: String,
    /// Remove the schedule (and the record of its ticks)
    #[arg(long)]
    remove: bool,
    /// List the schedules of every queue (or of QUEUE): when, group, payload, last and
    /// next tick
    #[arg(long)]
    list: bool,
    /// With --list: JSON lines {"queue", "name", "every_ms", "cron", "group", "payload",
    /// "since", "last_tick", "next_tick"}, times in RFC 3339 (UTC)
    #[arg(long, requires = "list")]
    json: bool,
}

/// What the command was asked to do, checked before connecting.
enum Action {
    Store { queue: String, name: String, schedule: Schedule },
    Remove { queue: String, name: String },
    List { queue: Option<String>, json: bool },
}

impl ScheduleArgs {
    fn action(self) -> Result<Action, CliError> {
        if let Some(queue) = &self.queue {
            queue_cmd::parse_tables(std::slice::from_ref(queue))?;
        }
        let (queue, name) = (self.queue.unwrap_or_default(), self.name.unwrap_or_default());
        let when = match (self.every, self.cron) {
            _ if self.list => {
                return Ok(Action::List { queue: Some(queue).filter(|q| !q.is_empty()), json: self.json });
            }
            _ if self.remove => return Ok(Action::Remove { queue, name }),
            (Some(every), _) => Schedule::every(every),
            (None, Some(cron)) => Schedule::cron(&cron_fields(&cron)?)?,
            (None, None) => unreachable!("clap requires one of --every, --cron, --remove, --list"),
        };
        Ok(Action::Store { queue, name, schedule: when.payload(self.payload).group(self.group) })
    }
}

/// `--cron`'s expression, refused with seven fields or more (a year): the help promises five,
/// or six with seconds first (fewer the library refuses, saying why).
fn cron_fields(expr: &str) -> Result<String, CliError> {
    let fields = expr.split_whitespace().count();
    if fields <= 6 {
        return Ok(expr.to_owned());
    }
    Err(CliError::Message(format!(
        "invalid cron expression {expr:?}: {fields} fields; write five fields (minute hour day-of-month month \
         day-of-week, in UTC, e.g. \"0 3 * * *\") or six with seconds first, no year"
    )))
}

/// Runs `rowbus schedule`.
pub(crate) async fn schedule(url: &str, args: ScheduleArgs) -> Result<(), CliError> {
    let action = args.action()?;
    let db = DbPool::connect_with_size(url, 2).await?;
    let done = db.run(OnDatabase { url, action }).await;
    db.close().await;
    done
}

struct OnDatabase<'a> {
    url: &'a str,
    action: Action,
}

impl OnPool for OnDatabase<'_> {
    type Output = Result<(), CliError>;

    async fn run<DB: Db>(self, pool: Pool<DB>) -> Self::Output {
        let broker = Broker::new(pool, BrokerOptions::default()).await?;
        let done = match self.action {
            Action::Store { queue, name, schedule } => {
                let queue = queue_cmd::existing_queue(&broker, &queue, self.url).await?;
                store(&queue, &name, schedule).await
            }
            Action::Remove { queue, name } => {
                let queue = queue_cmd::existing_queue(&broker, &queue, self.url).await?;
                remove(&queue, &name).await
            }
            Action::List { queue, json } => list(&broker, self.url, queue, json).await,
        };
        broker.shutdown(Duration::ZERO).await;
        done
    }
}

async fn store<DB: Db>(queue: &Queue<DB>, name: &str, schedule: Schedule) -> Result<(), CliError> {
    let when = describe(&schedule.when);
    let change = queue.schedule(name, schedule).await?;
    let next = queue.schedules().await?.into_iter().find(|s| s.name == name).and_then(|s| s.next_tick);
    let next = next.map_or_else(|| "none".to_owned(), rfc3339);
    let what = format!("schedule {name:?} of queue `{}`", queue.table());
    match change {
        ScheduleChange::Added => outln!("added {what}: {when}, next tick {next}"),
        ScheduleChange::Replaced => outln!("replaced {what}: {when}, counted from now; next tick {next}"),
        ScheduleChange::Unchanged => outln!("{what} is already {when}: unchanged; next tick {next}"),
        other => outln!("{what}: {other:?}; next tick {next}"),
    }
    Ok(())
}

async fn remove<DB: Db>(queue: &Queue<DB>, name: &str) -> Result<(), CliError> {
    if queue.unschedule(name).await? {
        outln!("removed schedule {name:?} of queue `{}`", queue.table());
        Ok(())
    } else {
        Err(CliError::Message(format!(
            "queue `{}` has no schedule {name:?}: nothing removed (`rowbus schedule --list` shows them)",
            queue.table()
        )))
    }
}

/// Every schedule of `only`, or of every queue where unqualified names resolve. A queue
/// deployed before schedules has none, and is said to lack their tables on stderr.
async fn list<DB: Db>(
    broker: &Broker<DB>,
    url: &str,
    only: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let queues = match only {
        Some(name) => vec![queue_cmd::existing_queue(broker, &name, url).await?],
        None => {
            let names = broker.queue_tables().await?;
            names.iter().map(|name| broker.queue(name)).collect::<Result<Vec<_>, _>>()?
        }
    };
    let mut any = false;
    for queue in &queues {
        let schedules = match queue.schedules().await {
            Ok(schedules) => schedules,
            Err(error @ Error::MissingScheduleTable { .. }) => {
                eprintln!("rowbus: {}", CliError::from(error).line());
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        for s in &schedules {
            if json {
                outln!("{}", json_line(queue, s));
            } else {
                if !any {
                    outln!("QUEUE\tNAME\tWHEN\tGROUP\tPAYLOAD\tLAST TICK\tNEXT TICK");
                }
                outln!("{}", text_line(queue, s));
            }
            any = true;
        }
    }
    if !any && !json {
        eprintln!("rowbus: no schedules");
    }
    Ok(())
}

/// `every 5m` or `cron "0 3 * * *" (UTC)`.
fn describe(when: &When) -> String {
    match when {
        When::Every(every) => format!("every {}", human(*every)),
        When::Cron(expr) => format!("cron {expr:?} (UTC)"),
    }
}

/// A duration as the flags take it: `250ms`, `30s`, `5m`, `2h`, or seconds with a fraction.
fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}s", d.as_secs_f64())
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn time_or_dash(time: Option<SystemTime>) -> String {
    time.map_or_else(|| "-".to_owned(), rfc3339)
}

fn text_line<DB: Db>(queue: &Queue<DB>, s: &ScheduleInfo) -> String {
    let group = if s.schedule.group.is_empty() { "-" } else { &s.schedule.group };
    format!(
        "{}\t{}\t{}\t{}\t{:?}\t{}\t{}",
        queue.table(),
        s.name,
        describe(&s.schedule.when),
        group.escape_debug(),
        s.schedule.payload,
        time_or_dash(s.last_tick),
        time_or_dash(s.next_tick)
    )
}

fn json_line<DB: Db>(queue: &Queue<DB>, s: &ScheduleInfo) -> serde_json::Value {
    let (every_ms, cron) = match &s.schedule.when {
        When::Every(every) => (Some(u64::try_from(every.as_millis()).unwrap_or(u64::MAX)), None),
        When::Cron(expr) => (None, Some(expr.as_str())),
    };
    json!({
        "queue": queue.table().to_string(),
        "name": s.name,
        "every_ms": every_ms,
        "cron": cron,
        "group": s.schedule.group,
        "payload": s.schedule.payload,
        "since": rfc3339(s.since),
        "last_tick": s.last_tick.map(rfc3339),
        "next_tick": s.next_tick.map(rfc3339),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_read_as_the_flags_take_them() {
        let ms = Duration::from_millis;
        assert_eq!(human(ms(250)), "250ms");
        assert_eq!(human(ms(30_000)), "30s");
        assert_eq!(human(ms(300_000)), "5m");
        assert_eq!(human(ms(7_200_000)), "2h");
        assert_eq!(human(ms(1500)), "1500ms");
        assert_eq!(human(Duration::from_micros(100_500)), "0.1005s");
    }
}
