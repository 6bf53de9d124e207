//! Throughput for the page's chart, from the server's samples of each queue table: the
//! database counts no handled message, but a queue table's ids come from a sequence that
//! only grows ([`Queue::published_total`](rowbus::Queue::published_total)), so between two
//! samples what was published is the rise of that count, and what left the table is that
//! less the rise of the depth.

use std::collections::BTreeMap;
use std::time::Duration;

use rowbus::Db;
use serde_json::{Value, json};

use crate::App;
use crate::figures::Line;

/// One sample of a queue table: when (ms since the Unix epoch), its depth and its dead
/// letters (all groups together; `None` without a dead-letter table), and how many messages
/// were ever published to it (`None` when it could not be read).
pub(crate) type Sample = (u64, i64, Option<i64>, Option<u64>);

/// The shortest interval a rate is taken over: two samples are 2 s apart, and one message
/// in 2 s would read as a spike of 30 a minute.
pub(crate) const RATE_STEP: Duration = Duration::from_secs(10);

/// The rates of one interval between two samples, per minute.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rates {
    pub(crate) from_ms: u64,
    pub(crate) to_ms: u64,
    /// Messages published: the rise of the published total.
    pub(crate) published: f64,
    /// Messages that left the queue table (acknowledged, dropped or dead-lettered):
    /// published less the rise of the depth.
    pub(crate) handled: f64,
    /// The rise of the dead letters.
    pub(crate) dead_lettered: f64,
}

impl Rates {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "from_ms": self.from_ms,
            "to_ms": self.to_ms,
            "published_per_min": self.published,
            "handled_per_min": self.handled,
            "dead_lettered_per_min": self.dead_lettered,
        })
    }
}

/// The rates over consecutive intervals of at least `step`, oldest first, from `samples`
/// (oldest first). An interval needs the published total at both ends: a sample without
/// it starts the next interval afresh. A requeue or purge of dead letters, which moves
/// messages without publishing, makes its interval's handled or dead-lettered count low;
/// they are never below 0.
pub(crate) fn rates(samples: &[Sample], step: Duration) -> Vec<Rates> {
    let step_ms = step.as_millis() as u64;
    let mut rates = Vec::new();
    let mut start: Option<&Sample> = None;
    for sample in samples {
        let Some(published) = sample.3 else {
            start = None;
            continue;
        };
        let Some(from) = start else {
            start = Some(sample);
            continue;
        };
        let elapsed_ms = sample.0.saturating_sub(from.0);
        if elapsed_ms < step_ms || elapsed_ms == 0 {
            continue;
        }
        let per_minute = |n: i64| (n.max(0) as f64) * 60_000.0 / elapsed_ms as f64;
        // A table dropped and made again starts its ids afresh: nothing to say of that interval.
        let rise =
            i64::try_from(published).unwrap_or(i64::MAX) - i64::try_from(from.3.unwrap_or(0)).unwrap_or(0);
        if rise >= 0 {
            rates.push(Rates {
                from_ms: from.0,
                to_ms: sample.0,
                published: per_minute(rise),
                handled: per_minute(rise - (sample.1 - from.1)),
                dead_lettered: per_minute(sample.2.unwrap_or(0) - from.2.unwrap_or(0)),
            });
        }
        start = Some(sample);
    }
    rates
}

impl<DB: Db> App<DB> {
    /// The published total of each queue table in `lines`, by name; a table whose total
    /// cannot be read (on PostgreSQL, a role without SELECT or USAGE on its id sequence)
    /// is left out, and its samples carry none.
    pub(crate) async fn published_totals(&self, lines: &[Line]) -> BTreeMap<String, u64> {
        let mut totals = BTreeMap::new();
        for Line { table, .. } in lines {
            let name = table.channel();
            if totals.contains_key(name) {
                continue;
            }
            if let Ok(total) = async { self.broker.queue(&table.to_string())?.published_total().await }.await
            {
                totals.insert(name.to_owned(), total);
            }
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples 2 s apart over a minute and a bit: 6 published and the queue drained to 0
    /// (one dead-lettered), then a sample missing its total, then quiet.
    #[test]
    fn per_minute_rates_from_samples() {
        let s = |t_s: u64, depth: i64, dead: i64, published: Option<u64>| {
            (t_s * 1000, depth, Some(dead), published)
        };
        let samples = [
            s(0, 4, 0, Some(10)),
            // Under the step: no rate ends here.
            s(2, 5, 0, Some(11)),
            // 10 s after the first: 6 published, depth 4 -> 0, 1 dead letter more.
            s(10, 0, 1, Some(16)),
            // 30 s on: 2 published, 1 left, the depth up by 1.
            s(40, 1, 1, Some(18)),
            // Its total unreadable: the next interval starts after it.
            s(42, 1, 1, None),
            s(44, 1, 1, Some(18)),
            s(54, 1, 1, Some(18)),
        ];
        let got = rates(&samples, RATE_STEP);
        let rate = |from: u64, to: u64, published: f64, handled: f64, dead_lettered: f64| Rates {
            from_ms: from * 1000,
            to_ms: to * 1000,
            published,
            handled,
            dead_lettered,
        };
        assert_eq!(
            got,
            [
                // 6 in 10 s: 36 a minute; 6 + 4 left the table: 60; 1 dead: 6.
                rate(0, 10, 36.0, 60.0, 6.0),
                // 2 in 30 s: 4 a minute; 2 - 1 left: 2; no dead letter.
                rate(10, 40, 4.0, 2.0, 0.0),
                rate(44, 54, 0.0, 0.0, 0.0),
            ]
        );
    }

    /// Dead letters requeued (fewer dead, the depth up, nothing published) read as 0, not
    /// as negative rates; a published total that fell (the table made again) gives no rate.
    #[test]
    fn rates_never_below_zero() {
        let samples =
            [(0, 0, Some(3), Some(5)), (10_000, 3, Some(0), Some(5)), (20_000, 0, Some(0), Some(0))];
        let got = rates(&samples, RATE_STEP);
        assert_eq!(
            got,
            [Rates { from_ms: 0, to_ms: 10_000, published: 0.0, handled: 0.0, dead_lettered: 0.0 }]
        );
    }
}
