//! Floors: where this broker's claims of a group start reading the ready index, computed
//! a pass after claims asked for one (see `sql::rotation::Floor`).
//!
//! A floor is the priority most ready messages of the group have, and a time no message
//! of the group that is not held by a lease is visible before, less [`SLACK_US`]. Claims
//! read from there: the dead entries before it, the messages the queue already handled,
//! are not read. Computing it reads the whole group, dead versions included, once a pass
//! (a quarter of a second) rather than once a claim; where the database has a cheaper
//! step (MySQL/MariaDB, whose table keeps every row a held snapshot needs), only every
//! [`FULL_EVERY`], and a step from the floor on between.

use super::registry::FloorCell;
use crate::broker::Queue;
use crate::broker::exec::queue_error;
use crate::driver::{Arg, TextsAndInts};
use crate::error::Error;
use crate::sql::{Db, Floor};

/// How far before the oldest waiting message (or before the database's "now", with none
/// waiting) a floor lies: what a transaction may take between the `INSERT` of a message,
/// whose `visible_at` is the transaction's start, and its commit, for its message to be
/// read by the claims that follow the commit. A message committed later than that after
/// its transaction began is claimed after the next pass. At 1,000 messages a second
/// under a held horizon, a claim steps over the messages handled within this much before
/// the floor: 500 dead index entries, 0.1 ms.
pub(super) const SLACK_US: i64 = 500_000;

/// The priority a floor starts at before any message told: the default one.
const DEFAULT_PRIORITY: i16 = 0;

/// How often the whole floor is computed where steps come between: what becomes
/// claimable behind the floor other than by a lease running out (a message given back, a
/// transaction that committed long after it began) waits at most this long there. Under a
/// snapshot held for ten minutes at 1,000 messages a second a MariaDB group holds 600,000
/// delete-marked rows, which the whole computation reads.
const FULL_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Computes `group`'s floor again, into `cell`: the whole of it, or a step from the last
/// where the database has one, no lease behind the floor has run out since, and the last
/// whole one is younger than [`FULL_EVERY`].
pub(super) async fn compute<DB: Db>(queue: &Queue<DB>, group: &str, cell: &FloorCell) -> Result<(), Error> {
    let Some(sql) = &queue.sql.floor else { return Ok(()) };
    let (previous, steps) = (cell.get(), cell.steps());
    let mut conn = queue.inner().pool.acquire().await?;
    let g = Arg::Text(group);
    if let (Some(step), Some(leases)) = (&queue.sql.floor_step, &queue.sql.floor_leases)
        && previous != Floor::NONE
        && steps.whole_at.is_some_and(|at| at.elapsed() < FULL_EVERY)
        && steps.lease_end_us.is_none_or(|end| end > steps.now_us)
    {
        let p = Arg::Int(previous.priority.into());
        let rows =
            DB::fetch_rows(&mut conn, step, &[g, g, p, Arg::Int(previous.visible_us), g, g, p, g, g, p], 0)
                .await
                .map_err(|e| queue_error(queue, e))?;
        let Some(row) = rows.first() else { return Ok(()) };
        let Some((floor, now_us)) = stepped(&row.ints, previous) else { return Ok(()) };
        // The rows the floor moved over are held by leases, or settled: their earliest
        // lease end is when a step stops being enough.
        let mut lease_end_us = steps.lease_end_us;
        if floor.visible_us > previous.visible_us {
            let range = [g, g, p, Arg::Int(previous.visible_us), Arg::Int(floor.visible_us + SLACK_US)];
            let held =
                DB::fetch_rows(&mut conn, leases, &range, 0).await.map_err(|e| queue_error(queue, e))?;
            if let Some(end) = held.first().and_then(|row| row.ints.first().copied().flatten()) {
                lease_end_us = Some(lease_end_us.map_or(end, |known| known.min(end)));
            }
        }
        cell.set(floor);
        cell.update_steps(|s| {
            s.lease_end_us = lease_end_us;
            s.now_us = now_us;
        });
        return Ok(());
    }
    let rows = DB::fetch_rows(&mut conn, sql, &[g], 0).await.map_err(|e| queue_error(queue, e))?;
    if let Some(whole) = floor_of(&rows, previous) {
        cell.set(whole.floor);
        cell.update_steps(|s| {
            s.whole_at = Some(std::time::Instant::now());
            s.lease_end_us = whole.lease_end_us;
            s.now_us = whole.now_us;
        });
    }
    Ok(())
}

/// The floor a step's row (`[bulk µs, more urgent, less urgent, now µs]`) moves
/// `previous` to: its priority's time to the oldest of its rows from there (or now), less
/// [`SLACK_US`], never back; the other priorities' time as it was; whether they wait. With
/// the database's now.
fn stepped(ints: &[Option<i64>], previous: Floor) -> Option<(Floor, i64)> {
    let [bulk, urgent, lower, Some(now)] = ints else { return None };
    let visible = (bulk.unwrap_or(*now).min(*now) - SLACK_US).max(previous.visible_us);
    Some((Floor { visible_us: visible, others: urgent.is_some() || lower.is_some(), ..previous }, *now))
}

/// A floor computed whole, with what decides the steps after it.
#[derive(Debug, PartialEq, Eq)]
struct Whole {
    floor: Floor,
    /// The earliest lease end of the rows held by a lease, where the rows tell it.
    lease_end_us: Option<i64>,
    /// The database's clock.
    now_us: i64,
}

/// The floor the rows of [`Rotating::floor_sql`](crate::sql::Rotating::floor_sql) give:
/// the priority with the most ready messages (the most urgent of those with as many; the
/// `previous` floor's when none is ready); the oldest `visible_at` of that priority's, and
/// of any priority's, or "now" when that is earlier, less [`SLACK_US`]; whether rows wait
/// at other priorities. `None` without the row of "now".
fn floor_of(rows: &[TextsAndInts], previous: Floor) -> Option<Whole> {
    let mut now = None;
    let mut lease_end_us: Option<i64> = None;
    let mut waiting: Vec<(i64, i64, i64)> = Vec::new();
    for row in rows {
        if let Some(Some(end)) = row.ints.get(3) {
            lease_end_us = Some(lease_end_us.map_or(*end, |known| known.min(*end)));
        }
        match row.ints[..] {
            [None, None, Some(now_us), ..] => now = Some(now_us),
            [Some(priority), Some(ready), Some(visible), ..] => waiting.push((priority, ready, visible)),
            _ => {}
        }
    }
    let now = now?;
    let most = waiting
        .iter()
        .filter(|(_, ready, _)| *ready > 0)
        .max_by_key(|(priority, ready, _)| (*ready, std::cmp::Reverse(*priority)));
    let priority = match most {
        Some((priority, _, _)) => i16::try_from(*priority).unwrap_or(DEFAULT_PRIORITY),
        None if previous == Floor::NONE => DEFAULT_PRIORITY,
        None => previous.priority,
    };
    let floor_of = |rows: &mut dyn Iterator<Item = i64>| (rows.fold(now, i64::min) - SLACK_US).max(0);
    let bulk = floor_of(&mut waiting.iter().filter(|w| w.0 == i64::from(priority)).map(|w| w.2));
    let all = floor_of(&mut waiting.iter().map(|w| w.2));
    let others = waiting.iter().any(|w| w.0 != i64::from(priority));
    Some(Whole {
        floor: Floor { priority, visible_us: bulk, others_us: all, others },
        lease_end_us,
        now_us: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ints: [Option<i64>; 3]) -> TextsAndInts {
        TextsAndInts { texts: Vec::new(), ints: ints.to_vec() }
    }

    const NOW: i64 = 1_000_000_000;

    #[test]
    fn an_empty_group_starts_at_now_less_the_slack_at_the_default_priority() {
        let floor = floor_of(&[row([None, None, Some(NOW)])], Floor::NONE).unwrap().floor;
        let at = NOW - SLACK_US;
        assert_eq!(floor, Floor { priority: 0, visible_us: at, others_us: at, others: false });
    }

    #[test]
    fn the_floor_lies_before_the_oldest_waiting_message_of_any_priority() {
        let rows = [
            row([Some(0), Some(10), Some(NOW - 5_000_000)]),
            row([Some(-3), Some(1), Some(NOW - 9_000_000)]),
            row([None, None, Some(NOW)]),
        ];
        let floor = floor_of(&rows, Floor::NONE).unwrap().floor;
        let (bulk, all) = (NOW - 5_000_000 - SLACK_US, NOW - 9_000_000 - SLACK_US);
        assert_eq!(floor, Floor { priority: 0, visible_us: bulk, others_us: all, others: true });
    }

    #[test]
    fn the_priority_is_the_one_most_ready_messages_have_and_the_most_urgent_on_a_tie() {
        let rows = [
            row([Some(5), Some(2), Some(NOW)]),
            row([Some(1), Some(7), Some(NOW)]),
            row([Some(-1), Some(7), Some(NOW)]),
            row([None, None, Some(NOW)]),
        ];
        assert_eq!(floor_of(&rows, Floor::NONE).unwrap().floor.priority, -1);
    }

    #[test]
    fn with_nothing_ready_the_priority_stays_and_delayed_messages_do_not_lift_the_floor() {
        let previous = Floor { priority: 4, visible_us: 1, others_us: 1, others: false };
        let rows = [row([Some(9), Some(0), Some(NOW + 3_600_000_000)]), row([None, None, Some(NOW)])];
        let floor = floor_of(&rows, previous).unwrap().floor;
        let at = NOW - SLACK_US;
        assert_eq!(floor, Floor { priority: 4, visible_us: at, others_us: at, others: true });
    }

    #[test]
    fn a_step_moves_the_priority_s_time_forward_only_and_tells_whether_others_wait() {
        let previous =
            Floor { priority: 0, visible_us: NOW - 2_000_000, others_us: NOW - 9_000_000, others: false };
        let moved = stepped(&[Some(NOW - 1_000_000), None, None, Some(NOW)], previous);
        assert_eq!(moved, Some((Floor { visible_us: NOW - 1_000_000 - SLACK_US, ..previous }, NOW)));
        let none_left = stepped(&[None, Some(1), None, Some(NOW)], previous);
        assert_eq!(none_left, Some((Floor { visible_us: NOW - SLACK_US, others: true, ..previous }, NOW)));
        let older = stepped(&[Some(NOW - 9_000_000), None, Some(1), Some(NOW)], previous);
        assert_eq!(older, Some((Floor { others: true, ..previous }, NOW)), "never back");
        assert_eq!(stepped(&[None, None, None, None], previous), None, "no clock, no step");
    }

    #[test]
    fn a_whole_floor_keeps_the_earliest_lease_end_and_skips_priorities_with_held_rows_only() {
        let row4 = |ints: [Option<i64>; 4]| TextsAndInts { texts: Vec::new(), ints: ints.to_vec() };
        let rows = [
            row4([Some(0), Some(3), Some(NOW - 1_000_000), Some(NOW + 30_000_000)]),
            row4([Some(2), Some(0), None, Some(NOW + 4_000_000)]),
            row4([None, None, Some(NOW), None]),
        ];
        let whole = floor_of(&rows, Floor::NONE).unwrap();
        let at = NOW - 1_000_000 - SLACK_US;
        assert_eq!(
            whole,
            Whole {
                floor: Floor { priority: 0, visible_us: at, others_us: at, others: false },
                lease_end_us: Some(NOW + 4_000_000),
                now_us: NOW
            }
        );
    }

    #[test]
    fn without_the_row_of_now_there_is_no_floor() {
        assert_eq!(floor_of(&[row([Some(0), Some(1), Some(NOW)])], Floor::NONE), None);
    }
}
