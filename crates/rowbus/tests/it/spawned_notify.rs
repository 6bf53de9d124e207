//! Regression (found by `rowbus chaos`): notifying inside a transaction from a spawned
//! task. `Notifier::notify` and `rowbus::notify` were `async fn`s generic over the
//! executor, whose futures the compiler could not prove `Send`, so `tokio::spawn` of a
//! task that notified in a transaction did not compile. This file compiling is half the
//! test; the other half is that the notification still arrives on commit, and not on
//! rollback.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{MARIADB, PG, cp, env, notification, silence, unique};
use rowbus::{DbPool, Notifier};

/// Spawns a task that notifies in a transaction, then commits (or rolls back), and waits
/// for it.
async fn spawn_notify(
    db: DbPool,
    notifier: Arc<Notifier>,
    channel: String,
    payload: &'static str,
    commit: bool,
) {
    let task = async move {
        macro_rules! in_tx {
            ($pool:expr) => {{
                let mut tx = $pool.begin().await.unwrap();
                notifier.notify(&mut *tx, &channel, payload).await.unwrap();
                if commit { tx.commit().await.unwrap() } else { tx.rollback().await.unwrap() }
            }};
        }
        match &db {
            DbPool::Postgres(pool) => {
                in_tx!(pool);
                // The free function too, on a pool (PostgreSQL needs no notify table).
                rowbus::notify(pool, &channel, "free").await.unwrap();
            }
            DbPool::MySql(pool) => in_tx!(pool),
            DbPool::Sqlite(pool) => in_tx!(pool),
        }
    };
    // The point: a task that notifies in a transaction can be spawned.
    tokio::spawn(task).await.unwrap();
}

async fn spawned(url: Option<&str>) {
    let env = env(url).await;
    let channel = unique("spawned");
    let mut listener = env.listener().await;
    listener.listen(&channel).await.unwrap();
    let notifier = Arc::new(Notifier::new(env.config.clone()).unwrap());
    spawn_notify(env.db.clone(), notifier.clone(), channel.clone(), "rolled back", false).await;
    spawn_notify(env.db.clone(), notifier, channel.clone(), "committed", true).await;
    let mut expected = vec!["committed"];
    if matches!(env.db, DbPool::Postgres(_)) {
        // Each task's notification through the free function, on the pool.
        expected = vec!["free", "committed", "free"];
    }
    for payload in expected {
        assert_eq!(cp(&notification(&mut listener).await), (channel.as_str(), payload));
    }
    silence(&mut listener, Duration::from_millis(400)).await;
    drop(listener);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_notify_in_transaction_postgres() {
    spawned(Some(PG)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_notify_in_transaction_mariadb() {
    spawned(Some(MARIADB)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_notify_in_transaction_sqlite() {
    spawned(None).await;
}
