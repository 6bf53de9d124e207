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
/// claimable behind the floor (a lease that ran out, a message given back) waits at most
/// this long there. Under a snapshot held for ten minutes at 1,000 messages a second a
/// MariaDB group holds 600,000 delete-marked rows, which the whole computation reads.
const FULL_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Computes `group`'s floor again, into `cell`: the whole of it, or a step from the last.
pub(super) async fn compute<DB: Db>(queue: &Queue<DB>, group: &str, cell: &FloorCell) -> Result<(), Error> {
    let Some(sql) = &queue.sql.floor else { return Ok(()) };
    let previous = cell.get();
    let mut conn = queue.inner().pool.acquire().await?;
    if let Some(step) = &queue.sql.floor_step
        && previous != Floor::NONE
        && cell.full_since().is_some_and(|at| at.elapsed() < FULL_EVERY)
    {
        let (p, since) = (Arg::Int(previous.priority.into()), Arg::Int(previous.visible_us));
        let g = Arg::Text(group);
        let rows = DB::fetch_rows(&mut conn, step, &[g, g, p, since, g, g, p, g, g, p], 0)
            .await
            .map_err(|e| queue_error(queue, e))?;
        if let Some(row) = rows.first() {
            cell.set(stepped(&row.ints, previous));
        }
        return Ok(());
    }
    let rows =
        DB::fetch_rows(&mut conn, sql, &[Arg::Text(group)], 0).await.map_err(|e| queue_error(queue, e))?;
    if let Some(floor) = floor_of(&rows, previous) {
        cell.set(floor);
        cell.computed_whole();
    }
    Ok(())
}

/// The floor a step's row (`[bulk µs, more urgent, less urgent, now µs]`) moves
/// `previous` to: its priority's time to the oldest of its rows from there (or now), less
/// [`SLACK_US`], never back; the other priorities' time as it was; whether they wait.
fn stepped(ints: &[Option<i64>], previous: Floor) -> Floor {
    let (bulk, urgent, lower, now) = match ints {
        [bulk, urgent, lower, Some(now)] => (*bulk, urgent.is_some(), lower.is_some(), *now),
        _ => return previous,
    };
    let visible = (bulk.unwrap_or(now).min(now) - SLACK_US).max(previous.visible_us);
    Floor { visible_us: visible, others: urgent || lower, ..previous }
}

/// The floor the rows of [`Rotating::floor_sql`](crate::sql::Rotating::floor_sql) give:
/// the priority with the most ready messages (the most urgent of those with as many; the
/// `previous` floor's when none is ready); the oldest `visible_at` of that priority's, and
/// of any priority's, or "now" when that is earlier, less [`SLACK_US`]; whether rows wait
/// at other priorities. `None` without the row of "now".
fn floor_of(rows: &[TextsAndInts], previous: Floor) -> Option<Floor> {
    let mut now = None;
    let mut waiting: Vec<(i64, i64, i64)> = Vec::new();
    for row in rows {
        match row.ints[..] {
            [None, None, Some(now_us)] => now = Some(now_us),
            [Some(priority), Some(ready), Some(visible)] => waiting.push((priority, ready, visible)),
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
    Some(Floor { priority, visible_us: bulk, others_us: all, others })
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
        let floor = floor_of(&[row([None, None, Some(NOW)])], Floor::NONE).unwrap();
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
        let floor = floor_of(&rows, Floor::NONE).unwrap();
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
        assert_eq!(floor_of(&rows, Floor::NONE).unwrap().priority, -1);
    }

    #[test]
    fn with_nothing_ready_the_priority_stays_and_delayed_messages_do_not_lift_the_floor() {
        let previous = Floor { priority: 4, visible_us: 1, others_us: 1, others: false };
        let rows = [row([Some(9), Some(0), Some(NOW + 3_600_000_000)]), row([None, None, Some(NOW)])];
        let floor = floor_of(&rows, previous).unwrap();
        let at = NOW - SLACK_US;
        assert_eq!(floor, Floor { priority: 4, visible_us: at, others_us: at, others: true });
    }

    #[test]
    fn a_step_moves_the_priority_s_time_forward_only_and_tells_whether_others_wait() {
        let previous =
            Floor { priority: 0, visible_us: NOW - 2_000_000, others_us: NOW - 9_000_000, others: false };
        let moved = stepped(&[Some(NOW - 1_000_000), None, None, Some(NOW)], previous);
        assert_eq!(moved, Floor { visible_us: NOW - 1_000_000 - SLACK_US, ..previous });
        let none_left = stepped(&[None, Some(1), None, Some(NOW)], previous);
        assert_eq!(none_left, Floor { visible_us: NOW - SLACK_US, others: true, ..previous });
        let older = stepped(&[Some(NOW - 9_000_000), None, Some(1), Some(NOW)], previous);
        assert_eq!(older, Floor { others: true, ..previous }, "never back");
    }

    #[test]
    fn without_the_row_of_now_there_is_no_floor() {
        assert_eq!(floor_of(&[row([Some(0), Some(1), Some(NOW)])], Floor::NONE), None);
    }
}
