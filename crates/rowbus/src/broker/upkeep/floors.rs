//! Floors: where this broker's claims of a group start reading the ready index, computed
//! a pass after claims asked for one (see `sql::rotation::Floor`).
//!
//! A floor is the priority most ready messages of the group have, and a time no message
//! of the group that is not held by a lease is visible before, less [`SLACK_US`]. Claims
//! read from there: the dead entries before it, the messages the queue already handled,
//! are not read. Computing it reads the whole group, dead versions included, once a pass
//! (a quarter of a second) rather than once a claim.

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

/// Computes `group`'s floor again, into `cell`.
pub(super) async fn compute<DB: Db>(queue: &Queue<DB>, group: &str, cell: &FloorCell) -> Result<(), Error> {
    let Some(sql) = &queue.sql.floor else { return Ok(()) };
    let mut conn = queue.inner().pool.acquire().await?;
    let rows =
        DB::fetch_rows(&mut conn, sql, &[Arg::Text(group)], 0).await.map_err(|e| queue_error(queue, e))?;
    if let Some(floor) = floor_of(&rows, cell.get()) {
        cell.set(floor);
    }
    Ok(())
}

/// The floor the rows of [`Rotating::floor_sql`](crate::sql::Rotating::floor_sql) give:
/// the priority with the most ready messages (the most urgent of those with as many; the
/// `previous` floor's when none is ready), and the oldest `visible_at` of any priority, or
/// "now" when that is earlier, less [`SLACK_US`]. `None` without the row of "now".
fn floor_of(rows: &[TextsAndInts], previous: Floor) -> Option<Floor> {
    let (mut now, mut oldest, mut most) = (None, None::<i64>, None::<(i64, i64)>);
    for row in rows {
        match row.ints[..] {
            [None, None, Some(now_us)] => now = Some(now_us),
            [Some(priority), Some(ready), Some(visible)] => {
                oldest = Some(oldest.map_or(visible, |o| o.min(visible)));
                if ready > 0 && most.is_none_or(|(n, p)| ready > n || (ready == n && priority < p)) {
                    most = Some((ready, priority));
                }
            }
            _ => {}
        }
    }
    let now = now?;
    let priority = match most {
        Some((_, priority)) => i16::try_from(priority).unwrap_or(DEFAULT_PRIORITY),
        None if previous == Floor::NONE => DEFAULT_PRIORITY,
        None => previous.priority,
    };
    let visible = oldest.map_or(now, |o| o.min(now)) - SLACK_US;
    Some(Floor { priority, visible_us: visible.max(0) })
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
        assert_eq!(floor, Floor { priority: 0, visible_us: NOW - SLACK_US });
    }

    #[test]
    fn the_floor_lies_before_the_oldest_waiting_message_of_any_priority() {
        let rows = [
            row([Some(0), Some(10), Some(NOW - 5_000_000)]),
            row([Some(-3), Some(1), Some(NOW - 9_000_000)]),
            row([None, None, Some(NOW)]),
        ];
        let floor = floor_of(&rows, Floor::NONE).unwrap();
        assert_eq!(floor, Floor { priority: 0, visible_us: NOW - 9_000_000 - SLACK_US });
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
        let previous = Floor { priority: 4, visible_us: 1 };
        let rows = [row([Some(9), Some(0), Some(NOW + 3_600_000_000)]), row([None, None, Some(NOW)])];
        let floor = floor_of(&rows, previous).unwrap();
        assert_eq!(floor, Floor { priority: 4, visible_us: NOW - SLACK_US });
    }

    #[test]
    fn without_the_row_of_now_there_is_no_floor() {
        assert_eq!(floor_of(&[row([Some(0), Some(1), Some(NOW)])], Floor::NONE), None);
    }
}
