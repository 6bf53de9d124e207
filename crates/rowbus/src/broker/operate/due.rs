//! A waiting message made due now: what the workflows do when an event a workflow waits
//! for arrives, or its wait is otherwise over before the time it was put off to.
//!
//! The same `UPDATE` of `visible_at` a snooze makes, back to the database's now, and only
//! on a message no lease holds: claims find it from the floors as they stand. A floor lies
//! before the database's now at its computation, less its slack
//! (`upkeep::floors::SLACK_US`), never after it, so a message made visible "now" is at or
//! above every floor computed before; no floor needs telling. The PostgreSQL ring keeps
//! the row in its partition, as a snooze does.

use std::sync::Arc;

use crate::broker::Queue;
use crate::broker::exec::retrying;
use crate::broker::publish::insert::wake_group;
use crate::driver::Arg;
use crate::error::Error;
use crate::sql::Db;

impl<DB: Db> Queue<DB> {
    /// Makes message `id` of `group` ready now if it waits for a later time and no lease
    /// holds it, then wakes the group's subscriptions (here, and with `listen_notify` in
    /// other processes). Whether it changed it.
    pub(crate) async fn make_due_now(&self, id: i64, group: &str) -> Result<bool, Error> {
        let now = DB::NOW;
        let sql: Arc<str> = Arc::from(format!(
            "UPDATE {} SET visible_at = {now} WHERE id = {} AND lease IS NULL AND visible_at > {now}",
            self.sql.quoted,
            DB::param(1)
        ));
        let pool = &self.inner().pool;
        let changed = retrying(self, || {
            let sql = sql.clone();
            async move {
                let mut conn = pool.acquire().await?;
                DB::execute(&mut conn, &sql, &[Arg::Int(id)]).await
            }
        })
        .await?;
        if changed > 0 {
            wake_group(self, group).await;
        }
        Ok(changed > 0)
    }
}
