//! The dashboard against the real MariaDB, through a relay that passes the server's answers
//! on a few bytes at a time: requests dropped part way, as hyper drops a handler's future
//! when its client goes away, must leave the pool every connection. Cut off in the middle
//! of a statement, a handler cost the pool that connection for good.

#[path = "../../rowbus/tests/common/cleanup.rs"]
mod cleanup;
#[path = "../../rowbus/tests/common/trickle.rs"]
#[allow(dead_code, reason = "its PostgreSQL pool is not used here")]
mod trickle;

use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use cleanup::{Cleanup, run_tag};
use rowbus::{Backend, Broker, BrokerOptions, Message};
use rowbus_ui::Dashboard;
use tower::ServiceExt as _;
use trickle::poll_then_drop;

const MARIADB: &str = "mysql://root@127.0.0.1:3306/test";

/// How many connections the broker's pool holds: few, so that a lost one shows at once.
const CONNECTIONS: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_dropped_part_way_leave_every_connection() {
    // Declared first, dropped last: the queue's tables go also when the test fails.
    let cleanup = Cleanup::new(Backend::MySql);
    let pool = trickle::mariadb(MARIADB, CONNECTIONS).await;
    let broker = Broker::new(pool, BrokerOptions::default()).await.unwrap();
    let name = cleanup.queue(&format!("ui_drop_{}{}", run_tag(), std::process::id()));
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    q.publish_batch((0..20).map(|i| Message::text(i.to_string()))).await.unwrap();
    let router = Dashboard::new(broker.clone()).tables([name.as_str()]).router();
    let mut dropped = 0;
    let rounds = async {
        for round in 0..150u64 {
            let uri = match round % 3 {
                0 => "/api/queues".to_owned(),
                1 => format!("/api/queues/{name}/messages"),
                _ => "/metrics".to_owned(),
            };
            let request = Request::get(uri).body(Body::empty()).unwrap();
            // Polled 1 to 6 times, 30 to 230 µs apart, then dropped.
            let (polls, apart) = (1 + round % 6, Duration::from_micros(30 + round * 13 % 200));
            if poll_then_drop(router.clone().oneshot(request), polls, apart).await.is_none() {
                dropped += 1;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), rounds)
        .await
        .expect("150 rounds took over two minutes: the pool was short of connections");
    assert!(dropped > 30, "only {dropped} of 150 requests were dropped part way: the test tested little");
    trickle::every_connection_back(broker.pool(), CONNECTIONS).await;
    // The page still answers.
    let request = Request::get("/api/queues").body(Body::empty()).unwrap();
    let answer =
        tokio::time::timeout(Duration::from_secs(10), router.oneshot(request)).await.unwrap().unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());
    q.undeploy().await.unwrap();
    cleanup.forget(&name);
    broker.shutdown(Duration::from_secs(1)).await;
}
