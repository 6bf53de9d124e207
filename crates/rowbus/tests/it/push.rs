//! The push paths: a listener learns of another process's commit from the binary log
//! (MariaDB, on the throwaway server with log_bin, scripts/binlog.sh) or from a watch on
//! SQLite's files, reads nothing while idle, polls (and says why) without a push path, and
//! keeps receiving while its push path is lost, then resumes it.
//!
//! Push is told from polling by the listener's own counters and by poll intervals of an
//! hour: a notification that arrives at all came by the push path.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rowbus::{DbPool, Event, Listener, ListenerOptions, NotifyConfig, WakePath, WakeStats};

use crate::common::binlog::{BINLOG_URL, BinlogServer, sql};
use crate::common::{MARIADB, TempSqlite, unique};

const HOUR: Duration = Duration::from_secs(3600);

/// Warnings and above of every test of this process, as text.
fn logs() -> Arc<Mutex<Vec<u8>>> {
    crate::statements::warnings()
}

/// The log lines that mention `needle`.
fn logged(needle: &str) -> Vec<String> {
    let logs = logs();
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    text.lines().filter(|l| l.contains(needle)).map(str::to_owned).collect()
}

/// A notify table of the test's own on `url`, polled every `poll_interval`.
async fn notify_table(url: &str, poll_interval: Duration) -> (DbPool, NotifyConfig) {
    let db =
        DbPool::connect_creating(url, 4).await.unwrap_or_else(|e| panic!("{url} must be reachable: {e}"));
    let config = NotifyConfig {
        table: unique("push"),
        poll_interval,
        lookback: Duration::from_secs(5),
        retention: poll_interval + Duration::from_secs(3600),
        ..NotifyConfig::default()
    };
    db.deploy_notify_table(&config).await.expect("deploy the notify table");
    (db, config)
}

fn options(config: &NotifyConfig) -> ListenerOptions {
    ListenerOptions {
        notify_table: config.clone(),
        pushed_poll_interval: HOUR,
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(200),
        ..ListenerOptions::default()
    }
}

/// Waits (at most 30 s) until the listener's wake path is one `pred` accepts.
async fn path_becomes(listener: &Listener, pred: impl Fn(&WakePath) -> bool) -> WakeStats {
    for _ in 0..600 {
        let stats = listener.wake_stats();
        if pred(&stats.path) {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the wake path stayed {:?}", listener.wake_stats().path);
}

fn pushed(path: &WakePath) -> bool {
    matches!(path, WakePath::Pushed { .. })
}

/// The next notification, within 30 s.
async fn next_payload(listener: &mut Listener) -> String {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), listener.recv()).await {
            Ok(Ok(Event::Notification(n))) => return n.payload,
            Ok(Ok(_)) => {}
            other => panic!("no notification: {other:?}"),
        }
    }
}

/// A notification committed by another process, the `mariadb` client, as `user`.
fn mariadb_notifies(port: &str, table: &str, channel: &str, payload: &str) {
    let insert = format!(
        "INSERT INTO `{table}` (channel, payload, pid, created_at) \
         VALUES ('{channel}', '{payload}', CONNECTION_ID(), UTC_TIMESTAMP(6))"
    );
    let status = Command::new("mariadb")
        .args(["-h", "127.0.0.1", "-P", port, "-u", "root", "test", "-e", &insert])
        .stdin(Stdio::null())
        .status()
        .expect("run the mariadb client");
    assert!(status.success(), "the mariadb client's insert failed");
}

/// `Handler_read%` of one connection of the binlog server, from performance_schema.
fn handler_reads(connection: u64) -> u64 {
    let read = sql(&format!(
        "SELECT CAST(COALESCE(SUM(s.VARIABLE_VALUE), 0) AS UNSIGNED) FROM performance_schema.status_by_thread s \
         JOIN performance_schema.threads t ON t.THREAD_ID = s.THREAD_ID \
         WHERE t.PROCESSLIST_ID = {connection} AND s.VARIABLE_NAME LIKE 'Handler_read%'"
    ))
    .expect("read the listener's counters");
    read.parse().unwrap_or_else(|_| panic!("counters: {read:?}"))
}

/// A listener on MariaDB with a binary log is pushed: it reads nothing while idle (its
/// connection's `Handler_read%` and its polls stay put), and a commit of another process
/// reaches it although its poll interval is an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_binlog_pushes_another_process_commit_and_idles_for_free() {
    let server = BinlogServer::hold();
    let (_db, config) = notify_table(BINLOG_URL, HOUR).await;
    server.table(&config.table);
    let mut listener = Listener::connect_with(BINLOG_URL, options(&config)).await.unwrap();
    listener.listen("jobs").await.unwrap();
    let stats = path_becomes(&listener, pushed).await;
    assert_eq!(stats.path, WakePath::Pushed { via: "the binary log" });

    // Idle: the push opened and polled once; from then on, nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let connection = listener.session_id().expect("a session");
    let (reads, polls) = (handler_reads(connection), listener.wake_stats().polls);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(handler_reads(connection), reads, "an idle pushed listener read rows");
    assert_eq!(listener.wake_stats().polls, polls, "an idle pushed listener polled");

    mariadb_notifies("3361", &config.table, "jobs", "from another process");
    assert_eq!(next_payload(&mut listener).await, "from another process");
    let after = listener.wake_stats();
    assert!(after.pushes >= 1 && after.polls > polls, "{after:?}");
    // The notification's rows, a handful of index reads: nothing like a scan.
    assert!(handler_reads(connection) - reads < 20, "the pushed poll read more than its rows");
}

/// Without the privileges the binary log needs, the listener polls, says why in its log
/// and its stats, and still receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_without_the_grants_polls_and_says_so() {
    let logs = logs();
    let server = BinlogServer::hold();
    let (_db, config) = notify_table(BINLOG_URL, Duration::from_millis(50)).await;
    server.table(&config.table);
    let on_table = format!("SELECT, INSERT, DELETE ON test.`{}`", config.table);
    for (grants, needs) in [
        (vec![on_table.as_str()], "BINLOG MONITOR"),
        (vec![on_table.as_str(), "BINLOG MONITOR ON *.*"], "REPLICATION SLAVE"),
    ] {
        let user = unique("nogrant");
        let url = server.user(&user, &grants);
        let mut listener = Listener::connect_with(&url, options(&config)).await.unwrap();
        listener.listen("jobs").await.unwrap();
        let stats = path_becomes(&listener, |p| matches!(p, WakePath::Polling { .. })).await;
        let WakePath::Polling { reason } = &stats.path else { unreachable!() };
        assert!(reason.contains(needs), "{reason}");
        assert!(
            logged(reason).iter().any(|line| line.contains("WARN") && line.contains("no push path")),
            "no log line for {reason:?}"
        );
        mariadb_notifies("3361", &config.table, "jobs", &user);
        assert_eq!(next_payload(&mut listener).await, user);
        assert_eq!(listener.wake_stats().pushes, 0);
    }
    drop(logs);
}

/// On the shared server, which writes no binary log, the listener polls and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_without_a_binary_log_polls_and_says_so() {
    let _logs = logs();
    let guard = crate::common::Cleanup::new(rowbus::Backend::MySql);
    let (_db, config) = notify_table(MARIADB, Duration::from_millis(50)).await;
    guard.notify_table(&config.table);
    let mut listener = Listener::connect_with(MARIADB, options(&config)).await.unwrap();
    listener.listen("jobs").await.unwrap();
    let reason = "the server writes no binary log (log_bin is off)";
    let stats = path_becomes(&listener, |p| matches!(p, WakePath::Polling { .. })).await;
    assert_eq!(stats.path, WakePath::Polling { reason: reason.into() });
    assert!(logged(reason).iter().any(|line| line.contains("no push path")), "no log line");
    mariadb_notifies("3306", &config.table, "jobs", "polled");
    assert_eq!(next_payload(&mut listener).await, "polled");
}

/// A listener whose binary-log connection is killed, and cannot come back for a while
/// (its account locked), receives by polling meanwhile, then is pushed again: with an
/// hour between safety polls, what it receives then came by the push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_lost_push_polls_then_resumes() {
    let server = BinlogServer::hold();
    let (_db, config) = notify_table(BINLOG_URL, Duration::from_millis(100)).await;
    server.table(&config.table);
    let user = unique("pusher");
    let on_table = format!("SELECT, INSERT, DELETE ON test.`{}`", config.table);
    let url = server.user(&user, &[&on_table, "BINLOG MONITOR, REPLICATION SLAVE ON *.*"]);
    let mut listener = Listener::connect_with(&url, options(&config)).await.unwrap();
    listener.listen("jobs").await.unwrap();
    path_becomes(&listener, pushed).await;

    sql(&format!("ALTER USER '{user}'@'%' ACCOUNT LOCK")).unwrap();
    let dump = sql(&format!(
        "SELECT id FROM information_schema.processlist WHERE user = '{user}' AND command LIKE 'Binlog Dump%'"
    ))
    .unwrap();
    assert!(!dump.is_empty(), "no binlog dump thread of the listener");
    sql(&format!("KILL {dump}")).unwrap();
    let stats = path_becomes(&listener, |p| matches!(p, WakePath::Polling { .. })).await;
    assert_eq!(stats.push_losses, 1);
    mariadb_notifies("3361", &config.table, "jobs", "while lost");
    assert_eq!(next_payload(&mut listener).await, "while lost");

    sql(&format!("ALTER USER '{user}'@'%' ACCOUNT UNLOCK")).unwrap();
    let back = path_becomes(&listener, pushed).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    mariadb_notifies("3361", &config.table, "jobs", "pushed again");
    assert_eq!(next_payload(&mut listener).await, "pushed again");
    assert!(listener.wake_stats().pushes > back.pushes);
}

/// `sqlite3`, the system's client: another process committing to `file`.
fn sqlite3_notifies(file: &std::path::Path, table: &str, payload: &str) {
    let insert = format!(
        "PRAGMA busy_timeout = 5000; INSERT INTO \"{table}\" (channel, payload, pid, created_at) \
         VALUES ('jobs', '{payload}', 0, strftime('%Y-%m-%d %H:%M:%f', 'now'));"
    );
    let status = Command::new("/usr/bin/sqlite3")
        .arg(file)
        .arg(&insert)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("run sqlite3");
    assert!(status.success(), "sqlite3's insert failed");
}

/// On SQLite a watch on the files pushes another process's commit although the listener
/// checks `data_version` only every hour; idle, it reads nothing but `data_version`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_watch_pushes_another_process_commit() {
    let file = TempSqlite::new();
    let (_db, config) = notify_table(&file.url, HOUR).await;
    let mut listener = Listener::connect_with(&file.url, options(&config)).await.unwrap();
    listener.listen("jobs").await.unwrap();
    let stats = path_becomes(&listener, pushed).await;
    assert_eq!(stats.path, WakePath::Pushed { via: "a watch on the database's files" });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = listener.wake_stats();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(listener.wake_stats(), idle, "an idle listener did something");

    sqlite3_notifies(file.path(), &config.table, "from sqlite3");
    assert_eq!(next_payload(&mut listener).await, "from sqlite3");
    let after = listener.wake_stats();
    assert!(after.pushes > idle.pushes && after.version_checks > idle.version_checks, "{after:?}");
}

/// Without its push path (turned off), a SQLite listener reads `data_version` every poll
/// interval and the table only when it changed: idle, no poll at all; and it still
/// receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_without_push_reads_only_data_version_while_idle() {
    let file = TempSqlite::new();
    let (_db, config) = notify_table(&file.url, Duration::from_millis(20)).await;
    let mut listener =
        Listener::connect_with(&file.url, ListenerOptions { push: false, ..options(&config) }).await.unwrap();
    listener.listen("jobs").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = listener.wake_stats();
    assert!(matches!(&idle.path, WakePath::Polling { reason } if reason.contains("turned off")), "{idle:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = listener.wake_stats();
    assert_eq!(later.polls, idle.polls, "an idle listener polled");
    assert!(later.version_checks >= idle.version_checks + 10, "{later:?}");
    sqlite3_notifies(file.path(), &config.table, "polled");
    assert_eq!(next_payload(&mut listener).await, "polled");
    assert_eq!(listener.wake_stats().polls, later.polls + 1);
}

/// PostgreSQL's listener says it listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_listens() {
    let listener = Listener::connect(crate::common::PG).await.unwrap();
    assert_eq!(listener.wake_stats().path, WakePath::Listen);
}
