//! The listener against the real PostgreSQL and MariaDB and a temporary SQLite file: the
//! LISTEN/NOTIFY contract, the notify table's edge cases, cleanup and reconnects.

use crate::common;

use std::time::Duration;

use common::{
    Env, MARIADB, PG, TempSqlite, cp, env, env_with, event_within, notification, on_each_database, silence,
    unique, url_for,
};
use futures::StreamExt;
use rowbus::{DbPool, Error, Event, Listener, NotifyDeploy};
use sqlx::{Executor, Sqlite};

const QUIET: Duration = Duration::from_millis(400);

/// One test of `scenario` on `database`, for [`on_each_database!`]: the scenario gets the
/// server's URL, `None` for a new SQLite file.
macro_rules! database_test {
    (postgres, $scenario:ident) => {
        database_test!(postgres, $scenario, Some(PG));
    };
    (mariadb, $scenario:ident) => {
        database_test!(mariadb, $scenario, Some(MARIADB));
    };
    (sqlite, $scenario:ident) => {
        database_test!(sqlite, $scenario, None);
    };
    ($database:ident, $scenario:ident, $server:expr) => {
        #[tokio::test]
        async fn $database() {
            super::$scenario($server).await;
        }
    };
}

/// Delivered on commit and never on rollback, no history before `listen`, a transaction
/// open at `listen` time delivered once it commits, exactly once, in order.
async fn notifications_arrive_on_commit_once_and_in_order(server: Option<&str>) {
    let env = env(server).await;
    let ch = unique("ch");
    let other = unique("other");
    env.notify(&ch, "history").await;

    let mut open = env.begin().await;
    open.notify(&env.notifier, &ch, "open at listen").await;

    let mut listener = env.listener().await;
    listener.listen(&ch).await.unwrap();
    listener.listen(&ch).await.expect("listening twice is a no-op");
    silence(&mut listener, QUIET).await; // no history, nothing uncommitted

    open.commit().await;
    assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "open at listen"));

    let mut rolled_back = env.begin().await;
    rolled_back.notify(&env.notifier, &ch, "rolled back").await;
    rolled_back.rollback().await;

    let mut tx = env.begin().await;
    tx.notify(&env.notifier, &ch, "in tx").await;
    silence(&mut listener, QUIET).await; // not before commit
    tx.commit().await;
    assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "in tx"));

    env.notify(&other, "not listened").await;
    for i in 0..40 {
        env.notify(&ch, &i.to_string()).await;
    }
    for i in 0..40 {
        let n = notification(&mut listener).await;
        assert_eq!(cp(&n), (ch.as_str(), i.to_string().as_str()), "in order");
        assert!(n.pid > 0);
    }
    silence(&mut listener, QUIET).await; // exactly once, nothing rolled back, no other channel
    drop(listener);
    env.cleanup().await;
}
on_each_database!(notifications_arrive_on_commit_once_and_in_order);

#[tokio::test]
async fn out_of_order_commit_on_mariadb_is_delivered_once() {
    let env = env(Some(MARIADB)).await;
    let ch = unique("ooo");
    let mut listener = env.listener().await;
    listener.listen(&ch).await.unwrap();

    let mut a = env.begin().await; // takes the lower id and holds it
    a.notify(&env.notifier, &ch, "A").await;
    let mut b = env.begin().await;
    b.notify(&env.notifier, &ch, "B").await;
    b.commit().await;
    assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "B"));
    silence(&mut listener, QUIET).await;

    a.commit().await;
    assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "A"));
    silence(&mut listener, Duration::from_secs(1)).await; // and only once, over many polls
    drop(listener);
    env.cleanup().await;
}

/// `jobs ` is not `jobs`: a listener of `jobs` gets only what is sent to `jobs`.
async fn a_trailing_space_makes_another_channel(server: Option<&str>) {
    let env = env(server).await;
    let ch = unique("jobs");
    let mut listener = env.listener().await;
    listener.listen(&ch).await.unwrap();
    env.notify(&format!("{ch} "), "padded").await;
    env.notify(&ch, "exact").await;
    assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "exact"));
    silence(&mut listener, QUIET).await;
    drop(listener);
    env.cleanup().await;
}
on_each_database!(a_trailing_space_makes_another_channel on mariadb, sqlite);

/// `jobs` and `jobs ` on one listener: each gets its own, once, and no history.
async fn pad_equal_channels_on_one_listener_each_get_their_own(server: Option<&str>) {
    let env = env(server).await;
    let ch = unique("jobs");
    let padded = format!("{ch} ");
    env.notify(&ch, "history").await;
    env.notify(&padded, "history").await;
    let mut listener = env.listener().await;
    listener.listen(&padded).await.unwrap();
    listener.listen(&ch).await.unwrap();
    env.notify(&ch, "exact").await;
    env.notify(&padded, "padded").await;
    let mut got = [notification(&mut listener).await, notification(&mut listener).await];
    got.sort_by(|a, b| a.payload.cmp(&b.payload));
    assert_eq!(cp(&got[0]), (ch.as_str(), "exact"));
    assert_eq!(cp(&got[1]), (padded.as_str(), "padded"));
    silence(&mut listener, QUIET).await;
    drop(listener);
    env.cleanup().await;
}
on_each_database!(pad_equal_channels_on_one_listener_each_get_their_own on mariadb, sqlite);

#[tokio::test]
async fn unlisten_while_a_poll_is_in_flight_drops_its_rows() {
    let env = env_with(Some(MARIADB), |c| c.poll_interval = Duration::from_millis(100)).await;
    let (ch, kept) = (unique("gone"), unique("kept"));
    let mut listener = env.listener().await;
    listener.listen(&ch).await.unwrap();
    listener.listen(&kept).await.unwrap();

    // A write lock held by another session stalls the next poll inside the server.
    let DbPool::MySql(pool) = &env.db else { unreachable!() };
    let mut locker = pool.acquire().await.unwrap();
    let lock = sqlx::AssertSqlSafe(format!("LOCK TABLES `{}` WRITE", env.config.table));
    locker.execute(sqlx::query(lock)).await.unwrap();
    env.notifier.notify(&mut *locker, &ch, "in flight").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await; // a poll is now waiting for the lock

    tokio::time::timeout(Duration::from_secs(2), listener.unlisten(&ch))
        .await
        .expect("unlisten answers while the poll is in flight")
        .unwrap();
    locker.execute("UNLOCK TABLES").await.unwrap();
    drop(locker);

    env.notify(&kept, "after").await;
    assert_eq!(cp(&notification(&mut listener).await), (kept.as_str(), "after"));
    silence(&mut listener, QUIET).await;
    drop(listener);
    env.cleanup().await;
}

/// Old rows, written the way another program might, so the cleanup has work.
async fn backlog(env: &Env, rows: usize) {
    let (sql, old) = match env.db {
        DbPool::MySql(_) => (
            "INSERT INTO `{}` (channel, payload, pid, created_at) VALUES (?, '', 1, ?)",
            "2000-01-01 00:00:00.000000",
        ),
        _ => (
            "INSERT INTO `{}` (channel, payload, pid, created_at) VALUES (?, '', 1, ?)",
            "2000-01-01 00:00:00.000",
        ),
    };
    let sql = sql.replace("{}", &env.config.table);
    for _ in 0..rows {
        let q = sqlx::AssertSqlSafe(sql.clone());
        match &env.db {
            DbPool::MySql(pool) => drop(sqlx::query(q).bind("old").bind(old).execute(pool).await.unwrap()),
            DbPool::Sqlite(pool) => drop(sqlx::query(q).bind("old").bind(old).execute(pool).await.unwrap()),
            DbPool::Postgres(_) => unreachable!(),
        }
    }
}

fn cleanup_config(c: &mut rowbus::NotifyConfig) {
    c.poll_interval = Duration::from_millis(200);
    c.lookback = Duration::from_secs(1);
    c.retention = Duration::from_secs(2);
    c.cleanup_limit = 10;
}

async fn cleanup_works_off_a_backlog_in_bounded_batches(server: Option<&str>) {
    let env = env_with(server, cleanup_config).await;
    backlog(&env, 25).await;
    let mut seen = vec![env.count("old").await];
    // Polling alone: with its push path the listener's own deletes wake it, and the batches
    // follow each other faster than the counts are read.
    let options = rowbus::ListenerOptions { push: false, ..env.options() };
    let listener = rowbus::Listener::connect_with(&env.url, options).await.unwrap();
    listener.listen(&unique("any")).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while *seen.last().unwrap() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let n = env.count("old").await;
        if Some(&n) != seen.last() {
            seen.push(n);
        }
    }
    // Each run deletes at most cleanup_limit (10) rows; a full batch runs again next poll.
    assert_eq!(seen, [25, 15, 5, 0], "row counts the cleanup went through");
    drop(listener);
    env.cleanup().await;
}
on_each_database!(cleanup_works_off_a_backlog_in_bounded_batches on mariadb, sqlite);

async fn retention_zero_deletes_nothing(server: Option<&str>) {
    let env = env_with(server, |c| c.retention = Duration::ZERO).await;
    backlog(&env, 5).await;
    let listener = env.listener().await;
    listener.listen(&unique("any")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await; // a dozen polls
    assert_eq!(env.count("old").await, 5);
    drop(listener);
    env.cleanup().await;
}
on_each_database!(retention_zero_deletes_nothing on mariadb, sqlite);

/// The listener's session killed from another session: reported, reconnected, and what
/// is sent afterwards arrives.
async fn a_killed_session_is_reported_and_reconnected(server: Option<&str>) {
    let env = env(server).await;
    let ch = unique("kill");
    let mut listener = env.listener().await;
    listener.listen(&ch).await.unwrap();
    let id = listener.session_id().expect("a session id");
    env.notify(&ch, "before").await;
    assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "before"));
    let resumes = !matches!(env.db, DbPool::Postgres(_));
    match &env.db {
        DbPool::Postgres(pool) => {
            let kill = "SELECT pg_terminate_backend($1)";
            let killed: bool = sqlx::query_scalar(kill).bind(id as i32).fetch_one(pool).await.unwrap();
            assert!(killed);
        }
        DbPool::MySql(pool) => drop(sqlx::query("KILL CONNECTION ?").bind(id).execute(pool).await.unwrap()),
        DbPool::Sqlite(_) => unreachable!(),
    }
    if resumes {
        // Sent while the listener is away (or reconnecting): the notify table resumes
        // from where it was and delivers it.
        env.notify(&ch, "while away").await;
    }
    match event_within(&mut listener, Duration::from_secs(10)).await {
        Some(Event::Disconnected(error)) => assert!(!error.to_string().is_empty()),
        other => panic!("expected Disconnected, got {other:?}"),
    }
    match event_within(&mut listener, Duration::from_secs(10)).await {
        // LISTEN keeps nothing: PostgreSQL reports every channel as possibly missed.
        Some(Event::Reconnected { missed }) if resumes => assert_eq!(missed, Vec::<String>::new()),
        Some(Event::Reconnected { missed }) => assert_eq!(missed, std::slice::from_ref(&ch)),
        other => panic!("expected Reconnected, got {other:?}"),
    }
    if resumes {
        assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "while away"));
    }
    let new_id = listener.session_id().expect("a new session");
    assert_ne!(new_id, id);
    env.notify(&ch, "after reconnect").await;
    assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "after reconnect"));
    drop(listener);
    env.cleanup().await;
}
on_each_database!(a_killed_session_is_reported_and_reconnected on postgres, mariadb);

/// `listen` and `notify` before the notify table is deployed say which table to deploy.
async fn listen_before_deploy_names_the_table(server: Option<&str>) {
    let (url, _sqlite) = url_for(server);
    let url = url.as_str();
    let db = DbPool::connect_creating(url, 8).await.expect("server reachable");
    let table = unique("never_deployed");
    let options = rowbus::ListenerOptions {
        notify_table: rowbus::NotifyConfig { table: table.clone(), ..Default::default() },
        ..Default::default()
    };
    let listener = Listener::connect_with(url, options.clone()).await.unwrap();
    let err = listener.listen("jobs").await.unwrap_err();
    assert!(matches!(&err, Error::MissingNotifyTable { table: t } if *t == table), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&table) && message.contains("rowbus deploy"), "{message}");
    let notifier = rowbus::Notifier::new(options.notify_table).unwrap();
    let err = db.notify_with(&notifier, "jobs", "x").await.unwrap_err();
    assert!(matches!(err, Error::MissingNotifyTable { .. }), "{err:?}");
    db.close().await;
}
on_each_database!(listen_before_deploy_names_the_table on mariadb, sqlite);

#[tokio::test]
async fn postgres_limits_are_checked_before_the_server() {
    let env = env(Some(PG)).await;
    let mut listener = env.listener().await;
    let longest = format!("{}{}", unique("l"), "x".repeat(63)).chars().take(63).collect::<String>();
    listener.listen(&longest).await.unwrap();
    let too_long = format!("{longest}y");
    assert!(matches!(listener.listen(&too_long).await, Err(Error::PgChannelTooLong { bytes: 64, .. })));
    assert!(matches!(env.db.notify(&too_long, "").await, Err(Error::PgChannelTooLong { bytes: 64, .. })));
    assert!(matches!(env.db.notify("", "").await, Err(Error::PgChannelEmpty)));
    let err = env.db.notify(&longest, &"p".repeat(8000)).await.unwrap_err();
    assert!(matches!(err, Error::PgPayloadTooLarge { bytes: 8000 }), "{err:?}");
    assert!(err.to_string().contains("8000"));
    env.db.notify(&longest, &"p".repeat(7999)).await.unwrap();
    let n = notification(&mut listener).await;
    assert_eq!((n.channel.as_str(), n.payload.len()), (longest.as_str(), 7999));
    drop(listener);
    env.cleanup().await;
}

/// Channels of up to 255 characters and payloads of up to 65,535 bytes arrive whole; one
/// more is refused.
async fn notify_table_limits_are_enforced_and_the_largest_arrive_whole(server: Option<&str>) {
    let env = env(server).await;
    let mut listener = env.listener().await;
    let base = unique("c");
    let longest: String = format!("{base}{}", "é".repeat(255)).chars().take(255).collect();
    listener.listen(&longest).await.unwrap();
    let too_long = format!("{longest}é");
    let refused = rowbus::notify_table::Error::ChannelTooLong { chars: 256 };
    assert!(matches!(listener.listen(&too_long).await, Err(Error::NotifyTable(e)) if e == refused));
    assert!(matches!(env.notify_err(&too_long, "").await, Error::NotifyTable(e) if e == refused));
    let big = "€".repeat(21_845); // 65,535 bytes
    let err = env.notify_err(&longest, &format!("{big}a")).await;
    assert!(matches!(
        err,
        Error::NotifyTable(rowbus::notify_table::Error::PayloadTooLarge { bytes: 65_536 })
    ));
    env.notify(&longest, &big).await;
    let n = notification(&mut listener).await;
    assert_eq!(n.channel, longest, "the channel arrives whole");
    assert_eq!(n.payload, big, "the payload arrives whole");
    drop(listener);
    env.cleanup().await;
}

impl common::Env {
    async fn notify_err(&self, channel: &str, payload: &str) -> Error {
        self.db.notify_with(&self.notifier, channel, payload).await.unwrap_err()
    }
}
on_each_database!(notify_table_limits_are_enforced_and_the_largest_arrive_whole on mariadb, sqlite);

#[tokio::test]
async fn mariadb_sessions_are_strict() {
    let db = DbPool::connect(MARIADB).await.unwrap();
    let DbPool::MySql(pool) = &db else { unreachable!() };
    let mode: String = sqlx::query_scalar("SELECT @@SESSION.sql_mode").fetch_one(pool).await.unwrap();
    assert!(mode.contains("STRICT_ALL_TABLES"), "{mode}");
    let isolation: String =
        sqlx::query_scalar("SELECT @@SESSION.tx_isolation").fetch_one(pool).await.unwrap();
    assert_eq!(isolation, "READ-COMMITTED");
    db.close().await;
}

#[tokio::test]
async fn deploy_on_postgres_says_there_is_nothing_to_do() {
    let db = DbPool::connect(PG).await.unwrap();
    let outcome = db.deploy_notify_table(&Default::default()).await.unwrap();
    assert_eq!(outcome, NotifyDeploy::Native);
    assert!(outcome.to_string().contains("nothing to do"));
}

#[tokio::test]
async fn listener_is_a_stream_and_unlisten_stops_delivery() {
    let env = env(None).await;
    let (a, b) = (unique("a"), unique("b"));
    let mut listener = env.listener().await;
    listener.listen(&a).await.unwrap();
    listener.listen(&b).await.unwrap();
    env.notify(&a, "1").await;
    env.notify(&b, "2").await;
    for expected in [(a.as_str(), "1"), (b.as_str(), "2")] {
        match tokio::time::timeout(Duration::from_secs(10), listener.next()).await.unwrap() {
            Some(Event::Notification(n)) => assert_eq!(cp(&n), expected),
            other => panic!("expected a notification, got {other:?}"),
        }
    }
    listener.unlisten(&a).await.unwrap();
    env.notify(&a, "after unlisten").await;
    env.notify(&b, "3").await;
    assert_eq!(cp(&notification(&mut listener).await), (b.as_str(), "3"));
    silence(&mut listener, QUIET).await;
    drop(listener);
    env.cleanup().await;
}

/// A missing SQLite file is refused by every connect but the creating ones, in an error
/// naming the file and `rowbus deploy`, even when the URL says `mode=rwc`, and nothing is
/// left behind; `connect_creating` and `rowbus::connect_creating` make it.
#[tokio::test]
async fn a_missing_sqlite_file_is_made_only_when_asked() {
    let file = TempSqlite::new();
    let left = || {
        ["", "-wal", "-shm", "-journal"]
            .map(|suffix| format!("{}{suffix}", file.path().display()))
            .into_iter()
            .filter(|path| std::path::Path::new(path).exists())
            .collect::<Vec<_>>()
    };
    let refused = |err: Error, what: &str| {
        assert!(matches!(&err, Error::MissingDatabase { path } if path == file.path()), "{what}: {err:?}");
        let message = err.to_string();
        assert!(message.contains(&file.path().display().to_string()), "{what}: {message}");
        assert!(
            message.contains("rowbus deploy") && message.contains("connect_creating"),
            "{what}: {message}"
        );
    };
    for url in [file.url.clone(), format!("{}?mode=rwc", file.url)] {
        refused(DbPool::connect(&url).await.unwrap_err(), "DbPool::connect");
        refused(DbPool::connect_with_size(&url, 1).await.unwrap_err(), "DbPool::connect_with_size");
        refused(rowbus::connect::<Sqlite>(&url, 1).await.unwrap_err(), "rowbus::connect");
        refused(Listener::connect(&url).await.unwrap_err(), "Listener::connect");
        assert_eq!(left(), Vec::<String>::new(), "{url}: files made");
    }

    let db = DbPool::connect_creating(&file.url, 1).await.unwrap();
    assert!(file.path().exists(), "connect_creating did not make the file");
    db.deploy_notify_table(&Default::default()).await.unwrap();
    db.close().await;
    DbPool::connect(&file.url).await.unwrap().close().await;
    Listener::connect(&file.url).await.unwrap().listen("ch").await.unwrap();

    let typed = TempSqlite::new();
    rowbus::connect_creating::<Sqlite>(&typed.url, 1).await.unwrap().close().await;
    assert!(typed.path().exists(), "rowbus::connect_creating did not make the file");
    // No file at all: nothing to be missing.
    DbPool::connect("sqlite::memory:").await.unwrap().close().await;
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_are_errors() {
    assert!(matches!(Listener::connect("redis://x").await, Err(Error::InvalidUrl { .. })));
    let err = Listener::connect("mysql://root@127.0.0.1:1/test").await.unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    let err = Listener::connect("postgres://postgres@127.0.0.1:1/test").await.unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    let err = DbPool::connect("mysql://root:pw@127.0.0.1:1/test").await.unwrap_err();
    assert!(err.to_string().contains("root:***@"), "the password is not shown: {err}");
}
