//! Configuration of a notify table: five settings, their defaults, their rules.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::duration::{DurationRange, parse_duration};
use crate::error::ConfigError;

/// How often a listener's cleanup runs, in time of polling (counted in polls).
pub(crate) const CLEANUP_PERIOD: Duration = Duration::from_secs(60);

/// Largest [`Config::cleanup_limit`]: SQLite binds at most 32,766 values per statement.
pub const MAX_CLEANUP_LIMIT: u32 = 32_766;

/// Longest table name MySQL accepts for an identifier.
pub const MAX_TABLE_LEN: usize = 64;

/// The configuration of a notify table.
///
/// Every field has a default ([`Config::default`]); the defaults live in the `DEFAULT_*`
/// constants and nowhere else. A `Config` is checked by [`Config::validate`], which
/// [`NotifyTable::new`](crate::NotifyTable::new) calls for you.
///
/// ```
/// use std::time::Duration;
/// use notify_table::Config;
///
/// let config: Config = "table=app_notify poll_interval=0.05".parse().unwrap();
/// assert_eq!(config.table, "app_notify");
/// assert_eq!(config.poll_interval, Duration::from_millis(50));
/// assert_eq!(config.lookback, Config::DEFAULT_LOOKBACK);
///
/// let config: Config = "poll_interval=250ms lookback=1m retention=2h".parse().unwrap();
/// assert_eq!(config.retention, Duration::from_secs(7200));
///
/// let err = "poll_interval=0".parse::<Config>().unwrap_err();
/// assert_eq!(err.to_string(), "invalid `poll_interval` = 0: must be at least 1 ms and at most 100 years");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The notify table's name: a plain identifier `[A-Za-z_][A-Za-z0-9_]*` of at most
    /// 64 characters. It is backtick-quoted in every statement.
    pub table: String,
    /// Time between two polls: the latency of a notification. At least
    /// [`MIN_POLL_INTERVAL`](crate::MIN_POLL_INTERVAL) (1 ms), at most
    /// [`MAX_DURATION`](crate::MAX_DURATION) (100 years).
    pub poll_interval: Duration,
    /// How long a notification's transaction may stay open between its INSERT and its
    /// COMMIT and still be delivered after a later notification on the same channel was
    /// delivered first: how long a poll keeps probing an id it has not read below one it
    /// has (a gap), and how long a new subscription watches the ids below its mark that its
    /// subscribe statement did not read (its first window). Greater than zero, at most
    /// [`MAX_DURATION`](crate::MAX_DURATION): the poll takes it from the server's clock.
    pub lookback: Duration,
    /// Age after which a listener's cleanup deletes a row; zero turns the cleanup off.
    /// Otherwise it must exceed `lookback + poll_interval`, so that a late commit is still
    /// there when the next poll looks for it; at most [`MAX_DURATION`](crate::MAX_DURATION).
    pub retention: Duration,
    /// Rows one cleanup run deletes at most: a positive integer, at most
    /// [`MAX_CLEANUP_LIMIT`], so that the DELETE's ids fit in one statement on every server.
    pub cleanup_limit: u32,
}

impl Config {
    /// Default [`Config::table`].
    pub const DEFAULT_TABLE: &'static str = "rowbus_notify";
    /// Default [`Config::poll_interval`]: one second.
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
    /// Default [`Config::lookback`]: one minute.
    pub const DEFAULT_LOOKBACK: Duration = Duration::from_secs(60);
    /// Default [`Config::retention`]: one hour.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(3600);
    /// Default [`Config::cleanup_limit`].
    pub const DEFAULT_CLEANUP_LIMIT: u32 = 1000;

    /// The keys [`Config::set`] and text parsing accept.
    pub const KEYS: [&'static str; 5] = ["table", "poll_interval", "lookback", "retention", "cleanup_limit"];

    /// Checks every setting and returns the first that breaks its rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !is_identifier(&self.table) {
            return Err(ConfigError::Invalid {
                key: "table",
                value: self.table.clone(),
                rule: "must be a plain identifier [A-Za-z_][A-Za-z0-9_]* of at most 64 characters",
            });
        }
        for (key, value, range) in [
            ("poll_interval", self.poll_interval, DurationRange::PollInterval),
            ("lookback", self.lookback, DurationRange::Positive),
            ("retention", self.retention, DurationRange::Span),
        ] {
            if !range.contains(value) {
                return Err(invalid_secs(key, value, range.rule()));
            }
        }
        if !self.retention.is_zero() && self.retention <= self.lookback + self.poll_interval {
            return Err(invalid_secs(
                "retention",
                self.retention,
                "must be 0 (cleanup off) or greater than lookback + poll_interval",
            ));
        }
        if self.cleanup_limit == 0 || self.cleanup_limit > MAX_CLEANUP_LIMIT {
            return Err(ConfigError::Invalid {
                key: "cleanup_limit",
                value: self.cleanup_limit.to_string(),
                rule: "must be a positive integer, at most 32766",
            });
        }
        Ok(())
    }

    /// Sets one setting from its text form, as a CLI flag or an environment variable
    /// gives it. Durations are plain seconds (`2`, `0.05`) or a number with one unit
    /// (`250ms`, `1.5s`, `1m`, `1h`, `7d`), as [`parse_duration`] reads them. Does not validate
    /// the whole configuration; [`Config::validate`] does.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let value = value.trim();
        match key {
            "table" => self.table = value.to_owned(),
            "poll_interval" => self.poll_interval = duration("poll_interval", value)?,
            "lookback" => self.lookback = duration("lookback", value)?,
            "retention" => self.retention = duration("retention", value)?,
            "cleanup_limit" => {
                self.cleanup_limit = value.parse().map_err(|_| ConfigError::Invalid {
                    key: "cleanup_limit",
                    value: value.to_owned(),
                    rule: "must be a positive integer, at most 32766",
                })?
            }
            _ => return Err(ConfigError::UnknownKey { key: key.to_owned() }),
        }
        Ok(())
    }

    /// Builds a validated configuration from `key=value` pairs over the defaults.
    pub fn from_pairs<'a, I>(pairs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut config = Config::default();
        for (key, value) in pairs {
            config.set(key.trim(), value)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Polls in one cleanup period (a minute of polling), at least one.
    pub(crate) fn cleanup_period_polls(&self) -> u64 {
        let polls = CLEANUP_PERIOD.as_nanos().div_ceil(self.poll_interval.as_nanos().max(1));
        u64::try_from(polls).unwrap_or(u64::MAX).max(1)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            table: Self::DEFAULT_TABLE.to_owned(),
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
            lookback: Self::DEFAULT_LOOKBACK,
            retention: Self::DEFAULT_RETENTION,
            cleanup_limit: Self::DEFAULT_CLEANUP_LIMIT,
        }
    }
}

/// Parses `key=value` pairs separated by whitespace, commas or newlines, over the
/// defaults, and validates the result.
impl FromStr for Config {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut pairs = Vec::new();
        for item in text.split(|c: char| c == ',' || c.is_whitespace()).filter(|s| !s.is_empty()) {
            let (key, value) =
                item.split_once('=').ok_or_else(|| ConfigError::Malformed { item: item.to_owned() })?;
            pairs.push((key, value));
        }
        Config::from_pairs(pairs)
    }
}

impl fmt::Display for Config {
    /// Writes the configuration in the text form [`Config::from_str`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "table={} poll_interval={} lookback={} retention={} cleanup_limit={}",
            self.table,
            self.poll_interval.as_secs_f64(),
            self.lookback.as_secs_f64(),
            self.retention.as_secs_f64(),
            self.cleanup_limit
        )
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_TABLE_LEN`] characters.
pub(crate) fn is_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= MAX_TABLE_LEN
}

fn duration(key: &'static str, value: &str) -> Result<Duration, ConfigError> {
    parse_duration(value).map_err(|_| ConfigError::Invalid {
        key,
        value: value.to_owned(),
        rule: "must be a duration: seconds (2, 0.05) or a number with one unit (250ms, 1.5s, 1m, 1h, 7d)",
    })
}

fn invalid_secs(key: &'static str, value: Duration, rule: &'static str) -> ConfigError {
    ConfigError::Invalid { key, value: value.as_secs_f64().to_string(), rule }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_of(err: ConfigError) -> (&'static str, &'static str) {
        match err {
            ConfigError::Invalid { key, rule, .. } => (key, rule),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.table, "rowbus_notify");
        assert_eq!(c.poll_interval, Duration::from_secs(1));
        assert_eq!(c.lookback, Duration::from_secs(60));
        assert_eq!(c.retention, Duration::from_secs(3600));
        assert_eq!(c.cleanup_limit, 1000);
    }

    #[test]
    fn table_identifier_rule() {
        for ok in ["a", "_", "A_1", "rowbus_notify", &"x".repeat(64)] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in ["", "1a", "a-b", "a b", "a`b", "a;b", "ä", "a.b", &"x".repeat(65)] {
            assert!(!is_identifier(bad), "{bad}");
            let c = Config { table: bad.to_owned(), ..Config::default() };
            assert_eq!(rule_of(c.validate().unwrap_err()).0, "table");
        }
    }

    #[test]
    fn each_invalid_value_names_its_key() {
        let zero = Duration::ZERO;
        let cases = [
            (Config { poll_interval: zero, ..Config::default() }, "poll_interval"),
            (Config { lookback: zero, ..Config::default() }, "lookback"),
            (Config { retention: Duration::from_secs(61), ..Config::default() }, "retention"),
            (Config { cleanup_limit: 0, ..Config::default() }, "cleanup_limit"),
            (Config { cleanup_limit: MAX_CLEANUP_LIMIT + 1, ..Config::default() }, "cleanup_limit"),
        ];
        for (config, key) in cases {
            assert_eq!(rule_of(config.validate().unwrap_err()).0, key);
        }
    }

    #[test]
    fn retention_zero_or_above_lookback_plus_poll_interval() {
        let at = |secs: f64| Config { retention: Duration::from_secs_f64(secs), ..Config::default() };
        at(0.0).validate().unwrap();
        assert!(at(61.0).validate().is_err(), "equal to lookback + poll_interval");
        at(61.001).validate().unwrap();
    }

    #[test]
    fn parses_text_with_decimal_seconds() {
        let c: Config =
            "table=t1, poll_interval=0.05\nlookback=2 retention=0 cleanup_limit=7".parse().unwrap();
        assert_eq!(
            c,
            Config {
                table: "t1".into(),
                poll_interval: Duration::from_millis(50),
                lookback: Duration::from_secs(2),
                retention: Duration::ZERO,
                cleanup_limit: 7,
            }
        );
        assert_eq!(c.to_string().parse::<Config>().unwrap(), c);
        assert_eq!("".parse::<Config>().unwrap(), Config::default());
    }

    #[test]
    fn text_refuses_unknown_keys_and_bad_values_by_name() {
        assert_eq!(
            "pollinterval=1".parse::<Config>().unwrap_err(),
            ConfigError::UnknownKey { key: "pollinterval".into() }
        );
        assert_eq!("table".parse::<Config>().unwrap_err(), ConfigError::Malformed { item: "table".into() });
        for (text, key) in [
            ("poll_interval=-1", "poll_interval"),
            ("lookback=abc", "lookback"),
            ("retention=NaN", "retention"),
            ("cleanup_limit=1.5", "cleanup_limit"),
            ("cleanup_limit=-3", "cleanup_limit"),
            ("cleanup_limit=0", "cleanup_limit"),
            ("table=a;b", "table"),
        ] {
            assert_eq!(rule_of(text.parse::<Config>().unwrap_err()).0, key, "{text}");
        }
        let msg = "retention=10".parse::<Config>().unwrap_err().to_string();
        assert_eq!(
            msg,
            "invalid `retention` = 10: must be 0 (cleanup off) or greater than lookback + poll_interval"
        );
    }

    #[test]
    fn durations_take_units() {
        let c: Config = "poll_interval=250ms lookback=1.5m retention=2h".parse().unwrap();
        assert_eq!(c.poll_interval, Duration::from_millis(250));
        assert_eq!(c.lookback, Duration::from_secs(90));
        assert_eq!(c.retention, Duration::from_secs(7200));
        let c: Config = "poll_interval=1ms lookback=2s retention=0".parse().unwrap();
        assert_eq!((c.poll_interval, c.lookback), (Duration::from_millis(1), Duration::from_secs(2)));
    }

    /// A poll interval that floods the server, and windows the database cannot take from
    /// its clock, are refused by name, from text and in a `Config` alike.
    #[test]
    fn durations_beyond_what_a_server_takes_are_refused_by_name() {
        for (text, key, rule) in [
            ("poll_interval=0.0000001", "poll_interval", "must be at least 1 ms and at most 100 years"),
            ("poll_interval=0.999ms", "poll_interval", "must be at least 1 ms and at most 100 years"),
            ("poll_interval=1000000h", "poll_interval", "must be at least 1 ms and at most 100 years"),
            ("lookback=100000000000", "lookback", "must be greater than 0 and at most 100 years"),
            ("retention=100000000000", "retention", "must be at most 100 years"),
        ] {
            assert_eq!(rule_of(text.parse::<Config>().unwrap_err()), (key, rule), "{text}");
        }
        let century = Duration::from_secs(100 * 365 * 24 * 3600);
        let over = century + Duration::from_secs(1);
        Config { lookback: century, retention: Duration::ZERO, ..Config::default() }.validate().unwrap();
        for (config, key) in [
            (Config { lookback: over, retention: Duration::ZERO, ..Config::default() }, "lookback"),
            (Config { retention: over, ..Config::default() }, "retention"),
            (Config { poll_interval: Duration::from_micros(999), ..Config::default() }, "poll_interval"),
            (
                Config { poll_interval: Duration::MAX, lookback: Duration::MAX, ..Config::default() },
                "poll_interval",
            ),
        ] {
            assert_eq!(rule_of(config.validate().unwrap_err()).0, key);
        }
    }

    #[test]
    fn cleanup_period_is_a_minute_of_polls() {
        let with = |ms| Config { poll_interval: Duration::from_millis(ms), ..Config::default() };
        assert_eq!(with(1000).cleanup_period_polls(), 60);
        assert_eq!(with(50).cleanup_period_polls(), 1200);
        assert_eq!(with(7000).cleanup_period_polls(), 9);
        assert_eq!(with(120_000).cleanup_period_polls(), 1);
    }
}
