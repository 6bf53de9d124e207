//! Durations as people write them (`250ms`, `2s`, `1m`, `1h`, `7d`, plain seconds), and the
//! ranges a duration setting must stay in: what a database can add to its clock, and
//! the shortest poll interval.

use std::time::Duration;

/// The longest duration rowbus lets a database add to or take from its clock (a lease,
/// a message's delay, a retry's backoff, a notify table's lookback and retention): 100
/// years of 365 days. Far inside MySQL's and MariaDB's `DATETIME` (year 9999) and
/// PostgreSQL's timestamps, and within an `i64` of microseconds, so that a statement
/// never fails on the arithmetic (MariaDB's "datetime field overflow", PostgreSQL's
/// "interval out of range") nor computes a window before year 1.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The shortest poll interval: 1 ms. A shorter one sends the server a statement after
/// another while nothing happens.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);

/// The range a duration setting must be in.
///
/// ```
/// use std::time::Duration;
/// use notify_table::DurationRange;
///
/// assert!(DurationRange::Positive.contains(Duration::from_secs(30)));
/// assert!(!DurationRange::Positive.contains(Duration::ZERO));
/// assert!(!DurationRange::PollInterval.contains(Duration::from_micros(100)));
/// assert_eq!(DurationRange::Span.rule(), "must be at most 100 years");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationRange {
    /// Zero up to [`MAX_DURATION`]: a delay, a retry's backoff, a retention.
    Span,
    /// Greater than zero, up to [`MAX_DURATION`]: a lease, a lookback.
    Positive,
    /// [`MIN_POLL_INTERVAL`] up to [`MAX_DURATION`]: the time between two polls or claims.
    PollInterval,
}

impl DurationRange {
    /// Whether `duration` is in this range.
    pub fn contains(self, duration: Duration) -> bool {
        let least = match self {
            DurationRange::Span => Duration::ZERO,
            DurationRange::Positive => Duration::from_nanos(1),
            DurationRange::PollInterval => MIN_POLL_INTERVAL,
        };
        (least..=MAX_DURATION).contains(&duration)
    }

    /// What a duration in this range must be, for error messages.
    pub fn rule(self) -> &'static str {
        match self {
            DurationRange::Span => "must be at most 100 years",
            DurationRange::Positive => "must be greater than 0 and at most 100 years",
            DurationRange::PollInterval => "must be at least 1 ms and at most 100 years",
        }
    }
}

/// Text that is not a duration: [`parse_duration`] says what it accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{input}` is not a duration ({reason}): write seconds (2, 0.05) or a number with one unit (250ms, 1.5s, 1m, 1h, 7d)"
)]
pub struct DurationError {
    /// The text as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// The units a number may carry, in nanoseconds.
const UNITS: [(&str, u128); 5] = [
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

/// Fractional digits read; the rest are below a nanosecond even in hours.
const FRACTION_DIGITS: usize = 18;

/// Parses a duration: plain seconds (`2`, `0.05`), or a number with one unit `ms`, `s`,
/// `m`, `h` or `d` (`250ms`, `1.5s`, `1m`, `1h`, `7d`; a day is 24 hours). Digits, at most one decimal point, no sign,
/// no exponent; spaces around it are ignored. Exact to the nanosecond (decimals are not
/// rounded through a float). The range a setting needs is its caller's to check (see
/// [`DurationRange`]).
///
/// ```
/// use std::time::Duration;
/// use notify_table::parse_duration;
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("0.05"), Ok(Duration::from_millis(50)));
/// assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
/// assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
/// assert!(parse_duration("-1s").is_err());
/// assert!(parse_duration("1e12").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let bad = |reason| DurationError { input: text.to_owned(), reason };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(bad("empty"));
    }
    if trimmed.starts_with('-') {
        return Err(bad("negative"));
    }
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(bad("not a plain decimal number"));
    }
    let scale = match unit {
        "" => 1_000_000_000,
        unit => match UNITS.iter().find(|(name, _)| *name == unit) {
            Some(&(_, scale)) => scale,
            None => return Err(bad("the unit must be ms, s, m, h or d, after a plain number")),
        },
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(fraction) || number.ends_with('.') {
        return Err(bad("not a plain decimal number"));
    }
    let too_long = || bad("too long");
    let whole: u128 = whole.parse().map_err(|_| too_long())?;
    let fraction = &fraction[..fraction.len().min(FRACTION_DIGITS)];
    let fraction_nanos = match fraction {
        "" => 0,
        digits => {
            let value: u128 = digits.parse().map_err(|_| too_long())?;
            value * scale / 10u128.pow(digits.len() as u32)
        }
    };
    let nanos = whole.checked_mul(scale).and_then(|n| n.checked_add(fraction_nanos)).ok_or_else(too_long)?;
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_long())?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_plain_seconds_and_exact_decimals() {
        for (text, expected) in [
            ("2", Duration::from_secs(2)),
            ("0.05", Duration::from_millis(50)),
            ("0", Duration::ZERO),
            ("250ms", Duration::from_millis(250)),
            ("2s", Duration::from_secs(2)),
            ("1m", Duration::from_secs(60)),
            ("1h", Duration::from_secs(3600)),
            ("1d", Duration::from_secs(86_400)),
            ("7d", Duration::from_secs(7 * 86_400)),
            ("0.5d", Duration::from_secs(43_200)),
            ("36500d", Duration::from_secs(36_500 * 86_400)),
            ("10m", Duration::from_secs(600)),
            (" 45 ", Duration::from_secs(45)),
            // Decimals, exact to the nanosecond.
            ("1.5s", Duration::from_millis(1500)),
            ("0.1m", Duration::from_secs(6)),
            ("0.25h", Duration::from_secs(900)),
            ("1.5ms", Duration::from_micros(1500)),
            ("0.000001", Duration::from_micros(1)),
            ("0.0000001", Duration::from_nanos(100)),
            ("0.000000000001", Duration::ZERO),
            ("1.0000000000000000000000001", Duration::from_secs(1)),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn refusals_name_the_input_and_the_forms() {
        for text in [
            "",
            " ",
            "-1",
            "-1s",
            "+1",
            "1e12",
            "1E3",
            "NaN",
            "nan",
            "inf",
            "-inf",
            "infinity",
            "soon",
            "5D",
            "1w",
            "2 d",
            "1dd",
            "d",
            "2 s",
            "1.5.2",
            ".5",
            "5.",
            "s",
            "ms",
            "1sm",
            "1min",
            "0x10",
            "1_000",
            "١",
            "99999999999999999999999999999999999999999h",
        ] {
            let err = parse_duration(text).expect_err(text);
            assert_eq!(err.input, text);
            let message = err.to_string();
            assert!(message.starts_with(&format!("`{text}` is not a duration (")), "{message}");
            assert!(message.ends_with("(250ms, 1.5s, 1m, 1h, 7d)"), "{message}");
        }
        assert_eq!(parse_duration("-2s").unwrap_err().reason, "negative");
        assert_eq!(parse_duration("18446744073709551616").unwrap_err().reason, "too long");
        assert_eq!(
            parse_duration("5w").unwrap_err().reason,
            "the unit must be ms, s, m, h or d, after a plain number"
        );
        assert_eq!(parse_duration("999999999999999999999d").unwrap_err().reason, "too long");
    }

    #[test]
    fn ranges() {
        let max = MAX_DURATION;
        let above = max + Duration::from_nanos(1);
        assert!(DurationRange::Span.contains(Duration::ZERO) && DurationRange::Span.contains(max));
        assert!(!DurationRange::Span.contains(above));
        assert!(!DurationRange::Positive.contains(Duration::ZERO));
        assert!(DurationRange::Positive.contains(Duration::from_nanos(1)));
        assert!(!DurationRange::Positive.contains(above));
        assert!(!DurationRange::PollInterval.contains(Duration::from_micros(999)));
        assert!(DurationRange::PollInterval.contains(MIN_POLL_INTERVAL));
        assert!(!DurationRange::PollInterval.contains(above));
        // What the databases were given in the reports: all out of range.
        for secs in [1e12, 1e11] {
            assert!(!DurationRange::Span.contains(Duration::from_secs_f64(secs)));
        }
        assert!(!DurationRange::PollInterval.contains(Duration::from_secs_f64(0.0000001)));
    }
}
