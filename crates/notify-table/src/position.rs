//! Where a subscription stands: its mark, its gaps, the ids read above its mark, its
//! first window. The state a poll is built from and folded into, and nothing else.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

/// Most gaps one [`NotifyTable`](crate::NotifyTable) keeps open over all its channels,
/// and most id ranges one poll statement probes for them (MySQL: 2 bind parameters each,
/// beside 7 per channel for up to [`MAX_CHANNELS`](crate::MAX_CHANNELS) channels).
pub const MAX_GAPS: usize = 1024;

/// A snapshot of one subscription's state: exactly what the core needs to go on
/// polling the channel, and what a listener would store to resume from where it was.
///
/// - Every id up to `mark` has been read, except the ids in `gaps` and in the first
///   window's range.
/// - `gaps`: ids below `mark` no poll has read yet (an open transaction, a rolled-back
///   id, an id another server of a cluster never uses, a row of another channel not
///   read yet), each with the server time at which it was noticed. A gap is probed by
///   every poll until its ids are read or it ages out: once a poll's cutoff (server time
///   minus `lookback`) passes the time it was noticed, any row still missing in it was
///   inserted more than `lookback` before, and the contract lets it go.
/// - `ahead`: ids above `mark` already read and delivered; non-empty only while the gaps
///   are at their bound ([`MAX_GAPS`]), when the mark stays below the first run of
///   missing ids that did not fit and the rows above it are read again each poll, as the
///   old window did, until the run fits or a lookback has passed since the id above it was
///   first read (its ids were handed out before that, so the contract lets them go).
/// - `first_window`: the subscription's first `lookback`, read as a window (see
///   [`FirstWindow`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The highest id known read on the channel (or the subscription's mark).
    pub mark: u64,
    /// Server time minus `lookback` as of the channel's previous statement.
    pub cutoff: String,
    /// The open gaps below `mark`, in id order.
    pub gaps: Vec<Gap>,
    /// Ids above `mark` already delivered, in order.
    pub ahead: Vec<Ahead>,
    /// The first window, while it lasts.
    pub first_window: Option<FirstWindow>,
}

/// An id above a subscription's mark, already read and delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ahead {
    /// The id.
    pub id: u64,
    /// The server time of the poll that first read it; `None` when that poll's head
    /// carried no time.
    pub read_at: Option<String>,
}

/// Ids `first..=last` below a subscription's mark that no poll has read yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The lowest id of the gap.
    pub first: u64,
    /// The highest id of the gap.
    pub last: u64,
    /// The server time of the poll that noticed it (its head row's `at`); `None` when that
    /// poll's head carried no time, and then the gap never ages out.
    pub noticed: Option<String>,
}

/// A subscription's first `lookback`: rows at or below its subscribe mark may still
/// become visible (transactions open at subscribe), and their ids are unknown, so each
/// poll reads the window `created_at >= cutoff AND id <= upto` of the channel and
/// remembers what it got back, as every poll did before gaps. It ends once a poll's cutoff
/// passes `until`, the server time of the subscribe statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstWindow {
    /// The subscribe mark: the highest id the window covers.
    pub upto: u64,
    /// The server time of the subscribe statement; `None` when it carried none, and then
    /// the window never ends.
    pub until: Option<String>,
    /// Ids the window's previous read returned, in order.
    pub seen: Vec<u64>,
}

/// Disjoint id ranges, each with the server time it was noticed at.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gaps {
    ranges: BTreeMap<u64, (u64, Option<Arc<str>>)>,
}

impl Gaps {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges as `(first, last)`, in order.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&first, &(last, _))| (first, last))
    }

    /// Opens the gap `first..=last`, disjoint from every open one.
    pub fn open(&mut self, first: u64, last: u64, noticed: Option<Arc<str>>) {
        debug_assert!(first <= last);
        self.ranges.insert(first, (last, noticed));
    }

    /// Takes `id` out of the gap it is in; whether it was in one. May split a gap in two.
    pub fn take(&mut self, id: u64) -> bool {
        let Some((&first, &(last, _))) = self.ranges.range(..=id).next_back() else { return false };
        if id > last {
            return false;
        }
        let (_, noticed) = self.ranges.remove(&first).expect("found above");
        if first < id {
            self.ranges.insert(first, (id - 1, noticed.clone()));
        }
        if id < last {
            self.ranges.insert(id + 1, (last, noticed));
        }
        true
    }

    /// Closes the gaps noticed before `cutoff`: a row still missing in one was inserted
    /// before the cutoff, more than `lookback` ago.
    pub fn age_out(&mut self, cutoff: &str) {
        self.ranges.retain(|_, (_, noticed)| noticed.as_deref().is_none_or(|at| cutoff <= at));
    }

    pub fn snapshot(&self) -> Vec<Gap> {
        self.ranges
            .iter()
            .map(|(&first, (last, noticed))| Gap {
                first,
                last: *last,
                noticed: noticed.as_deref().map(str::to_owned),
            })
            .collect()
    }
}

/// The first window's state (see [`FirstWindow`]).
#[derive(Debug, Clone)]
pub(crate) struct Window {
    pub upto: u64,
    pub until: Option<Arc<str>>,
    pub seen: HashSet<u64>,
    pub next: HashSet<u64>,
}

impl Window {
    pub fn snapshot(&self) -> FirstWindow {
        let mut seen: Vec<u64> = self.seen.iter().copied().collect();
        seen.sort_unstable();
        FirstWindow { upto: self.upto, until: self.until.as_deref().map(str::to_owned), seen }
    }
}

/// Probe ranges for `ranges` (sorted, possibly overlapping), at most `slots` of them:
/// overlapping and adjacent ranges are joined, then the ranges closest to each other,
/// so that the probes read a superset of the gaps (a row read that is in no gap is
/// known already and the fold passes over it).
pub(crate) fn probes(mut ranges: Vec<(u64, u64)>, slots: usize) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut joined: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (first, last) in ranges {
        match joined.last_mut() {
            Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
            _ => joined.push((first, last)),
        }
    }
    if joined.len() <= slots || slots == 0 {
        return if slots == 0 { Vec::new() } else { joined };
    }
    // Join across the smallest distances until the ranges fit.
    let mut distances: Vec<(u64, usize)> =
        joined.windows(2).enumerate().map(|(i, w)| (w[1].0 - w[0].1, i)).collect();
    distances.sort_unstable();
    let mut join_after: BTreeSet<usize> = BTreeSet::new();
    join_after.extend(distances.iter().take(joined.len() - slots).map(|&(_, i)| i));
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(slots);
    for (i, range) in joined.iter().enumerate() {
        if i > 0 && join_after.contains(&(i - 1)) {
            out.last_mut().expect("joined after a previous range").1 = range.1;
        } else {
            out.push(*range);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_splits_and_reports_membership() {
        let mut gaps = Gaps::default();
        gaps.open(5, 9, None);
        assert!(!gaps.take(4) && !gaps.take(10));
        assert!(gaps.take(7));
        assert_eq!(gaps.ranges().collect::<Vec<_>>(), [(5, 6), (8, 9)]);
        assert!(gaps.take(5) && gaps.take(6) && !gaps.take(6));
        assert_eq!(gaps.ranges().collect::<Vec<_>>(), [(8, 9)]);
    }

    #[test]
    fn gaps_age_out_once_the_cutoff_passes_their_time() {
        let mut gaps = Gaps::default();
        gaps.open(1, 1, Some(Arc::from("2026-11-29 12:00:00.000000")));
        gaps.open(3, 3, Some(Arc::from("2026-11-29 12:00:05.000000")));
        gaps.open(5, 5, None);
        gaps.age_out("2026-11-29 12:00:00.000000");
        assert_eq!(gaps.len(), 3, "a cutoff equal to the time keeps the gap");
        gaps.age_out("2026-11-29 12:00:01.000000");
        assert_eq!(gaps.ranges().collect::<Vec<_>>(), [(3, 3), (5, 5)]);
        gaps.age_out("2999-01-01 00:00:00.000000");
        assert_eq!(gaps.ranges().collect::<Vec<_>>(), [(5, 5)], "no time, no ageing");
    }

    #[test]
    fn probes_join_overlaps_then_the_nearest_ranges() {
        assert_eq!(probes(vec![(5, 6), (1, 2), (3, 3), (10, 12), (11, 20)], 8), [(1, 3), (5, 6), (10, 20)]);
        assert_eq!(
            probes(vec![(1, 1), (3, 3), (10, 10), (12, 12), (40, 40)], 3),
            [(1, 3), (10, 12), (40, 40)]
        );
        assert_eq!(probes(vec![(1, 1), (3, 3), (10, 10)], 1), [(1, 10)]);
        assert_eq!(probes(vec![(1, 1)], 0), []);
        assert!(probes(Vec::new(), 4).is_empty());
    }
}
