//! rowbus through PgBouncer in transaction pooling mode (`?pgbouncer=true`): a PgBouncer
//! of the test's own (tests/common/bouncer.rs) in front of the test PostgreSQL server,
//! two server connections shared by every client. Deploy, publishes from several tasks at
//! once, several consumers draining, statistics, dead letters, notifications; listening
//! through a direct URL, and the refusal to listen through the pooled one.
//!
//! PgBouncer must be installed (scripts/services.sh installs it): the tests fail without
//! it, they do not skip.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::bouncer::PgBouncer;
use common::{Cleanup, PG, next_delivery, unique};
use rowbus::dead::{DeadLetterPage, DeadLetters};
use rowbus::{Backend, Broker, BrokerOptions, DbPool, Error, Message};
use sqlx::Postgres;

const MESSAGES: usize = 200;
const PUBLISHERS: usize = 8;
const CONSUMERS: usize = 4;

/// The pooled URL of `bouncer`, as a PgBouncer user writes it.
fn pooled(bouncer: &PgBouncer) -> String {
    format!("{}?pgbouncer=true", bouncer.url())
}

/// A broker on a pool of 8 connections through `bouncer`.
async fn broker(bouncer: &PgBouncer, options: BrokerOptions) -> Broker<Postgres> {
    let pool = rowbus::connect::<Postgres>(&pooled(bouncer), 8).await.expect("connects through PgBouncer");
    Broker::new(pool, options).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_work_through_transaction_pooling() {
    let cleanup = Cleanup::new(Backend::Postgres);
    let bouncer = PgBouncer::start();
    let broker = broker(&bouncer, BrokerOptions::default()).await;
    let queue = broker.queue(&cleanup.queue(&unique("bouncer"))).unwrap();
    queue.deploy().await.unwrap();

    // Publishes from several tasks at once: their statements share two server connections.
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                for i in 0..MESSAGES / PUBLISHERS {
                    queue.publish(Message::text(format!("{p}-{i}"))).await.unwrap();
                }
            })
        })
        .collect();
    for publisher in publishers {
        publisher.await.unwrap();
    }
    assert_eq!(queue.published_total().await.unwrap(), MESSAGES as u64);
    assert_eq!(queue.depth("").await.unwrap(), (MESSAGES as i64, 0), "all in the table, none dead");

    // Several consumers drain it, each message once.
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut sub = queue.subscribe().batch(10).stream().await.unwrap();
                let mut seen = Vec::new();
                loop {
                    // Every message acknowledged (deleted): none left, leased or not.
                    let (in_table, dead) = queue.depth("").await.unwrap();
                    if in_table == 0 && dead == 0 {
                        return seen;
                    }
                    let next =
                        tokio::time::timeout(Duration::from_millis(500), futures::StreamExt::next(&mut sub));
                    if let Ok(Some(delivery)) = next.await {
                        let delivery = delivery.unwrap();
                        seen.push(delivery.text().unwrap().to_owned());
                        delivery.ack().await.unwrap();
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for consumer in consumers {
        all.extend(consumer.await.unwrap());
    }
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!((all.len(), distinct.len()), (MESSAGES, MESSAGES), "each message handled once");
    let stats = queue.group_stats().await.unwrap();
    assert!(stats.iter().all(|g| g.ready == 0 && g.in_flight == 0), "{stats:?}");

    // Dead letters: listed, put back, handled.
    queue.publish_batch((0..3).map(|i| Message::text(format!("dead-{i}")))).await.unwrap();
    let mut sub = queue.subscribe().batch(3).stream().await.unwrap();
    for _ in 0..3 {
        next_delivery(&mut sub).await.dead_letter("boom").await.unwrap();
    }
    let dead = queue.dead_letters(&DeadLetterPage::default()).await.unwrap();
    assert_eq!(dead.len(), 3, "{dead:?}");
    assert!(dead.iter().all(|d| d.last_error.as_deref() == Some("boom")), "{dead:?}");
    assert_eq!(queue.requeue_dead(&DeadLetters::All, Duration::ZERO).await.unwrap(), 3);
    for _ in 0..3 {
        next_delivery(&mut sub).await.ack().await.unwrap();
    }
    assert!(queue.dead_letters(&DeadLetterPage::default()).await.unwrap().is_empty());
    assert_eq!(queue.published_total().await.unwrap(), MESSAGES as u64 + 3);
    drop(sub);
    broker.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_sent_through_the_pool_reach_a_direct_listener() {
    let bouncer = PgBouncer::start();
    let channel = unique("bouncer_ch");
    let mut listener = rowbus::Listener::connect(PG).await.unwrap();
    listener.listen(&channel).await.unwrap();
    let db = DbPool::connect(&pooled(&bouncer)).await.unwrap();
    for i in 0..20 {
        db.notify(&channel, &format!("n{i}")).await.unwrap();
    }
    for i in 0..20 {
        assert_eq!(common::notification(&mut listener).await.payload, format!("n{i}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listening_takes_a_direct_url_and_the_pooled_one_is_refused() {
    let cleanup = Cleanup::new(Backend::Postgres);
    let bouncer = PgBouncer::start();

    let refused = rowbus::Listener::connect(&pooled(&bouncer)).await.unwrap_err();
    assert!(matches!(refused, Error::NeedsSession { feature: "listening" }), "{refused:?}");
    assert!(refused.to_string().contains("--listen-url"), "names the fix: {refused}");

    let pool = rowbus::connect::<Postgres>(&pooled(&bouncer), 8).await.unwrap();
    let woken = BrokerOptions { listen_notify: true, ..BrokerOptions::default() };
    let refused = Broker::new(pool.clone(), woken.clone()).await.unwrap_err();
    assert!(matches!(refused, Error::NeedsSession { feature: "listen_notify" }), "{refused:?}");
    let through = BrokerOptions { listen_url: Some(pooled(&bouncer)), ..woken.clone() };
    let refused = Broker::new(pool.clone(), through).await.unwrap_err();
    assert!(matches!(refused, Error::NeedsSession { .. }), "{refused:?}");

    // With a direct listening URL, a publish through the pool wakes a subscription at once
    // (its poll interval is an hour).
    let options =
        BrokerOptions { listen_url: Some(PG.to_owned()), poll_interval: Duration::from_secs(3600), ..woken };
    let broker = Broker::new(pool, options).await.unwrap();
    let queue = broker.queue(&cleanup.queue(&unique("bouncer_wake"))).unwrap();
    queue.deploy().await.unwrap();
    let mut sub = queue.subscribe().stream().await.unwrap();
    // The first claim finds nothing; then the subscription sleeps until woken.
    let early = tokio::time::timeout(Duration::from_millis(300), futures::StreamExt::next(&mut sub)).await;
    assert!(early.is_err(), "nothing to claim yet");
    queue.publish(Message::text("wake")).await.unwrap();
    let delivery = next_delivery(&mut sub).await;
    assert_eq!(delivery.text().unwrap(), "wake");
    delivery.ack().await.unwrap();
    drop(sub);
    broker.shutdown(Duration::from_secs(5)).await;
}
