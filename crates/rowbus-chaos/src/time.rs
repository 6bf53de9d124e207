//! The harness's clock and durations: wall-clock microseconds, which every process of a
//! run shares, and durations for people. Its flags' durations (`500ms`, `30s`, `10m`,
//! `1h`) are read by rowbus's one parser, [`rowbus::duration::parse_duration`].

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
    fn durations_for_people() {
        assert_eq!(human(Duration::from_millis(850)), "850 ms");
        assert_eq!(human(Duration::from_secs(600)), "10 m 0 s");
    }
}
