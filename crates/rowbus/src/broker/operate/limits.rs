//! Limits on a queue or one of its groups: how many messages are in flight at once, how
//! many of one ordering key, how many start per period. They are rows of the queue's
//! limits table (`<table>_limits`, made by [`Queue::deploy`]), so they hold for every
//! process and outlive them; every claim obeys them from the moment they are written
//! (see `broker::claim::limited` for how racing claims are kept within them).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use notify_table::MAX_DURATION;

use crate::broker::exec::{micros, queue_error, to_the_end};
use crate::broker::publish::insert;
use crate::broker::{Queue, check_group};
use crate::driver::Arg;
use crate::error::Error;
use crate::sql::{Db, begin};

/// What a limit counts: the whole queue's messages, or one group's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LimitScope {
    /// Every group of the queue together.
    Queue,
    /// One group (`""` is the default group).
    Group(String),
}

impl LimitScope {
    /// `None` for the whole queue, else the group: as the CLI's `--group` says it.
    pub fn of(group: Option<&str>) -> LimitScope {
        group.map_or(LimitScope::Queue, |g| LimitScope::Group(g.to_owned()))
    }

    /// The row's key: (whole_queue, group_name).
    fn key(&self) -> (i64, &str) {
        match self {
            LimitScope::Queue => (1, ""),
            LimitScope::Group(group) => (0, group),
        }
    }
}

impl fmt::Display for LimitScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitScope::Queue => f.write_str("whole queue"),
            LimitScope::Group(group) => write!(f, "group {group:?}"),
        }
    }
}

/// A rate: at most `count` messages started per `per`, at most `burst` of them at once.
///
/// `burst` (by default `count`) is a token bucket's size: the bucket holds up to `burst`
/// starts and fills with one every `per / count`. With the default, `count` may start at
/// once; with a burst of 1 the starts are spread evenly, one every `per / count`. Either
/// way no window of `per` holds more than `count` starts.
///
/// ```
/// use std::time::Duration;
/// let rate = rowbus::limit::Rate::new(20, Duration::from_secs(1)).with_burst(1);
/// assert_eq!(rate.to_string(), "20/s, burst 1");
/// assert_eq!("20/s".parse::<rowbus::limit::Rate>().unwrap().burst, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rate {
    /// Messages started in any window of `per`, at most.
    pub count: u64,
    /// The window.
    pub per: Duration,
    /// How many may start at once, from 1 to `count` (`None`: `count`).
    pub burst: Option<u64>,
}

impl Rate {
    /// `count` per `per`, with the default burst (`count`).
    pub fn new(count: u64, per: Duration) -> Rate {
        Rate { count, per, burst: None }
    }

    /// The same rate with at most `burst` started at once.
    pub fn with_burst(self, burst: u64) -> Rate {
        Rate { burst: Some(burst), ..self }
    }
}

impl FromStr for Rate {
    type Err = Error;

    /// `N/s`, `N/m` or `N/h` (N a whole number from 1 on).
    ///
    /// ```
    /// let rate: rowbus::limit::Rate = "100/s".parse().unwrap();
    /// assert_eq!((rate.count, rate.per.as_secs()), (100, 1));
    /// assert!("0/s".parse::<rowbus::limit::Rate>().is_err());
    /// assert!("100/d".parse::<rowbus::limit::Rate>().is_err());
    /// ```
    fn from_str(text: &str) -> Result<Rate, Error> {
        let bad = || Error::InvalidLimit {
            what: format!("a rate is N/s, N/m or N/h with N a whole number from 1 on, not {text:?}"),
        };
        let (count, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let count: u64 = count.trim().parse().map_err(|_| bad())?;
        let per = match unit.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        let rate = Rate::new(count, per);
        rate.check()?;
        Ok(rate)
    }
}

impl fmt::Display for Rate {
    /// `20/s`, and `, burst N` where a burst is set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.per.as_secs() {
            1 if self.per.subsec_nanos() == 0 => write!(f, "{}/s", self.count)?,
            60 if self.per.subsec_nanos() == 0 => write!(f, "{}/m", self.count)?,
            3600 if self.per.subsec_nanos() == 0 => write!(f, "{}/h", self.count)?,
            _ => write!(f, "{} per {:?}", self.count, self.per)?,
        }
        match self.burst {
            Some(burst) => write!(f, ", burst {burst}"),
            None => Ok(()),
        }
    }
}

impl Rate {
    fn check(&self) -> Result<(), Error> {
        check_count("a rate's count", self.count)?;
        if self.per < Duration::from_millis(1) || self.per > MAX_DURATION {
            return Err(Error::InvalidLimit {
                what: format!("a rate's period must be from 1 ms to {MAX_DURATION:?}, not {:?}", self.per),
            });
        }
        match self.burst {
            Some(burst) if burst < 1 || burst > self.count => Err(Error::InvalidLimit {
                what: format!("a burst must be from 1 to the rate's count ({}), not {burst}", self.count),
            }),
            _ => Ok(()),
        }
    }
}

/// One limit of a scope, as [`Queue::set_limit`] sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// At most this many messages in flight at once (claimed, their lease unexpired),
    /// whatever the number of consumers and processes.
    MaxRunning(u64),
    /// At most this many messages of one ordering key in flight at once, the key's
    /// earliest ones (the default, without this limit, is one: a key's messages in
    /// order).
    PerKey(u64),
    /// At most this many messages started per period, as many at once as its burst:
    /// a claim gives each message it takes a start a little ahead, its handler begins
    /// then (and is given back unstarted if it could not begin within a guard of a tenth
    /// of the period, at most 100 ms, after it), and a start counts for the period and
    /// that guard: no window of one period holds more handler starts than the count.
    Rate(Rate),
}

/// A scope's limits and how it stands, as [`Queue::limits`] reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitStatus {
    /// What the limits count.
    pub scope: LimitScope,
    /// [`Limit::MaxRunning`], if set.
    pub max_running: Option<u64>,
    /// [`Limit::PerKey`], if set.
    pub per_key: Option<u64>,
    /// [`Limit::Rate`], if set.
    pub rate: Option<Rate>,
    /// Messages of the scope in flight that limited claims took (those taken before a
    /// concurrency limit was first set are counted too).
    pub running: u64,
    /// Messages of the scope started in the rate's last period and its guard, or given a
    /// start ahead (0 without a rate; see [`Limit::Rate`]).
    pub started: u64,
    /// Messages of the scope ready to claim (keyed ones held behind their key's earlier
    /// messages included).
    pub ready: u64,
    /// Of those, how many the limits hold back now: ready beyond what the scope's
    /// concurrency and rate limits let claims take at this moment.
    pub held: u64,
}

fn check_count(what: &str, n: u64) -> Result<i64, Error> {
    match i64::try_from(n) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(Error::InvalidLimit {
            what: format!("{what} must be a whole number from 1 to {}, not {n}", i64::MAX),
        }),
    }
}

fn positive(n: i64) -> Option<u64> {
    u64::try_from(n).ok().filter(|&n| n > 0)
}

impl<DB: Db> Queue<DB> {
    /// Sets one limit of `scope`, keeping its others: from the next claim on, every
    /// subscription of every process obeys it (those it holds back are woken when it
    /// changes). A concurrency limit set where there was none counts the messages in
    /// flight at that moment.
    ///
    /// Limits apply to lease claims (`run`, `run_batch`, streams); a transactional
    /// subscription ([`run_tx`](crate::SubscriptionBuilder::run_tx)) of a limited group is
    /// refused at its start ([`Error::LimitedTransactional`]), and one already running
    /// takes nothing from it. Needs the limits tables: a queue deployed by an older rowbus gets
    /// them from a new [`deploy`](Self::deploy) ([`Error::MissingLimitsTable`] until then).
    ///
    /// Runs to its end when its future is dropped once polled (as every operation on a
    /// queue does: a statement cut off half way could cost the pool its connection).
    pub async fn set_limit(&self, scope: &LimitScope, limit: Limit) -> Result<(), Error> {
        let (queue, scope) = (self.clone(), scope.clone());
        to_the_end(async move { queue.set_limit_now(&scope, limit).await }).await
    }

    /// [`set_limit`](Self::set_limit) itself.
    async fn set_limit_now(&self, scope: &LimitScope, limit: Limit) -> Result<(), Error> {
        let (whole, group) = scope.key();
        check_group(group)?;
        let sql = &self.sql.limits;
        let (set, value, period) = match limit {
            Limit::MaxRunning(n) => (&sql.set_running, check_count("--max-running", n)?, None),
            Limit::PerKey(n) => (&sql.set_per_key, check_count("--per-key", n)?, None),
            Limit::Rate(rate) => {
                rate.check()?;
                let burst = rate.burst.map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX));
                (
                    &sql.set_rate,
                    i64::try_from(rate.count).unwrap_or(i64::MAX),
                    Some([micros(rate.per), burst]),
                )
            }
        };
        let mut args = vec![Arg::Int(whole), Arg::Text(group), Arg::Int(value)];
        args.extend(period.into_iter().flatten().map(Arg::Int));
        let mut tx = begin(&self.inner().pool, DB::WRITE_BEGIN).await?;
        let written = async {
            DB::execute(&mut tx, set, &args).await?;
            if matches!(limit, Limit::MaxRunning(_)) {
                let (w, g) = (Arg::Int(whole), Arg::Text(group));
                DB::execute(&mut tx, &sql.seed, &[w, g, w, g, w, g]).await?;
            }
            Ok::<_, sqlx::Error>(())
        }
        .await;
        written.map_err(|e| queue_error(self, e))?;
        tx.commit().await.map_err(|e| queue_error(self, e))?;
        self.wake_limited(scope).await;
        Ok(())
    }

    /// Removes every limit of `scope` (a group's own; the whole queue's stay, and go with
    /// [`LimitScope::Queue`]). Wakes the subscriptions it held back. Returns whether there
    /// were any. Runs to its end when its future is dropped once polled.
    pub async fn clear_limit(&self, scope: &LimitScope) -> Result<bool, Error> {
        let (queue, scope) = (self.clone(), scope.clone());
        to_the_end(async move { queue.clear_limit_now(&scope).await }).await
    }

    /// [`clear_limit`](Self::clear_limit) itself.
    async fn clear_limit_now(&self, scope: &LimitScope) -> Result<bool, Error> {
        let (whole, group) = scope.key();
        check_group(group)?;
        let sql = &self.sql.limits;
        let args = [Arg::Int(whole), Arg::Text(group)];
        let mut tx = begin(&self.inner().pool, DB::WRITE_BEGIN).await?;
        let cleared = async {
            let cleared = DB::execute(&mut tx, &sql.clear, &args).await?;
            DB::execute(&mut tx, &sql.clear_starts, &args).await?;
            Ok::<_, sqlx::Error>(cleared)
        }
        .await
        .map_err(|e| queue_error(self, e))?;
        tx.commit().await.map_err(|e| queue_error(self, e))?;
        self.wake_limited(scope).await;
        Ok(cleared > 0)
    }

    /// The queue's limits, the whole queue's first, then each limited group's by name,
    /// with how each scope stands now: one statement.
    pub async fn limits(&self) -> Result<Vec<LimitStatus>, Error> {
        let sql = &self.sql.limits;
        let mut conn = self.inner().pool.acquire().await?;
        let rows = DB::fetch_rows(&mut conn, &sql.list, &[], 1).await.map_err(|e| queue_error(self, e))?;
        drop(conn);
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let all = rows
            .into_iter()
            .map(|row| {
                let (whole, group) = (row.int(0), row.text(0));
                let scope = if whole == 1 { LimitScope::Queue } else { LimitScope::Group(group.to_owned()) };
                let (max_running, per_key) = (positive(row.int(1)), positive(row.int(2)));
                let rate = match (positive(row.int(3)), positive(row.int(4))) {
                    (Some(count), Some(us)) => {
                        Some(Rate { count, per: Duration::from_micros(us), burst: positive(row.int(5)) })
                    }
                    _ => None,
                };
                let (running, started, ready) = (count(row.int(6)), count(row.int(7)), count(row.int(8)));
                let room = [
                    max_running.map(|max| max.saturating_sub(running)),
                    rate.map(|rate| rate.count.saturating_sub(started)),
                ]
                .into_iter()
                .flatten()
                .min();
                let held = room.map_or(0, |room| ready.saturating_sub(room));
                LimitStatus { scope, max_running, per_key, rate, running, started, ready, held }
            })
            .collect();
        Ok(all)
    }

    /// Messages ready but held back by a limit now, in the whole queue: at least the
    /// whole queue's limits' [`held`](LimitStatus::held), and at least its groups' together.
    /// One statement, as [`limits`](Self::limits); one probe of an empty limits table
    /// where the queue has none.
    pub async fn limited(&self) -> Result<u64, Error> {
        let limits = self.limits().await?;
        let queue = limits.iter().filter(|l| l.scope == LimitScope::Queue).map(|l| l.held).sum::<u64>();
        let groups = limits.iter().filter(|l| l.scope != LimitScope::Queue).map(|l| l.held).sum::<u64>();
        Ok(queue.max(groups))
    }

    /// Wakes the subscriptions a change of `scope`'s limits concerns, here and, with
    /// `listen_notify`, elsewhere.
    async fn wake_limited(&self, scope: &LimitScope) {
        let group = match scope {
            LimitScope::Queue => None,
            LimitScope::Group(group) => Some(group.as_str()),
        };
        // An empty payload wakes every group of the table in the other processes.
        insert::wake_others_pooled(self, &[group.unwrap_or("").to_owned()]).await;
        self.inner().wakers.wake(self.table().channel(), group);
    }
}
