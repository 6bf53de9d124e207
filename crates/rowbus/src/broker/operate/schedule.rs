//! Schedules: a message published to a queue every interval or at a cron expression's
//! times, by whichever running broker gets there first. The definitions are rows of the
//! queue's `<table>_sched`; each published tick is a row of `<table>_ticks`, whose key
//! `(schedule, tick)` lets one broker publish it and turns the others away (see
//! `docs/schedules.md`). [`scheduler`](crate::broker::operate::scheduler) runs them.

use std::fmt;
use std::time::{Duration, SystemTime};

use notify_table::DurationRange;

use crate::broker::exec::queue_error;
use crate::broker::operate::ticks::{Plan, Rule, parse_cron};
use crate::broker::{Queue, check_group};
use crate::driver::{Arg, TextsAndInts};
use crate::error::{Error, check_duration, is_missing_table};
use crate::sql::{Db, begin};
use crate::sql::{SCHED_SUFFIX, TICKS_SUFFIX};

/// The shortest interval of [`Schedule::every`]: each tick is a transaction, and a
/// tick row kept for ten minutes.
pub const MIN_EVERY: Duration = Duration::from_millis(100);
/// The longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME: usize = 100;
/// The largest payload of a schedule's messages, in bytes.
pub const MAX_SCHEDULE_PAYLOAD: usize = 65_536;
/// The longest cron expression, in bytes.
const MAX_CRON: usize = 255;

/// When a schedule ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum When {
    /// Every interval after the schedule was added (or last changed).
    Every(Duration),
    /// At a cron expression's times, in UTC.
    Cron(String),
}

impl fmt::Display for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            When::Every(every) => write!(f, "every {every:?}"),
            When::Cron(expr) => write!(f, "cron {expr:?}"),
        }
    }
}

/// A message to publish on a timetable: what [`Queue::schedule`] stores.
///
/// ```
/// use std::time::Duration;
/// use rowbus::schedule::{Schedule, When};
/// let hourly = Schedule::every(Duration::from_secs(3600)).payload("sweep").group("maintenance");
/// assert_eq!(hourly.when, When::Every(Duration::from_secs(3600)));
/// let nightly = Schedule::cron("0 3 * * *")?.payload("report");
/// assert!(Schedule::cron("0 3 * *").is_err()); // four fields
/// # Ok::<(), rowbus::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// When it ticks.
    pub when: When,
    /// Each tick's message payload (text).
    pub payload: String,
    /// Each tick's message group (`""`, the default group, unless set).
    pub group: String,
}

impl Schedule {
    /// Ticks every `interval` (at least [`MIN_EVERY`], at most
    /// [`MAX_DURATION`](crate::limits::MAX_DURATION); checked by [`Queue::schedule`]), counted
    /// from when the schedule is stored.
    pub fn every(interval: Duration) -> Self {
        Schedule { when: When::Every(interval), payload: String::new(), group: String::new() }
    }

    /// Ticks at the times of a cron expression, in UTC: five fields (minute, hour, day
    /// of month, month, day of week), or six with seconds first, or a nickname such as
    /// `@hourly`. [`Error::InvalidCron`] names an expression that does not parse.
    pub fn cron(expr: &str) -> Result<Self, Error> {
        check_cron(expr)?;
        Ok(Schedule { when: When::Cron(expr.to_owned()), payload: String::new(), group: String::new() })
    }

    /// With this payload in each tick's message (at most [`MAX_SCHEDULE_PAYLOAD`] bytes).
    pub fn payload(mut self, payload: impl Into<String>) -> Self {
        self.payload = payload.into();
        self
    }

    /// With each tick's message in this group.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// Refuses what cannot be stored or would not tick.
    fn check(&self, name: &str) -> Result<(), Error> {
        check_name(name)?;
        let invalid = |reason: String| Error::InvalidSchedule { name: name.to_owned(), reason };
        match &self.when {
            When::Every(every) => {
                check_duration("every", *every, DurationRange::Span)?;
                if *every < MIN_EVERY {
                    return Err(invalid(format!(
                        "an interval of {every:?} is under the least, {MIN_EVERY:?}"
                    )));
                }
            }
            When::Cron(expr) => drop(check_cron(expr)?),
        }
        if self.payload.len() > MAX_SCHEDULE_PAYLOAD {
            return Err(invalid(format!(
                "a payload of {} bytes is over the {MAX_SCHEDULE_PAYLOAD}-byte limit",
                self.payload.len()
            )));
        }
        check_group(&self.group)
    }
}

fn check_cron(expr: &str) -> Result<croner::Cron, Error> {
    let invalid = |reason: String| Error::InvalidCron { expr: expr.to_owned(), reason };
    if expr.len() > MAX_CRON {
        return Err(invalid(format!("it is over {MAX_CRON} bytes")));
    }
    parse_cron(expr).map_err(invalid)
}

/// Checks a schedule name: 1 to [`MAX_SCHEDULE_NAME`] bytes of letters, digits, `_`,
/// `-`, `.` and `:`.
fn check_name(name: &str) -> Result<(), Error> {
    let invalid = |reason: &str| Error::InvalidSchedule { name: name.to_owned(), reason: reason.to_owned() };
    if name.is_empty() || name.len() > MAX_SCHEDULE_NAME {
        return Err(invalid("a schedule name has 1 to 100 characters"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b)) {
        return Err(invalid("a schedule name has only letters, digits, `_`, `-`, `.` and `:`"));
    }
    Ok(())
}

/// A stored schedule, as [`Queue::schedules`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// Its name, unique within the queue.
    pub name: String,
    /// What it publishes, when.
    pub schedule: Schedule,
    /// When it was added or last changed (the database's clock): its ticks come after.
    pub since: SystemTime,
    /// The latest tick published, if any.
    pub last_tick: Option<SystemTime>,
    /// The next tick after now (the database's clock); `None` if there is none.
    pub next_tick: Option<SystemTime>,
}

/// What [`Queue::schedule`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduleChange {
    /// There was no schedule of that name.
    Added,
    /// The schedule of that name had another definition: its ticks now count from now.
    Replaced,
    /// The schedule of that name had this very definition: nothing changed.
    Unchanged,
}

/// A stored schedule row, decoded: its definition, version and plan.
pub(in crate::broker) struct Stored {
    pub name: String,
    pub schedule: Schedule,
    pub since: i64,
    pub version: i64,
    pub plan: Plan,
    /// The latest tick recorded (only from the list statement).
    pub last_tick: Option<i64>,
}

/// Decodes a row of [`ScheduleSql::list`](crate::sql::ScheduleSql::list) or `get`.
pub(in crate::broker) fn decode(row: &TextsAndInts) -> Result<Stored, Error> {
    let (every_us, since, version) = (row.int(0), row.int(1), row.int(2));
    let (when, rule) = if every_us > 0 {
        (When::Every(Duration::from_micros(every_us.unsigned_abs())), Rule::Every(every_us))
    } else {
        let cron = check_cron(row.text(1))?;
        (When::Cron(row.text(1).to_owned()), Rule::Cron(Box::new(cron)))
    };
    Ok(Stored {
        name: row.text(0).to_owned(),
        schedule: Schedule { when, payload: row.text(2).to_owned(), group: row.text(3).to_owned() },
        since,
        version,
        plan: Plan { rule, since },
        last_tick: row.ints.get(3).copied().flatten(),
    })
}

/// µs since the epoch as a time.
fn time_of(us: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(us.max(0).unsigned_abs())
}

/// A driver error of a schedule statement: [`Error::MissingScheduleTable`] when it says
/// the schedule or tick table is missing, otherwise named for the queue.
pub(in crate::broker) fn schedule_error<DB: Db>(queue: &Queue<DB>, e: sqlx::Error) -> Error {
    let name = queue.table().name();
    let says = |suffix: &str| matches!(&e, sqlx::Error::Database(db) if db.message().contains(&format!("{name}{suffix}")));
    if is_missing_table(&e) && (says(SCHED_SUFFIX) || says(TICKS_SUFFIX)) {
        Error::MissingScheduleTable { table: queue.table().to_string() }
    } else {
        queue_error(queue, e)
    }
}

impl<DB: Db> Queue<DB> {
    /// Stores schedule `name` of this queue (adding it, or replacing the definition of
    /// that name): from then on every running broker that consumes this queue with
    /// schedules on ([`BrokerOptions::run_schedules`](crate::broker::BrokerOptions::run_schedules))
    /// publishes its ticks, each tick once whatever the number of brokers. A changed
    /// definition counts its ticks from now; storing the same definition again changes
    /// nothing (so a deploy script may store its schedules at every start).
    ///
    /// ```no_run
    /// # async fn f(queue: rowbus::Queue<sqlx::Postgres>) -> Result<(), rowbus::Error> {
    /// use std::time::Duration;
    /// use rowbus::schedule::Schedule;
    /// queue.schedule("sweep", Schedule::every(Duration::from_secs(600)).payload("sweep")).await?;
    /// queue.schedule("nightly", Schedule::cron("0 3 * * *")?.payload("report")).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Needs the schedule tables: a queue deployed by an older rowbus gets them from a
    /// new [`deploy`](Self::deploy) ([`Error::MissingScheduleTable`] until then).
    pub async fn schedule(&self, name: &str, schedule: Schedule) -> Result<ScheduleChange, Error> {
        schedule.check(name)?;
        // Stored in µs: compared as it will read back.
        let mut schedule = schedule;
        if let When::Every(every) = &mut schedule.when {
            *every = Duration::from_micros(crate::broker::exec::micros(*every).unsigned_abs());
        }
        let sql = &self.sql.schedule;
        let mut conn = self.inner().pool.acquire().await?;
        let rows = DB::fetch_rows(&mut conn, &sql.get, &[Arg::Text(name)], 4)
            .await
            .map_err(|e| schedule_error(self, e))?;
        let existing = rows.first().map(decode).transpose()?;
        let change = match existing {
            Some(stored) if stored.schedule == schedule => return Ok(ScheduleChange::Unchanged),
            Some(_) => ScheduleChange::Replaced,
            None => ScheduleChange::Added,
        };
        let (cron, every_us) = match &schedule.when {
            When::Every(every) => ("", crate::broker::exec::micros(*every)),
            When::Cron(expr) => (expr.as_str(), 0),
        };
        let args = [
            Arg::Text(name),
            Arg::Text(cron),
            Arg::Text(&schedule.payload),
            Arg::Text(&schedule.group),
            Arg::Int(every_us),
            Arg::Int(self.inner().token()),
        ];
        DB::execute(&mut conn, &sql.upsert, &args).await.map_err(|e| schedule_error(self, e))?;
        drop(conn);
        self.inner().schedulers.reread(self.table());
        Ok(change)
    }

    /// Removes schedule `name` and the record of its ticks; returns whether there was
    /// one. A broker running it publishes none of its ticks from then on (a tick's
    /// transaction checks the definition it publishes is still stored).
    pub async fn unschedule(&self, name: &str) -> Result<bool, Error> {
        check_name(name)?;
        let sql = &self.sql.schedule;
        let mut tx = begin(&self.inner().pool, DB::WRITE_BEGIN).await?;
        let removed = DB::execute(&mut tx, &sql.delete, &[Arg::Text(name)])
            .await
            .map_err(|e| schedule_error(self, e))?;
        DB::execute(&mut tx, &sql.delete_ticks, &[Arg::Text(name)])
            .await
            .map_err(|e| schedule_error(self, e))?;
        tx.commit().await?;
        self.inner().schedulers.reread(self.table());
        Ok(removed > 0)
    }

    /// This queue's schedules, by name, with their latest and next ticks.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>, Error> {
        let sql = &self.sql.schedule;
        let mut conn = self.inner().pool.acquire().await?;
        let rows = DB::fetch_rows(&mut conn, &sql.list, &[], 4).await.map_err(|e| schedule_error(self, e))?;
        let now = db_now(self, &mut conn).await?;
        rows.iter()
            .map(|row| {
                let stored = decode(row)?;
                Ok(ScheduleInfo {
                    next_tick: stored.plan.next_after(now).map(time_of),
                    last_tick: stored.last_tick.map(time_of),
                    since: time_of(stored.since),
                    name: stored.name,
                    schedule: stored.schedule,
                })
            })
            .collect()
    }
}

/// The database's clock, µs since the epoch.
pub(in crate::broker) async fn db_now<DB: Db>(
    queue: &Queue<DB>,
    conn: &mut DB::Connection,
) -> Result<i64, Error> {
    let rows =
        DB::fetch_rows(conn, &queue.sql.schedule.now, &[], 0).await.map_err(|e| queue_error(queue, e))?;
    Ok(rows.first().map_or(0, |r| r.int(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_intervals_and_payloads_are_checked() {
        let ok = Schedule::every(Duration::from_millis(200));
        assert!(ok.check("nightly-report:v2").is_ok());
        for bad in ["", "a b", "x;y", "é", &"n".repeat(101)] {
            assert!(matches!(ok.check(bad), Err(Error::InvalidSchedule { .. })), "{bad:?}");
        }
        assert!(matches!(
            Schedule::every(Duration::from_millis(99)).check("s"),
            Err(Error::InvalidSchedule { .. })
        ));
        assert!(matches!(
            Schedule::every(Duration::from_secs(u64::MAX)).check("s"),
            Err(Error::InvalidDuration { setting: "every", .. })
        ));
        let big = ok.clone().payload("x".repeat(MAX_SCHEDULE_PAYLOAD + 1));
        assert!(matches!(big.check("s"), Err(Error::InvalidSchedule { .. })));
        assert!(matches!(ok.group("g ").check("s"), Err(Error::InvalidName { .. })));
    }

    #[test]
    fn a_bad_cron_expression_is_named() {
        let err = Schedule::cron("0 25 * * *").unwrap_err();
        assert!(matches!(&err, Error::InvalidCron { expr, .. } if expr == "0 25 * * *"));
        assert!(err.to_string().contains("\"0 25 * * *\""), "{err}");
    }
}
