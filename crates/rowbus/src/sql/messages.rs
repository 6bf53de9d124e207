//! Reading a queue table's messages for its operators: a page of them in id order, each
//! with what tells its state (visible yet, leased).

use super::{Catalog, Schema, TableSql};

impl<DB: Schema + Catalog> TableSql<DB> {
    /// Up to a limit of the table's messages after an id, lowest id first, as
    /// [`QueuedRow`](crate::driver::QueuedRow) reads them: id, group, payload, attempts,
    /// created_at µs, µs since visible_at, µs since lease_until (NULL without a lease),
    /// priority, key, last error, headers. Binds: the group when `by_group`, then the id after
    /// which to start, the limit.
    pub fn messages_list(&self, by_group: bool) -> String {
        let p = DB::param;
        let group = if by_group { format!("group_name = {} AND ", p(1)) } else { String::new() };
        let first = usize::from(by_group) + 1;
        format!(
            "SELECT {}, group_name, payload, {}, {}, {}, {}, {}, msg_key, last_error, headers FROM {} \
             WHERE {group}id > {} ORDER BY id LIMIT {}",
            DB::bigint("id"),
            DB::bigint("attempts"),
            DB::micros_of("created_at"),
            DB::age_of("visible_at"),
            DB::age_of("lease_until"),
            DB::bigint("priority"),
            self.quoted,
            p(first),
            p(first + 1)
        )
    }
}
