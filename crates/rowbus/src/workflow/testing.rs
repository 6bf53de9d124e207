//! Workflows in tests (feature `testing`): run a queue's workflows inline with a
//! [`TestBroker`], and make their durable sleeps due without waiting.

use super::{StepState, WorkflowError, Workflows, now_us};
use crate::broker::testing::{Drained, TestBroker};
use crate::driver::Arg;
use crate::sql::Db;

impl<DB: Db> Workflows<DB> {
    /// Runs every workflow of the queue that is due, inline, one run at a time, until
    /// none is (a run that suspends is put off and not run again here until it is due;
    /// one that fails is retried after the broker's backoff): what [`TestBroker::drain`]
    /// says of each run.
    pub async fn drain(&self, test: &TestBroker<DB>) -> Result<Vec<Drained>, WorkflowError> {
        let workflows = self.clone();
        Ok(test
            .drain(self.queue(), move |delivery| {
                let workflows = workflows.clone();
                async move { workflows.handle(delivery).await }
            })
            .await?)
    }

    /// Makes every durable sleep of the queue's workflows over now (their recorded wake
    /// times moved to now) and their messages due ([`TestBroker::make_due`]): the next
    /// [`drain`](Self::drain) runs them past their sleeps. How many sleeps it moved.
    pub async fn make_sleeps_due(&self, test: &TestBroker<DB>) -> Result<u64, WorkflowError> {
        let sql = &self.inner_sql().due_steps;
        let now = now_us().to_string();
        let mut conn = self.queue().broker().pool().acquire().await?;
        let moved =
            DB::execute(&mut conn, sql, &[Arg::Text(&now), Arg::Text(StepState::Sleep.as_str())]).await?;
        drop(conn);
        test.make_due(self.queue()).await?;
        Ok(moved)
    }
}
