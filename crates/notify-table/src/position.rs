//! Where a subscription stands: its mark, its gaps, the ids read above its mark, its
//! first window. The state a poll is built from and folded into, and nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::sync::Arc;

/// Most gaps one [`NotifyTable`](crate::NotifyTable) keeps open over all its channels,
/// and most id ranges one poll statement probes for them (MySQL: 2 bind parameters each,
/// beside 7 per channel for up to [`MAX_CHANNELS`](crate::MAX_CHANNELS) channels).
pub const MAX_GAPS: usize = 1024;

/// A snapshot of one subscription's state: exactly what the core needs to go on
/// polling the channel, and what a listener would store to resume from where it was.
///
/// - Every id up to `mark` has been read, except the ids in `gaps` and those the first
///   window still watches.
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

impl Position {
    /// The lowest id this position may still deliver: below it, every row of the channel
    /// has been read (or let go). A cleanup that must not lose what this position has
    /// not read deletes only the channel's rows below it (see
    /// [`NotifyTable::cleanup_sql_holding`](crate::NotifyTable::cleanup_sql_holding)).
    pub fn first_unread(&self) -> u64 {
        let window = self.first_window.iter().flat_map(|w| w.missing.first()).map(|r| *r.start());
        let gap = self.gaps.first().map(|gap| gap.first);
        window.chain(gap).min().unwrap_or(self.mark.saturating_add(1))
    }

    /// Whether a subscription can be in this state: gaps disjoint, in order and below
    /// the mark; ids ahead in order above it; the first window at or below it; on SQLite
    /// (`ordered`) none of them. Times must not hold the separators of the text form.
    pub(crate) fn check(&self, ordered: bool) -> Result<(), &'static str> {
        if ordered && (!self.gaps.is_empty() || !self.ahead.is_empty() || self.first_window.is_some()) {
            return Err("SQLite subscriptions have no gaps, ids ahead or first window");
        }
        let mut below = 0;
        for (i, gap) in self.gaps.iter().enumerate() {
            if gap.first > gap.last || gap.last >= self.mark || (i > 0 && gap.first <= below) {
                return Err("the gaps must be disjoint ranges in id order below the mark");
            }
            below = gap.last.saturating_add(1);
        }
        if self.gaps.len() > MAX_GAPS {
            return Err("more gaps than a listener keeps open");
        }
        let mut last = self.mark;
        for ahead in &self.ahead {
            if ahead.id <= last {
                return Err("the ids ahead must be above the mark, in order");
            }
            last = ahead.id;
        }
        if let Some(window) = &self.first_window {
            if window.upto > self.mark {
                return Err("the first window must end at or below the mark");
            }
            let mut below = 1;
            for range in &window.missing {
                if range.start() < &below || range.start() > range.end() || *range.end() > window.upto {
                    return Err(
                        "the first window's ids must be disjoint ranges in id order from 1 to its end",
                    );
                }
                below = range.end().saturating_add(1);
            }
            if self.gaps.first().is_some_and(|gap| gap.first <= window.upto) {
                return Err("the gaps must lie above the first window");
            }
        }
        let times = std::iter::once(Some(self.cutoff.as_str()))
            .chain(self.gaps.iter().map(|g| g.noticed.as_deref()))
            .chain(self.ahead.iter().map(|a| a.read_at.as_deref()))
            .chain(self.first_window.iter().map(|w| w.until.as_deref()));
        if times.flatten().any(|t| t.contains(SEPARATORS)) {
            return Err("a time holds one of the characters | ; @ # ,");
        }
        Ok(())
    }
}

/// The characters the text form of a [`Position`] separates its parts with.
const SEPARATORS: [char; 5] = ['|', ';', '@', '#', ','];

/// The text a position is stored as, one line: `V|mark|cutoff|gaps|ahead|window`, where
/// gaps are `first-last[@noticed]` joined by `;`, ids ahead `id[@read_at]` joined by `;`,
/// and the first window, if any, `upto[@until]#first-last,first-last,...` (the ids it
/// watches). The version `V` is `2` with a first window and `1` without, the form an older
/// rowbus reads too (its first window, `upto[@until]#id,id,...`, listed the ids it had read).
impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn time(f: &mut std::fmt::Formatter<'_>, t: Option<&str>) -> std::fmt::Result {
            t.map_or(Ok(()), |t| write!(f, "@{t}"))
        }
        let version = if self.first_window.is_some() { 2 } else { 1 };
        write!(f, "{version}|{}|{}|", self.mark, self.cutoff)?;
        for (i, gap) in self.gaps.iter().enumerate() {
            write!(f, "{}{}-{}", if i > 0 { ";" } else { "" }, gap.first, gap.last)?;
            time(f, gap.noticed.as_deref())?;
        }
        f.write_str("|")?;
        for (i, ahead) in self.ahead.iter().enumerate() {
            write!(f, "{}{}", if i > 0 { ";" } else { "" }, ahead.id)?;
            time(f, ahead.read_at.as_deref())?;
        }
        f.write_str("|")?;
        if let Some(window) = &self.first_window {
            write!(f, "{}", window.upto)?;
            time(f, window.until.as_deref())?;
            f.write_str("#")?;
            for (i, range) in window.missing.iter().enumerate() {
                write!(f, "{}{}-{}", if i > 0 { "," } else { "" }, range.start(), range.end())?;
            }
        }
        Ok(())
    }
}

/// Reads the text form [`Display`](std::fmt::Display) writes.
impl std::str::FromStr for Position {
    type Err = crate::Error;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |reason| crate::Error::BadPositionText { reason };
        let int = |s: &str| s.parse::<u64>().map_err(|_| bad("an id is not a number"));
        let timed = |s: &str| match s.split_once('@') {
            Some((head, t)) => (head.to_owned(), Some(t.to_owned())),
            None => (s.to_owned(), None),
        };
        let list = |s: &'_ str| -> Vec<String> {
            if s.is_empty() { Vec::new() } else { s.split(';').map(str::to_owned).collect() }
        };
        let parts: Vec<&str> = text.split('|').collect();
        let [version, mark, cutoff, gaps, ahead, window] = parts[..] else {
            return Err(bad("not six parts separated by |"));
        };
        let legacy = match version {
            "1" => true,
            "2" => false,
            _ => return Err(bad("an unknown version; it was written by a newer rowbus")),
        };
        let gaps = list(gaps)
            .iter()
            .map(|g| {
                let (range, noticed) = timed(g);
                let (first, last) = range.split_once('-').ok_or_else(|| bad("a gap is not first-last"))?;
                Ok(Gap { first: int(first)?, last: int(last)?, noticed })
            })
            .collect::<Result<_, Self::Err>>()?;
        let ahead = list(ahead)
            .iter()
            .map(|a| {
                let (id, read_at) = timed(a);
                Ok(Ahead { id: int(&id)?, read_at })
            })
            .collect::<Result<_, Self::Err>>()?;
        let first_window = if window.is_empty() {
            None
        } else {
            let (head, ids) = window.split_once('#').ok_or_else(|| bad("a first window without #"))?;
            let (upto, until) = timed(head);
            let upto = int(&upto)?;
            let ids: Vec<&str> = if ids.is_empty() { Vec::new() } else { ids.split(',').collect() };
            let missing = if legacy {
                // An older rowbus re-read the window from its cutoff and listed the ids it
                // got back: every other id up to its end may still be delivered.
                let mut seen = ids.into_iter().map(int).collect::<Result<Vec<u64>, _>>()?;
                seen.sort_unstable();
                complement(&seen, upto)
            } else {
                ids.into_iter()
                    .map(|r| {
                        let (first, last) = r
                            .split_once('-')
                            .ok_or_else(|| bad("a first window's ids are not first-last"))?;
                        Ok(int(first)?..=int(last)?)
                    })
                    .collect::<Result<_, Self::Err>>()?
            };
            Some(FirstWindow { upto, until, missing })
        };
        Ok(Position { mark: int(mark)?, cutoff: cutoff.to_owned(), gaps, ahead, first_window })
    }
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
/// become visible (transactions open at subscribe). The subscribe statement read the ids
/// of the lookback window, so the ids below the mark that it did not find are known:
/// each poll probes them with the gaps, and delivers a row found there on the
/// subscription's channel when it was inserted no earlier than the subscription's cutoff
/// (as a poll that re-read the window `created_at >= cutoff` would have found it). It
/// ends once a poll's cutoff passes `until`, the server time of the subscribe statement,
/// or when no id is left to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstWindow {
    /// The subscribe mark: the highest id the window covers.
    pub upto: u64,
    /// The server time of the subscribe statement; `None` when it carried none, and then
    /// the window ends only when no id is left to watch.
    pub until: Option<String>,
    /// The ids up to `upto` no statement has read yet, as disjoint ranges in id order.
    pub missing: Vec<RangeInclusive<u64>>,
}

/// The ids from 1 to `upto` that are not in `seen` (sorted), as ranges.
fn complement(seen: &[u64], upto: u64) -> Vec<RangeInclusive<u64>> {
    let mut missing = Vec::new();
    let mut from = 1u64;
    for &id in seen.iter().filter(|&&id| id <= upto) {
        if id > from {
            missing.push(from..=id - 1);
        }
        from = from.max(id.saturating_add(1));
    }
    if from <= upto {
        missing.push(from..=upto);
    }
    missing
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

    /// The gaps of a stored position (checked disjoint and in order).
    pub fn from_snapshot(gaps: Vec<Gap>) -> Self {
        Gaps { ranges: gaps.into_iter().map(|g| (g.first, (g.last, g.noticed.map(Arc::from)))).collect() }
    }

    /// Opens the gap `first..=last`, disjoint from every open one.
    pub fn open(&mut self, first: u64, last: u64, noticed: Option<Arc<str>>) {
        debug_assert!(first <= last);
        self.ranges.insert(first, (last, noticed));
    }

    /// Whether `id` is in a gap.
    pub fn contains(&self, id: u64) -> bool {
        self.ranges.range(..=id).next_back().is_some_and(|(_, &(last, _))| id <= last)
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
    /// The ids still watched (their times unused: the window ends as a whole).
    pub missing: Gaps,
}

impl Window {
    /// The window of a subscribe statement that took mark `upto` at server time `until`
    /// and read the ids `read` (sorted; the lowest is the window's floor, below which no
    /// id is watched); `None` when it watches no id.
    pub fn seeded(upto: u64, until: Option<Arc<str>>, read: &[u64]) -> Option<Self> {
        let mut missing = Gaps::default();
        let mut from = read.first().map_or(1, |&floor| floor.saturating_add(1));
        for &id in read.iter().skip(1).take_while(|&&id| id <= upto) {
            if id > from {
                missing.open(from, id - 1, None);
            }
            from = from.max(id.saturating_add(1));
        }
        if from <= upto {
            missing.open(from, upto, None);
        }
        (!missing.is_empty()).then_some(Window { upto, until, missing })
    }

    /// The first window of a stored position.
    pub fn from_snapshot(window: FirstWindow) -> Self {
        let missing =
            window.missing.into_iter().map(|r| Gap { first: *r.start(), last: *r.end(), noticed: None });
        Window {
            upto: window.upto,
            until: window.until.map(Arc::from),
            missing: Gaps::from_snapshot(missing.collect()),
        }
    }

    pub fn snapshot(&self) -> FirstWindow {
        FirstWindow {
            upto: self.upto,
            until: self.until.as_deref().map(str::to_owned),
            missing: self.missing.ranges().map(|(first, last)| first..=last).collect(),
        }
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

#[cfg(test)]
mod text_tests {
    use super::*;

    fn full() -> Position {
        Position {
            mark: 40,
            cutoff: "2026-11-29 12:00:00.000000".into(),
            gaps: vec![
                Gap { first: 33, last: 35, noticed: Some("2026-11-29 12:00:01.000000".into()) },
                Gap { first: 39, last: 39, noticed: None },
            ],
            ahead: vec![
                Ahead { id: 42, read_at: Some("2026-11-29 12:00:02.5".into()) },
                Ahead { id: 44, read_at: None },
            ],
            first_window: Some(FirstWindow {
                upto: 30,
                until: Some("2026-11-29 12:01:00.0".into()),
                missing: vec![2..=4, 7..=7],
            }),
        }
    }

    #[test]
    fn the_text_form_round_trips() {
        let empty = Position { mark: 0, cutoff: "c".into(), gaps: vec![], ahead: vec![], first_window: None };
        let untimed_window = Position {
            mark: 3,
            first_window: Some(FirstWindow { upto: 3, until: None, missing: vec![1..=3] }),
            ..empty.clone()
        };
        for p in [full(), empty, untimed_window] {
            let text = p.to_string();
            assert_eq!(text.parse::<Position>(), Ok(p.clone()), "{text}");
            assert_eq!(p.check(false), Ok(()));
        }
        assert_eq!(
            full().to_string(),
            "2|40|2026-11-29 12:00:00.000000|33-35@2026-11-29 12:00:01.000000;39-39|42@2026-11-29 12:00:02.5;44|\
             30@2026-11-29 12:01:00.0#2-4,7-7"
        );
        let mut no_window = full();
        no_window.first_window = None;
        assert!(no_window.to_string().starts_with("1|40|"), "without a first window, the older form");
        for bad in ["", "3|0|c|||", "1|x|c|||", "1|0|c|3|", "1|0|c||||", "2|5|c|||5#1,2"] {
            assert!(bad.parse::<Position>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn an_older_first_window_reads_as_the_ids_it_had_not_read() {
        // An older rowbus listed the ids its window had read: 1, 4 and 5 up to 8.
        let old: Position = "1|9|c||10|8@2026-11-29 12:01:00.0#5,1,4".parse().unwrap();
        let window = old.first_window.clone().unwrap();
        assert_eq!((window.upto, window.until.as_deref()), (8, Some("2026-11-29 12:01:00.0")));
        assert_eq!(window.missing, vec![2..=3, 6..=8]);
        assert_eq!(old.check(false), Ok(()));
        let none_read: Position = "1|9|c|||8#".parse().unwrap();
        assert_eq!(none_read.first_window.unwrap().missing, vec![1..=8]);
        let all_read: Position = "1|3|c|||2#1,2".parse().unwrap();
        assert_eq!(all_read.first_window.unwrap().missing, vec![]);
    }

    #[test]
    fn a_subscribe_seeds_the_ids_it_did_not_read_above_its_floor() {
        let ranges = |w: Option<Window>| w.map(|w| w.snapshot().missing);
        // Floor 3 (the last row before the window), then 4, 5, 8 and 12 (above the mark).
        assert_eq!(ranges(Window::seeded(10, None, &[3, 4, 5, 8, 12])), Some(vec![6..=7, 9..=10]));
        assert_eq!(ranges(Window::seeded(8, None, &[0, 1, 2, 3, 4, 5, 6, 7, 8])), None, "nothing missing");
        assert_eq!(
            ranges(Window::seeded(4, None, &[0, 3, 4])),
            Some(vec![1..=2]),
            "no row before the window"
        );
        assert_eq!(ranges(Window::seeded(4, None, &[])), Some(vec![1..=4]), "nothing read: every id");
        assert_eq!(ranges(Window::seeded(4, None, &[6])), None, "the floor above the mark");
    }

    #[test]
    fn first_unread_is_the_lowest_id_still_owed() {
        let mut p = full();
        assert_eq!(p.first_unread(), 2, "the first window's lowest id");
        p.first_window = None;
        assert_eq!(p.first_unread(), 33);
        p.gaps.clear();
        assert_eq!(p.first_unread(), 41);
    }

    #[test]
    fn check_refuses_what_no_subscription_holds() {
        let mut p = full();
        assert!(p.check(true).is_err(), "SQLite has none of these");
        p.ahead[0].id = 40;
        assert!(p.check(false).is_err());
        let mut p = full();
        p.cutoff = "a|b".into();
        assert!(p.check(false).is_err());
        let mut p = full();
        p.first_window.as_mut().unwrap().upto = 41;
        assert!(p.check(false).is_err());
        for missing in [vec![0..=1], vec![4..=5, 5..=6], vec![RangeInclusive::new(3, 2)], vec![29..=31]] {
            let mut p = full();
            p.first_window.as_mut().unwrap().missing = missing;
            assert!(p.check(false).is_err());
        }
        let mut p = full();
        p.gaps[0].first = 30;
        assert!(p.check(false).is_err(), "a gap within the first window");
    }
}
