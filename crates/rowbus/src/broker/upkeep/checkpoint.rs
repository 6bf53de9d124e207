//! Checkpoints of the database's log where a reader held elsewhere stops them (SQLite's
//! WAL): a passive one now and then, and a warning while a reader keeps the WAL from
//! starting over.
//!
//! SQLite copies the WAL into the database and starts it over once every frame in it is
//! copied, which a reader's open transaction prevents: the frames after its snapshot
//! stay, and the WAL grows with every write until that transaction ends. rowbus's own
//! connections hold no read transaction between statements; what holds one is another
//! program (a backup, a report, a shell left in `BEGIN`).

use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::broker::Queue;
use crate::broker::exec::queue_error;
use crate::error::Error;
use crate::sql::Db;

/// How long checkpoints stop short before the warning: a reader's usual transaction ends
/// well before, and only one held this long is worth a line.
const HELD_REPORT: Duration = Duration::from_secs(10);

/// One queue's checkpoints: since when they stop short, and whether that was said.
#[derive(Debug, Default)]
pub(super) struct Checkpoints {
    held_since: Option<Instant>,
    reported: bool,
}

impl Checkpoints {
    /// Runs a checkpoint where the database has one, and says when a reader holds the
    /// log for longer than [`HELD_REPORT`], and when it no longer does.
    pub(super) async fn pass<DB: Db>(&mut self, queue: &Queue<DB>) -> Result<(), Error> {
        let Some(sql) = &queue.sql.checkpoint else { return Ok(()) };
        let mut conn = queue.inner().pool.acquire().await?;
        let rows = DB::fetch_rows(&mut conn, sql, &[], 0).await.map_err(|e| queue_error(queue, e))?;
        let Some(row) = rows.first() else { return Ok(()) };
        let (frames, copied) = match row.ints[..] {
            [_, Some(frames), Some(copied)] => (frames, copied),
            _ => return Ok(()),
        };
        let held = held(frames, copied);
        queue.inner().counters.checkpointed(held);
        self.update(queue, held, frames - copied);
        Ok(())
    }

    fn update<DB: Db>(&mut self, queue: &Queue<DB>, held: bool, frames_left: i64) {
        if !held {
            if std::mem::take(&mut self.reported) {
                info!(table = %queue.table(), "SQLite's WAL is copied to its end again and starts over");
            }
            self.held_since = None;
            return;
        }
        let since = *self.held_since.get_or_insert_with(Instant::now);
        if !self.reported && since.elapsed() >= HELD_REPORT {
            self.reported = true;
            warn!(
                table = %queue.table(),
                frames_left,
                "a read transaction held elsewhere keeps SQLite's WAL from starting over: it grows with every write until that transaction ends"
            );
        }
    }
}

/// Whether a checkpoint's row (frames in the WAL, frames copied) says a reader stopped it
/// short; `-1`s (not in WAL mode) say nothing.
fn held(frames: i64, copied: i64) -> bool {
    frames >= 0 && copied >= 0 && copied < frames
}

#[cfg(test)]
mod tests {
    use super::held;

    #[test]
    fn a_checkpoint_is_held_only_when_it_stopped_before_the_wal_s_end() {
        assert!(!held(0, 0), "an empty WAL");
        assert!(!held(120, 120), "copied to its end");
        assert!(held(120, 40), "a reader holds the frames after its snapshot");
        assert!(!held(-1, -1), "not in WAL mode");
    }
}
