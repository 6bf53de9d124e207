//! The harness's clock and durations: wall-clock microseconds, which every process of a
//! run shares, and durations written `500ms`, `30s`, `10m`, `1h`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch: comparable across the driver and its consumer
/// processes (one machine, one clock).
pub(crate) fn now_us() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

/// Microseconds of a duration, for comparing with [`now_us`] stamps.
pub(crate) fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Parses `500ms`, `30s`, `1.5s`, `10m`, `1h`, or a bare number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("invalid duration {text:?}: expected e.g. 30s or 10m"))?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("invalid duration unit {other:?} in {text:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

/// A duration for people: `850 ms`, `12.3 s`, `10 m 0 s`.
pub(crate) fn human(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 1.0 {
        format!("{} ms", d.as_millis())
    } else if secs < 120.0 {
        format!("{secs:.1} s")
    } else {
        format!("{} m {} s", d.as_secs() / 60, d.as_secs() % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
        assert_eq!(human(Duration::from_millis(850)), "850 ms");
        assert_eq!(human(Duration::from_secs(600)), "10 m 0 s");
    }
}
