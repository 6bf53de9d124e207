//! What a claim costs, in statements, as sqlx reports them while the claim is polled
//! (`common::statements`): a limited claim against a plain one, on each database.

use crate::common;

use std::time::Duration;

use common::statements::{Statements, counted};
use common::{Brokers, Cleanup, Place, on_each_database, unique};
use futures::StreamExt;
use rowbus::limit::{Limit, LimitScope};
use rowbus::{BrokerOptions, Message, Queue};

use common::place_test as database_test;

/// Claims measured per kind of claim.
const CLAIMS: usize = 10;

/// The statements of one claim of a stream of batch 1 on `queue`, on average over
/// [`CLAIMS`] claims after one not counted (the first learns whether a limit applies):
/// those that name the queue's tables, and all of them (with `BEGIN` and `COMMIT`).
async fn per_claim<DB: rowbus::Db>(queue: &Queue<DB>) -> (f64, f64) {
    let statements = Statements::default();
    let mut sub = queue.subscribe().batch(1).stream().await.unwrap();
    sub.next().await.unwrap().unwrap().ack().await.unwrap();
    for _ in 0..CLAIMS {
        let delivery = counted(&statements, sub.next()).await.unwrap().unwrap();
        delivery.ack().await.unwrap();
    }
    drop(sub);
    let n = CLAIMS as f64;
    (statements.naming(queue.table()) as f64 / n, statements.ran().len() as f64 / n)
}

/// A claim under a concurrency limit, and one under a rate, cost at most one statement
/// (naming the queue's tables) more than a plain claim: the lock of the limits rows. The
/// counts, the start log and the rate's bucket ride along with it and the claim.
async fn limited_claims_cost_a_plain_claim<DB: Brokers>(place: Place) {
    let cleanup = Cleanup::new(DB::BACKEND);
    let name = cleanup.queue(&unique("cost_lim"));
    let broker = DB::broker(&place, BrokerOptions { poll_interval: Duration::from_millis(200), ..Default::default() }).await;
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    q.publish_batch((0..3 * (CLAIMS + 1)).map(|i| Message::text(i.to_string()))).await.unwrap();
    let plain = per_claim(&q).await;
    q.set_limit(&LimitScope::Queue, Limit::MaxRunning(1_000)).await.unwrap();
    let running = per_claim(&q).await;
    q.clear_limit(&LimitScope::Queue).await.unwrap();
    q.set_limit(&LimitScope::Queue, Limit::Rate("100000/s".parse().unwrap())).await.unwrap();
    let rated = per_claim(&q).await;
    eprintln!(
        "{:?}: statements per claim (naming the queue, all): plain {plain:?}, max running {running:?}, rate {rated:?}",
        DB::BACKEND
    );
    assert!(plain.0 >= 1.0, "the counter saw the plain claim: {plain:?}");
    assert!(running.0 <= plain.0 + 1.0, "a claim under max running: {running:?}, a plain one {plain:?}");
    assert!(rated.0 <= plain.0 + 1.0, "a claim under a rate: {rated:?}, a plain one {plain:?}");
    broker.shutdown(Duration::from_secs(5)).await;
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
}
on_each_database!(limited_claims_cost_a_plain_claim);
