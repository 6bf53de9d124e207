//! Which ticks of a schedule are due: pure arithmetic on microseconds since the Unix
//! epoch, with "now" passed in (the scheduler reads the database's clock and hands it
//! here), so that every rule is tested without a clock or a database.
//!
//! A schedule's ticks are the times after its `since` (when it was added or last
//! changed): `since + k × every` for k ≥ 1, or the cron expression's occurrences in UTC.
//! A broker that has just started (no cursor) takes only the latest tick at or before
//! now: ticks missed while no broker ran are published once, not once each. A running
//! broker takes every tick after its cursor, unless its cursor is older than
//! [`HORIZON_US`] (it stalled): then it too takes only the latest.

use std::str::FromStr as _;

use chrono::{DateTime, Utc};

/// How far back a running broker still publishes each tick it has not handled yet: a
/// broker whose cursor is older takes only the latest tick, as one that just started.
pub(crate) const HORIZON_US: i64 = 60_000_000;
/// Most ticks one pass publishes (more only after a stall: 600 covers a minute of the
/// shortest `every`, 100 ms).
pub(crate) const MAX_DUE: usize = 600;

/// When a schedule ticks.
#[derive(Debug, Clone)]
pub(crate) enum Rule {
    /// Every this many µs after `since`; greater than 0.
    Every(i64),
    /// The occurrences of a cron expression, in UTC.
    Cron(Box<croner::Cron>),
}

/// Parses a cron expression: five fields (minute to day of week) or six (seconds first),
/// and croner's nicknames (`@hourly`...). The error says what croner found wrong.
pub(crate) fn parse_cron(expr: &str) -> Result<croner::Cron, String> {
    let cron = croner::Cron::from_str(expr).map_err(|e| e.to_string())?;
    // A pattern no date matches (`0 0 30 2 *`) parses; it would never tick.
    let start = DateTime::<Utc>::from_timestamp_micros(0).unwrap_or_default();
    if cron.find_next_occurrence(&start, false).is_err() {
        return Err("it matches no date".to_owned());
    }
    Ok(cron)
}

/// One schedule's ticks.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub rule: Rule,
    /// µs since the epoch: ticks come after it.
    pub since: i64,
}

fn utc(us: i64) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp_micros(us)
}

/// `us` down to its whole second.
fn second_of(us: i64) -> i64 {
    us.div_euclid(1_000_000) * 1_000_000
}

fn micros(time: DateTime<Utc>) -> i64 {
    time.timestamp_micros()
}

impl Plan {
    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: i64) -> Option<i64> {
        let t = t.max(self.since);
        match &self.rule {
            Rule::Every(every) => {
                let k = (t - self.since) / every + 1;
                k.checked_mul(*every)?.checked_add(self.since)
            }
            // From the whole second: croner keeps a start's fraction in what it returns.
            Rule::Cron(cron) => Some(micros(cron.find_next_occurrence(&utc(second_of(t))?, false).ok()?)),
        }
    }

    /// The latest tick at or before `now`, if one is after `since`.
    pub fn latest_by(&self, now: i64) -> Option<i64> {
        if now <= self.since {
            return None;
        }
        let latest = match &self.rule {
            Rule::Every(every) => {
                let k = (now - self.since) / every;
                (k >= 1).then(|| self.since + k * every)?
            }
            Rule::Cron(cron) => micros(cron.find_previous_occurrence(&utc(second_of(now))?, true).ok()?),
        };
        (latest > self.since && latest <= now).then_some(latest)
    }

    /// The ticks to publish now, oldest first: with no `cursor` (a broker that just
    /// started or just learnt of the schedule) or a cursor older than [`HORIZON_US`],
    /// only the latest tick at or before `now`; otherwise every tick after `cursor` up
    /// to `now` (at most [`MAX_DUE`], the latest ones).
    pub fn due(&self, cursor: Option<i64>, now: i64) -> Vec<i64> {
        let from = match cursor {
            Some(c) if c >= now.saturating_sub(HORIZON_US) => c,
            _ => return self.latest_by(now).into_iter().collect(),
        };
        let mut ticks = Vec::new();
        let mut t = from;
        while let Some(next) = self.next_after(t).filter(|&n| n <= now) {
            ticks.push(next);
            t = next;
        }
        if ticks.len() > MAX_DUE {
            ticks.drain(..ticks.len() - MAX_DUE);
        }
        ticks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;
    /// 2024-01-01T00:00:00Z.
    const NEW_YEAR: i64 = 1_704_067_200 * S;

    fn every(ms: i64, since: i64) -> Plan {
        Plan { rule: Rule::Every(ms * 1000), since }
    }

    fn cron(expr: &str, since: i64) -> Plan {
        Plan { rule: Rule::Cron(Box::new(parse_cron(expr).unwrap())), since }
    }

    #[test]
    fn every_ticks_after_since_at_multiples() {
        let p = every(200, 1_000_000);
        assert_eq!(p.next_after(0), Some(1_200_000));
        assert_eq!(p.next_after(1_000_000), Some(1_200_000));
        assert_eq!(p.next_after(1_199_999), Some(1_200_000));
        assert_eq!(p.next_after(1_200_000), Some(1_400_000));
        assert_eq!(p.latest_by(1_000_000), None);
        assert_eq!(p.latest_by(1_199_999), None);
        assert_eq!(p.latest_by(1_200_000), Some(1_200_000));
        assert_eq!(p.latest_by(1_399_999), Some(1_200_000));
    }

    #[test]
    fn a_start_publishes_only_the_latest_missed_tick() {
        let p = every(200, 0);
        // Ten minutes of ticks missed: one, the latest.
        assert_eq!(p.due(None, 600 * S + 50_000), vec![600 * S]);
        // Before the first tick: none.
        assert_eq!(p.due(None, 100_000), Vec::<i64>::new());
        let c = cron("0 3 * * *", NEW_YEAR);
        // Three days later at noon: the third day's 03:00, once.
        assert_eq!(
            c.due(None, NEW_YEAR + (2 * 24 + 12) * 3600 * S),
            vec![NEW_YEAR + (2 * 24 + 3) * 3600 * S]
        );
    }

    #[test]
    fn a_running_broker_publishes_each_tick_after_its_cursor() {
        let p = every(200, 0);
        assert_eq!(p.due(Some(1_000_000), 1_000_000), Vec::<i64>::new());
        assert_eq!(p.due(Some(1_000_000), 1_199_999), Vec::<i64>::new());
        assert_eq!(p.due(Some(1_000_000), 1_200_000), vec![1_200_000]);
        // Woken late: each tick it slept through, in order.
        assert_eq!(p.due(Some(1_000_000), 1_650_000), vec![1_200_000, 1_400_000, 1_600_000]);
        // The cursor may sit between ticks.
        assert_eq!(p.due(Some(1_100_000), 1_450_000), vec![1_200_000, 1_400_000]);
    }

    #[test]
    fn a_stall_past_the_horizon_counts_as_a_start() {
        let p = every(200, 0);
        let now = 10 * HORIZON_US + 30_000;
        let stale = now - HORIZON_US - 1;
        assert_eq!(p.due(Some(stale), now), vec![now - 30_000]);
        // Within the horizon every tick, bounded.
        let ticks = p.due(Some(now - HORIZON_US), now);
        assert_eq!(ticks.len(), MAX_DUE.min((HORIZON_US / 200_000) as usize));
        assert_eq!(ticks.last(), Some(&(now - 30_000)));
        assert!(ticks.windows(2).all(|w| w[1] - w[0] == 200_000));
    }

    #[test]
    fn cron_ticks_in_utc_after_since() {
        let c = cron("*/15 * * * *", NEW_YEAR + 1);
        assert_eq!(c.next_after(NEW_YEAR), Some(NEW_YEAR + 15 * 60 * S));
        assert_eq!(c.next_after(NEW_YEAR + 15 * 60 * S), Some(NEW_YEAR + 30 * 60 * S));
        // Inside a second: never that second again.
        assert_eq!(c.next_after(NEW_YEAR + 15 * 60 * S + 500_000), Some(NEW_YEAR + 30 * 60 * S));
        assert_eq!(c.latest_by(NEW_YEAR + 29 * 60 * S), Some(NEW_YEAR + 15 * 60 * S));
        assert_eq!(c.latest_by(NEW_YEAR + 30 * 60 * S), Some(NEW_YEAR + 30 * 60 * S));
        // `since` itself is not a tick: the schedule was made then.
        assert_eq!(cron("0 * * * *", NEW_YEAR).latest_by(NEW_YEAR + 30 * 60 * S), None);
        // Six fields: seconds first.
        let s = cron("*/10 * * * * *", NEW_YEAR);
        assert_eq!(
            s.due(Some(NEW_YEAR), NEW_YEAR + 35 * S),
            vec![NEW_YEAR + 10 * S, NEW_YEAR + 20 * S, NEW_YEAR + 30 * S]
        );
    }

    #[test]
    fn bad_cron_expressions_are_refused() {
        for bad in ["", "* * *", "61 * * * *", "* * * * * * * *", "a b c d e", "0 0 30 2 *"] {
            assert!(parse_cron(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["* * * * *", "0 3 * * MON-FRI", "*/5 * * * * *", "@hourly", "0 0 1 1 *"] {
            assert!(parse_cron(good).is_ok(), "{good:?} refused");
        }
    }
}
