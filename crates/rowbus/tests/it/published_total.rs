//! `Queue::published_total`, against the real PostgreSQL and MariaDB and a temporary
//! SQLite file: 0 on a fresh table, up by exactly what a publish added, unchanged by
//! acknowledging and dead-lettering, and a missing table is an error.

use crate::common;

use std::time::Duration;

use common::{Cleanup, MARIADB, PG, next_delivery as next, on_each_database, unique, url_for};
use rowbus::{Broker, BrokerOptions, Db, DbPool, Error, Message};

/// One test of `scenario` on `database`, for [`on_each_database!`].
macro_rules! database_test {
    ($database:ident, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $database() {
            let server = match stringify!($database) {
                "postgres" => Some(PG),
                "mariadb" => Some(MARIADB),
                _ => None,
            };
            let (url, file) = url_for(server);
            let db = DbPool::connect_creating(&url, 4)
                .await
                .unwrap_or_else(|e| panic!("{url} must be reachable (run scripts/services.sh): {e}"));
            let cleanup = Cleanup::new(db.backend());
            match db {
                DbPool::Postgres(pool) => super::$scenario(&cleanup, pool).await,
                DbPool::MySql(pool) => super::$scenario(&cleanup, pool).await,
                DbPool::Sqlite(pool) => super::$scenario(&cleanup, pool).await,
            }
            drop(file);
        }
    };
}

async fn counts_what_was_published<DB: Db>(cleanup: &Cleanup, pool: sqlx::Pool<DB>) {
    let broker = Broker::new(pool, BrokerOptions::default()).await.unwrap();
    let queue = broker.queue(&cleanup.queue(&unique("pubtotal"))).unwrap();

    let missing = queue.published_total().await.unwrap_err();
    assert!(matches!(missing, Error::MissingQueueTable { .. }), "{missing:?}");

    queue.deploy().await.unwrap();
    assert_eq!(queue.published_total().await.unwrap(), 0, "a fresh table");

    queue.publish_batch((0..5).map(|i| Message::text(format!("m{i}")))).await.unwrap();
    assert_eq!(queue.published_total().await.unwrap(), 5, "after publishing 5");
    queue.publish(Message::text("one more").group("other")).await.unwrap();
    assert_eq!(queue.published_total().await.unwrap(), 6, "after publishing 1 to another group");

    // Handle them all: acknowledge four, dead-letter two; the table ends empty.
    let mut sub = queue.subscribe().batch(10).stream().await.unwrap();
    for i in 0..5 {
        let d = next(&mut sub).await;
        if i == 0 { d.dead_letter("boom").await.unwrap() } else { d.ack().await.unwrap() }
    }
    let mut other = queue.subscribe().group("other").stream().await.unwrap();
    next(&mut other).await.dead_letter("boom").await.unwrap();
    assert_eq!(queue.depth("").await.unwrap(), (0, 1));
    assert_eq!(queue.depth("other").await.unwrap(), (0, 1));
    assert_eq!(queue.published_total().await.unwrap(), 6, "handling does not lower it");

    queue.publish(Message::text("after")).await.unwrap();
    assert_eq!(queue.published_total().await.unwrap(), 7, "an emptied table goes on from where it was");
    drop((sub, other));
    broker.shutdown(Duration::ZERO).await;
}
on_each_database!(counts_what_was_published);
