//! A queue's dead-letter statements: reading dead letters, putting them back in the queue
//! table, purging them. Binds are documented with each statement.

use super::{Claiming, Keeping, Pausing, Publishing, Scheduling, Schema, TableSql, placeholders};

impl<DB: Schema + Publishing + Claiming + Pausing + Scheduling + Keeping> TableSql<DB> {
    /// A dead letter's columns as [`DeadRow`](crate::driver::DeadRow) reads them: id, group,
    /// payload, attempts, created_at µs, failed_at µs, last_error, priority, key, headers.
    fn dead_columns() -> String {
        format!(
            "{}, group_name, payload, {}, {}, {}, last_error, {}, msg_key, headers",
            DB::bigint("id"),
            DB::bigint("attempts"),
            DB::micros_of("created_at"),
            DB::micros_of("failed_at"),
            DB::bigint("priority"),
        )
    }

    /// Dead letters, newest first (the latest to die, then the highest id). Binds: the
    /// group when `by_group`, then limit, offset.
    pub fn dead_list(&self, by_group: bool) -> String {
        let filter = if by_group { format!(" WHERE group_name = {}", DB::param(1)) } else { String::new() };
        let first = usize::from(by_group) + 1;
        format!(
            "SELECT {} FROM {}{filter} ORDER BY failed_at DESC, id DESC LIMIT {} OFFSET {}",
            Self::dead_columns(),
            self.dead,
            DB::param(first),
            DB::param(first + 1)
        )
    }

    /// One dead letter. Binds: id.
    pub fn dead_get(&self) -> String {
        format!("SELECT {} FROM {} WHERE id = {}", Self::dead_columns(), self.dead, DB::param(1))
    }

    /// Locks the dead letters `ids` that are still there, until the transaction ends: a
    /// second requeue of them waits, then finds them gone. Returns group, id. Binds: the
    /// ids.
    pub fn dead_lock_ids(&self, ids: usize) -> String {
        format!(
            "SELECT group_name, {} FROM {} WHERE id IN ({}){}",
            DB::bigint("id"),
            self.dead,
            placeholders::<DB>(1, ids),
            DB::FOR_UPDATE
        )
    }

    /// Locks up to a limit of dead letters, lowest id first, those that died before a
    /// time when `older`. Returns group, id. Binds: when `older`, the µs from now to that
    /// time (negative: in the past); then the limit.
    pub fn dead_lock_some(&self, older: bool) -> String {
        let filter =
            if older { format!(" WHERE failed_at < {}", DB::later(&DB::param(1))) } else { String::new() };
        format!(
            "SELECT group_name, {} FROM {}{filter} ORDER BY id LIMIT {}{}",
            DB::bigint("id"),
            self.dead,
            DB::param(usize::from(older) + 1),
            DB::FOR_UPDATE
        )
    }

    /// Copies the dead letters `ids` back into the queue table: same id, group, payload,
    /// priority, key, headers, publish time and last error, no attempt counted, claimable
    /// after a delay (a keyed one keeps its place before later messages of its key).
    /// Binds: delay µs, then the ids.
    pub fn dead_requeue(&self, ids: usize) -> String {
        format!(
            "INSERT INTO {} (id, group_name, payload, attempts, visible_at, created_at, last_error, \
             priority, msg_key, headers) \
             SELECT id, group_name, payload, 0, {}, created_at, last_error, priority, msg_key, headers \
             FROM {} WHERE id IN ({})",
            self.quoted,
            DB::later(&DB::param(1)),
            self.dead,
            placeholders::<DB>(2, ids)
        )
    }

    /// Deletes the dead letters `ids`. Binds: the ids.
    pub fn dead_delete(&self, ids: usize) -> String {
        format!("DELETE FROM {} WHERE id IN ({})", self.dead, placeholders::<DB>(1, ids))
    }

    /// Deletes every dead letter, or with `older` those that died before a time. Binds:
    /// when `older`, the µs from now to that time (negative: in the past).
    pub fn dead_purge(&self, older: bool) -> String {
        match older {
            true => format!("DELETE FROM {} WHERE failed_at < {}", self.dead, DB::later(&DB::param(1))),
            false => format!("DELETE FROM {}", self.dead),
        }
    }
}
