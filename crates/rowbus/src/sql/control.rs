//! The statements of job control: cancelling messages whatever their state, and the
//! runner's periodic look at the messages its handlers hold (is each still there, still
//! under its lease?), with the heartbeat that extends their leases. Binds are documented
//! with each statement.

use super::{
    ById, Claiming, Keeping, Pausing, Publishing, Scheduling, Schema, TableSql, pairs_filter_from,
    placeholders,
};

/// The columns a cancel's lock returns: group, then id, whether it is running (leased, the
/// lease not run out: 1 or 0), whether it has an ordering key (1 or 0).
fn cancel_columns<DB: Schema>() -> String {
    format!(
        "group_name, {}, {}, {}",
        DB::bigint("id"),
        DB::bigint(&format!("CASE WHEN lease IS NOT NULL AND lease_until > {} THEN 1 ELSE 0 END", DB::NOW)),
        DB::bigint("CASE WHEN msg_key IS NULL THEN 0 ELSE 1 END"),
    )
}

impl<DB: Schema + Publishing + Claiming + Pausing + Scheduling + Keeping> TableSql<DB> {
    /// Locks the messages `ids` that are there, whatever their state, until the
    /// transaction ends: a second cancel of them waits, then finds them gone. Returns
    /// group, id, running, keyed (see `cancel_columns`). Binds: the ids.
    pub fn cancel_lock_ids(&self, ids: usize) -> String {
        format!(
            "SELECT {} FROM {}{}",
            cancel_columns::<DB>(),
            DB::by_id(&self.quoted, ById::Ids(ids)),
            DB::FOR_UPDATE
        )
    }

    /// Locks up to a limit of one group's messages, lowest id first, whatever their state.
    /// Returns what [`cancel_lock_ids`](Self::cancel_lock_ids) does. Binds: group, limit.
    pub fn cancel_lock_group(&self) -> String {
        format!(
            "SELECT {} FROM {} WHERE group_name = {} ORDER BY id LIMIT {}{}",
            cancel_columns::<DB>(),
            self.quoted,
            DB::param(1),
            DB::param(2),
            DB::FOR_UPDATE
        )
    }

    /// Where each of the messages `ids` stands, for the runner that holds them: id, lease
    /// token (NULL when not leased), whether its lease still runs (1 or 0). A message not
    /// returned is gone. Binds: the ids.
    pub fn lease_check(&self, ids: usize) -> String {
        format!(
            "SELECT {}, {}, {} FROM {} WHERE id IN ({})",
            DB::bigint("id"),
            DB::bigint("lease"),
            DB::bigint(&format!("CASE WHEN lease_until > {} THEN 1 ELSE 0 END", DB::NOW)),
            self.quoted,
            placeholders::<DB>(1, ids)
        )
    }

    /// Extends the leases of `pairs` messages, each under its own token and only while it
    /// still runs (as [`extend`](TableSql::extend)): a heartbeat. A lease that ran out
    /// stays run out, and the look that follows finds it lost. Binds: lease µs, the ids,
    /// then (id, token) pairs.
    pub fn extend_pairs(&self, pairs: usize) -> String {
        format!(
            "UPDATE {} SET lease_until = {} WHERE {} AND lease_until > {}",
            self.quoted,
            DB::later(&DB::param(1)),
            pairs_filter_from::<DB>(2, pairs),
            DB::NOW
        )
    }
}

#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
mod tests {
    use crate::sql::TableSql;

    #[test]
    fn the_heartbeat_binds_the_lease_first() {
        let t = TableSql::<sqlx::Postgres>::new(&"jobs".parse().unwrap()).unwrap();
        assert_eq!(
            t.extend_pairs(2),
            "UPDATE \"jobs\" SET lease_until = now() + $1 * interval '1 microsecond' \
             WHERE id IN ($2, $3) AND (id, lease) IN (($4, $5), ($6, $7)) AND lease_until > now()"
        );
        let t = TableSql::<sqlx::Sqlite>::new(&"jobs".parse().unwrap()).unwrap();
        assert!(t.extend_pairs(1).contains("WHERE id IN (?) AND (id, lease) IN ((?, ?)) AND lease_until > "));
        assert!(t.lease_check(2).ends_with("FROM `jobs` WHERE id IN (?, ?)"));
    }
}
