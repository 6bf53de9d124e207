//! JSON shapes the dashboard serves and `rowbus`'s `--json` outputs print: one dead
//! letter, one queued message, a payload, a time.

use std::time::SystemTime;

use rowbus::QueuedMessage;
use rowbus::dead::DeadLetter;
use serde_json::{Value, json};

/// A payload in a JSON line: `"payload"` the text, or null with `"payload_hex"` its bytes
/// when they are not UTF-8. Every `--json` output (and the dashboard's) follows it.
pub fn payload(line: &mut serde_json::Value, payload: &[u8]) {
    match std::str::from_utf8(payload) {
        Ok(text) => line["payload"] = text.into(),
        Err(_) => {
            line["payload"] = serde_json::Value::Null;
            line["payload_hex"] = payload.iter().map(|b| format!("{b:02x}")).collect::<String>().into();
        }
    }
}

/// One message as JSON: its id, group, key, priority, attempts, state, when it is
/// claimable or how long its lease has left, publish time, last error and payload (as
/// text, or null with `payload_hex`).
pub fn message(m: &QueuedMessage) -> Value {
    let mut line = json!({
        "id": m.id,
        "group": m.group,
        "key": m.key,
        "priority": m.priority,
        "attempts": m.attempts,
        "state": m.state.as_str(),
        "visible_in_s": m.visible_in.as_secs_f64(),
        "lease_left_s": m.lease_left.map(|d| d.as_secs_f64()),
        "published_at": rfc3339(m.published_at),
        "last_error": m.last_error,
    });
    payload(&mut line, &m.payload);
    line
}

/// One dead letter as JSON, as `rowbus dead list --json` prints it and the dashboard
/// serves it.
pub fn dead_letter(letter: &DeadLetter) -> serde_json::Value {
    let mut line = json!({
        "id": letter.id,
        "group": letter.group,
        "attempts": letter.attempts,
        "last_error": letter.last_error,
        "published_at": rfc3339(letter.published_at),
        "died_at": rfc3339(letter.died_at),
        "priority": letter.priority,
        "key": letter.key,
        "headers": letter.headers,
    });
    payload(&mut line, &letter.payload);
    line
}

/// `time` in RFC 3339, UTC, to the microsecond: `2024-05-01T12:34:56.123456Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_micros()
    )
}

/// The proleptic Gregorian date `days` days after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn times_in_rfc3339() {
        let at = |secs: u64, micros: u64| {
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000005Z");
        assert_eq!(at(1_709_251_199, 999_999), "2024-02-29T23:59:59.999999Z");
        assert_eq!(at(4_102_444_800, 0), "2100-01-01T00:00:00.000000Z");
        assert_eq!(at(1_735_689_599, 0), "2024-12-31T23:59:59.000000Z");
    }
}
