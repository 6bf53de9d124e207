//! Durable listeners against MariaDB, PostgreSQL (durable mode) and a temporary SQLite
//! file: a restart resumes after what was acknowledged, one owner per name, and the
//! cleanup keeps what a durable listener behind has not read.

use crate::common;

use std::time::Duration;

use common::{Env, MARIADB, PG, cp, durable_env_with, env_with, event_within, notification, silence, unique};
use rowbus::durable::Resume;
use rowbus::{DbPool, Error, Event, Listener};
use sqlx::Executor;

/// An environment whose first window (the lookback) ends soon, so that a stored position
/// soon holds only what it read.
async fn env(server: Option<&str>) -> Env {
    durable_env_with(server, |config| config.lookback = Duration::from_secs(1)).await
}

/// `name` quoted as the database quotes identifiers.
fn quoted(env: &Env, name: &str) -> String {
    match env.db {
        DbPool::Postgres(_) => format!("\"{name}\""),
        _ => format!("`{name}`"),
    }
}

/// A listener whose durable name is free again a second after it stops checking in.
async fn listener(env: &Env) -> Listener {
    let options = rowbus::ListenerOptions { durable_lease: Duration::from_secs(1), ..env.options() };
    Listener::connect_with(&env.url, options).await.expect("connect a listener")
}

/// `listen_durable`, retried while the name's previous owner's lease runs out.
/// A new listener takes `name` over on `channel`: it resumes, and everything was
/// acknowledged before, so nothing comes.
async fn resumes_with_nothing_left(env: &Env, channel: &str, name: &str) {
    let mut back = listener(env).await;
    assert_eq!(take_over(&mut back, channel, name).await, Resume::Resumed);
    silence(&mut back, Duration::from_millis(400)).await;
}

async fn take_over(listener: &mut Listener, channel: &str, name: &str) -> Resume {
    for _ in 0..50 {
        match listener.listen_durable(channel, name).await {
            Err(Error::DurableNameTaken { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            other => return other.expect("listen durably"),
        }
    }
    panic!("the durable name {name:?} was not free within 5 s");
}

/// Restarted under the same name, a listener resumes after what it acknowledged: what was
/// committed while none ran arrives, the one delivered and not acknowledged comes again,
/// the acknowledged one does not, a rolled-back one never; a second live owner is refused.
async fn a_restart_resumes_after_what_was_acknowledged(server: Option<&str>) {
    let env = env(server).await;
    let (ch, name) = (unique("dch"), unique("reader"));
    let mut first = listener(&env).await;
    assert_eq!(first.listen_durable(&ch, &name).await.unwrap(), Resume::New);
    env.notify(&ch, "acknowledged").await;
    assert_eq!(cp(&notification(&mut first).await), (ch.as_str(), "acknowledged"));
    first.ack(&ch).await.unwrap();
    env.notify(&ch, "delivered, not acknowledged").await;
    assert_eq!(cp(&notification(&mut first).await), (ch.as_str(), "delivered, not acknowledged"));

    let mut second = listener(&env).await;
    match second.try_listen_durable(&ch, &name).await {
        Err(Error::DurableNameTaken { channel, name: taken, expires_in, .. }) => {
            assert_eq!((channel.as_str(), taken.as_str()), (ch.as_str(), name.as_str()));
            assert!(expires_in <= Duration::from_secs(1), "{expires_in:?}");
        }
        other => panic!("a second live owner was not refused: {other:?}"),
    }
    drop(first); // a crash: no release, the lease runs out
    env.notify(&ch, "while away").await;
    let mut tx = env.begin().await;
    tx.notify(&env.notifier, &ch, "rolled back").await;
    tx.rollback().await;

    let listed = env.db.run(Listed(env.config.clone())).await;
    let mine = listed.iter().find(|d| d.channel == ch && d.name == name).expect("listed");
    assert_eq!(mine.lease, Duration::from_secs(1), "{mine:?}");
    // The crashed owner's name, waited for: taken once its lease has run out.
    assert_eq!(second.listen_durable(&ch, &name).await.unwrap(), Resume::Resumed);
    assert_eq!(cp(&notification(&mut second).await), (ch.as_str(), "delivered, not acknowledged"));
    assert_eq!(cp(&notification(&mut second).await), (ch.as_str(), "while away"));
    silence(&mut second, Duration::from_millis(400)).await;
    second.ack(&ch).await.unwrap();

    let listed = env.db.run(Listed(env.config.clone())).await;
    let mine = listed.iter().find(|d| d.channel == ch && d.name == name).expect("listed");
    assert!(mine.owned && mine.mark.is_some() && mine.lag_rows == 0, "{mine:?}");
    env.notify(&ch, "after").await;
    let _ = notification(&mut second).await;
    let listed = env.db.run(Listed(env.config.clone())).await;
    let mine = listed.iter().find(|d| d.channel == ch && d.name == name).expect("listed");
    assert_eq!(mine.lag_rows, 1, "not acknowledged yet: {mine:?}");

    // Unlisten gives the name up: a new listener takes it at once.
    second.unlisten(&ch).await.unwrap();
    assert!(matches!(second.ack(&ch).await, Err(Error::NotDurable { .. })));
    let mut third = listener(&env).await;
    assert_eq!(third.listen_durable(&ch, &name).await.unwrap(), Resume::Resumed);
    assert_eq!(cp(&notification(&mut third).await), (ch.as_str(), "after"));
    drop((second, third));
    env.cleanup().await;
}

/// Every durable listener, as `rowbus stats` reads them.
struct Listed(rowbus::NotifyConfig);

impl rowbus::OnPool for Listed {
    type Output = Vec<rowbus::durable::DurableListener>;
    async fn run<DB: rowbus::Db>(self, pool: sqlx::Pool<DB>) -> Self::Output {
        rowbus::durable::durable_listeners(&pool, &self.0).await.expect("list durable listeners")
    }
}

/// Another listener's cleanup deletes what is below the durable listener's position (and
/// other channels' rows), but keeps what it has not read, however old; the listener gets
/// it when it comes back.
async fn the_cleanup_keeps_what_a_durable_listener_behind_has_not_read(server: Option<&str>) {
    let env = env(server).await;
    let (ch, other, name) = (unique("dch"), unique("other"), unique("behind"));
    let mut durable = listener(&env).await;
    durable.listen_durable(&ch, &name).await.unwrap();
    // Below the durable listener's position, as the row it reads: the cleanup may go.
    env.notify(&other, "nobody's").await;
    env.notify(&ch, "read").await;
    let _ = notification(&mut durable).await;
    // Past the first window (a lookback), so that the stored position holds only its reads.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    durable.ack(&ch).await.unwrap();
    drop(durable);
    for i in 0..5 {
        env.notify(&ch, &format!("behind {i}")).await;
    }
    // Five minutes old, all of them.
    let age = match &env.db {
        DbPool::MySql(_) => "UTC_TIMESTAMP(6) - INTERVAL 5 MINUTE",
        DbPool::Postgres(_) => "(now() AT TIME ZONE 'UTC') - interval '5 minutes'",
        DbPool::Sqlite(_) => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-300 seconds')",
    };
    exec(&env, format!("UPDATE {} SET created_at = {age}", quoted(&env, &env.config.table))).await;

    let mut options = env.options();
    options.notify_table.retention = Duration::from_secs(120);
    let mut cleaner = Listener::connect_with(&env.url, options).await.unwrap();
    // Durable on a quiet channel (its position stays at the start): it holds its own
    // channel's rows, not the others'.
    cleaner.listen_durable(&unique("quiet"), &unique("cleaner")).await.unwrap();
    for _ in 0..200 {
        if env.count(&other).await == 0 && env.count(&ch).await == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        (env.count(&other).await, env.count(&ch).await),
        (0, 5),
        "cleaned up: the read row, not the rest"
    );
    drop(cleaner);

    let mut back = listener(&env).await;
    assert_eq!(take_over(&mut back, &ch, &name).await, Resume::Resumed);
    for i in 0..5 {
        assert_eq!(cp(&notification(&mut back).await), (ch.as_str(), format!("behind {i}").as_str()));
    }
    assert!(event_within(&mut back, Duration::from_millis(300)).await.is_none());
    drop(back);
    env.cleanup().await;
}

/// A killed connection: the durable channel resumes in-process, and what was acknowledged
/// while it was away is stored once it is back.
async fn a_durable_channel_survives_a_killed_session(server: Option<&str>) {
    let env = env(server).await;
    let (ch, name) = (unique("dch"), unique("killed"));
    let mut durable = listener(&env).await;
    durable.listen_durable(&ch, &name).await.unwrap();
    let id = durable.session_id().expect("a session id");
    match &env.db {
        DbPool::MySql(pool) => drop(sqlx::query("KILL CONNECTION ?").bind(id).execute(pool).await.unwrap()),
        DbPool::Postgres(pool) => {
            let pid = i32::try_from(id).unwrap();
            sqlx::query("SELECT pg_terminate_backend($1)").bind(pid).execute(pool).await.unwrap();
        }
        DbPool::Sqlite(_) => unreachable!("SQLite has no session to kill"),
    }
    env.notify(&ch, "while away").await;
    let mut got = None;
    for _ in 0..3 {
        match event_within(&mut durable, Duration::from_secs(10)).await {
            Some(Event::Notification(n)) => {
                got = Some(n.payload);
                break;
            }
            Some(Event::Reconnected { missed }) => assert!(missed.is_empty(), "{missed:?}"),
            Some(Event::Disconnected(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got.as_deref(), Some("while away"));
    durable.ack(&ch).await.unwrap();
    drop(durable);
    resumes_with_nothing_left(&env, &ch, &name).await;
    env.cleanup().await;
}

/// A stored position older than the retention is a possible gap only when the name was
/// away longer than `durable_live`: while it checked in, the cleanup kept its rows.
async fn a_gap_is_reported_only_when_the_rows_were_not_held(server: Option<&str>) {
    let env = env(server).await;
    let (ch, name) = (unique("gap"), unique("n"));
    let positions = quoted(&env, &format!("{}_positions", env.config.table));
    let mut first = listener(&env).await;
    assert_eq!(first.listen_durable(&ch, &name).await.unwrap(), Resume::New);
    first.unlisten(&ch).await.unwrap();
    drop(first);
    // The stored position, as if its last poll were long ago.
    let stored = env.db.run(Listed(env.config.clone())).await;
    assert!(stored.iter().any(|d| d.name == name));
    let read = sqlx::AssertSqlSafe(format!("SELECT position FROM {positions}"));
    let text: String = match &env.db {
        DbPool::MySql(pool) => sqlx::query_scalar(read).fetch_one(pool).await.unwrap(),
        DbPool::Sqlite(pool) => sqlx::query_scalar(read).fetch_one(pool).await.unwrap(),
        DbPool::Postgres(pool) => sqlx::query_scalar(read).fetch_one(pool).await.unwrap(),
    };
    let mut position: rowbus::notify_table::Position = text.parse().unwrap();
    position.cutoff = "2000-01-01 00:00:00.000000".into();
    exec(&env, format!("UPDATE {positions} SET position = '{position}'")).await;
    let mut back = listener(&env).await;
    assert_eq!(back.listen_durable(&ch, &name).await.unwrap(), Resume::Resumed, "held: checked in just now");
    back.unlisten(&ch).await.unwrap();
    exec(
        &env,
        format!("UPDATE {positions} SET position = '{position}', checked_in = checked_in - 7200000000"),
    )
    .await;
    assert_eq!(
        back.listen_durable(&ch, &name).await.unwrap(),
        Resume::Gap,
        "away two hours, behind the retention"
    );
    drop(back);
    env.cleanup().await;
}

/// A caller that acknowledges after each receive, while a poll's notifications wait for
/// room in the listener's buffer, is answered (the task does not wait for the caller).
async fn acknowledging_while_the_buffer_is_full_goes_on(server: Option<&str>) {
    let env = env(server).await;
    let (ch, name) = (unique("full"), unique("n"));
    let options =
        rowbus::ListenerOptions { buffer: 4, durable_lease: Duration::from_secs(1), ..env.options() };
    let mut durable = Listener::connect_with(&env.url, options).await.unwrap();
    durable.listen_durable(&ch, &name).await.unwrap();
    let mut tx = env.begin().await;
    for i in 0..50 {
        tx.notify(&env.notifier, &ch, &i.to_string()).await;
    }
    tx.commit().await; // one poll's worth, far more than the buffer holds
    for i in 0..50 {
        assert_eq!(cp(&notification(&mut durable).await), (ch.as_str(), i.to_string().as_str()));
        tokio::time::timeout(Duration::from_secs(10), durable.ack(&ch))
            .await
            .expect("an acknowledgement answered while the buffer is full")
            .unwrap();
    }
    drop(durable);
    resumes_with_nothing_left(&env, &ch, &name).await;
    env.cleanup().await;
}

/// `jobs` and `jobs ` are two channels, so two durable names of the same spelling on them
/// are two positions (MySQL's collation would make them one key).
async fn a_trailing_space_makes_another_durable_position(server: Option<&str>) {
    let env = env(server).await;
    let (ch, name) = (unique("pad"), unique("n"));
    let spaced = format!("{ch} ");
    let mut plain = listener(&env).await;
    let mut padded = listener(&env).await;
    assert_eq!(plain.listen_durable(&ch, &name).await.unwrap(), Resume::New);
    assert_eq!(padded.listen_durable(&spaced, &name).await.unwrap(), Resume::New);
    env.notify(&spaced, "spaced").await;
    env.notify(&ch, "plain").await;
    assert_eq!(cp(&notification(&mut plain).await), (ch.as_str(), "plain"));
    assert_eq!(cp(&notification(&mut padded).await), (spaced.as_str(), "spaced"));
    plain.ack(&ch).await.unwrap();
    let listed = env.db.run(Listed(env.config.clone())).await;
    let channels: Vec<&str> = listed.iter().filter(|d| d.name == name).map(|d| d.channel.as_str()).collect();
    assert_eq!(channels, [ch.as_str(), spaced.as_str()]);
    drop((plain, padded));
    env.cleanup().await;
}

/// A durable name's stored position can be forgotten once no process holds it: it is no
/// longer listed, and the name starts afresh.
async fn a_free_name_can_be_forgotten(server: Option<&str>) {
    let env = env(server).await;
    let (ch, name) = (unique("forget"), unique("n"));
    let mut held = listener(&env).await;
    assert_eq!(held.listen_durable(&ch, &name).await.unwrap(), Resume::New);
    let lease = Duration::from_secs(1);
    let refused = env.db.run(Forget(env.config.clone(), ch.clone(), name.clone(), lease)).await;
    assert!(matches!(refused, Err(Error::DurableNameTaken { .. })), "{refused:?}");
    held.unlisten(&ch).await.unwrap();
    let forgot = env.db.run(Forget(env.config.clone(), ch.clone(), name.clone(), lease)).await;
    assert!(forgot.unwrap(), "a free name's position is deleted");
    assert!(!env.db.run(Listed(env.config.clone())).await.iter().any(|d| d.name == name));
    let again = env.db.run(Forget(env.config.clone(), ch.clone(), name.clone(), lease)).await;
    assert!(!again.unwrap(), "nothing left to delete");
    assert_eq!(held.listen_durable(&ch, &name).await.unwrap(), Resume::New);
    drop(held);
    env.cleanup().await;
}

/// An empty durable name, and one longer than the positions table keeps, are refused as
/// names (not as channels) by `listen_durable` and `forget_durable_listener`; 255
/// characters are taken.
async fn a_bad_durable_name_is_refused_as_a_name(server: Option<&str>) {
    let env = env(server).await;
    let ch = unique("badname");
    let mut listener = listener(&env).await;
    let lease = Duration::from_secs(1);
    for (name, reason) in [(String::new(), "empty"), ("n".repeat(300), "300 characters")] {
        let refused = listener.listen_durable(&ch, &name).await;
        let forgot = env.db.run(Forget(env.config.clone(), ch.clone(), name.clone(), lease)).await;
        for e in [refused.unwrap_err(), forgot.unwrap_err()] {
            assert!(matches!(&e, Error::InvalidDurableName { name: n, .. } if *n == name), "{e:?}");
            let text = e.to_string();
            assert!(text.contains("durable listener name") && text.contains(reason), "{text}");
            assert!(!text.contains("channel"), "{text}");
        }
    }
    let longest = format!("{}{}", unique("n"), "é".repeat(200));
    let longest: String = longest.chars().chain(std::iter::repeat('x')).take(255).collect();
    assert_eq!(listener.listen_durable(&ch, &longest).await.unwrap(), Resume::New);
    drop(listener);
    env.cleanup().await;
}

/// [`rowbus::durable::forget_durable_listener`] on any database.
struct Forget(rowbus::NotifyConfig, String, String, Duration);

impl rowbus::OnPool for Forget {
    type Output = Result<bool, Error>;
    async fn run<DB: rowbus::Db>(self, pool: sqlx::Pool<DB>) -> Self::Output {
        rowbus::durable::forget_durable_listener(&pool, &self.0, &self.1, &self.2, self.3).await
    }
}

async fn exec(env: &Env, sql: String) {
    let sql = sqlx::AssertSqlSafe(sql);
    match &env.db {
        DbPool::MySql(pool) => drop(pool.execute(sqlx::query(sql)).await.unwrap()),
        DbPool::Sqlite(pool) => drop(pool.execute(sqlx::query(sql)).await.unwrap()),
        DbPool::Postgres(pool) => drop(pool.execute(sqlx::query(sql)).await.unwrap()),
    }
}

#[tokio::test]
async fn a_lease_shorter_than_three_polls_is_refused() {
    let env = env(None).await;
    let options = rowbus::ListenerOptions { durable_lease: Duration::from_millis(120), ..env.options() };
    let mut listener = Listener::connect_with(&env.url, options).await.unwrap();
    let refused = listener.listen_durable("jobs", "n").await;
    assert!(matches!(refused, Err(Error::DurableLeaseTooShort { .. })), "{refused:?}");
    drop(listener);
    env.cleanup().await;
}

/// On PostgreSQL a durable listener needs the durable deploy, and says so.
#[tokio::test]
async fn postgres_durable_listeners_need_the_durable_deploy() {
    let env = env_with(Some(PG), |_| {}).await;
    let mut listener = env.listener().await;
    let refused = listener.listen_durable("jobs", "x").await;
    let positions = format!("{}_positions", env.config.table);
    assert!(
        matches!(&refused, Err(Error::MissingPositionsTable { table }) if *table == positions),
        "{refused:?}"
    );
    assert!(refused.unwrap_err().to_string().contains("rowbus deploy --durable"));
    drop(listener);
    env.cleanup().await;
}

/// On PostgreSQL a durable notification reaches plain LISTENers too, once, its payload as
/// sent; a plain `pg_notify` on a durable channel reaches its durable listener too, once,
/// as an `Event::Transient` (not acknowledged, not resumed), each kind in order; a durable
/// listener's plain channels are LISTEN's as before.
#[tokio::test]
async fn postgres_durable_and_plain_listeners_share_a_channel() {
    let env = env(Some(PG)).await;
    let (ch, plain_ch, name) = (unique("both"), unique("plain"), unique("n"));
    let mut durable = listener(&env).await;
    assert_eq!(durable.listen_durable(&ch, &name).await.unwrap(), Resume::New);
    durable.listen(&plain_ch).await.unwrap();
    let mut plain = listener(&env).await;
    plain.listen(&ch).await.unwrap();

    let not_durable = rowbus::Notifier::new(env.config.clone()).unwrap();
    let sent = ["plain 1", "durable 1", "plain 2", "durable 2", "plain 3", "durable 3"];
    for payload in sent {
        if payload.starts_with("plain") {
            env.db.notify_with(&not_durable, &ch, payload).await.unwrap();
        } else {
            env.notify(&ch, payload).await;
        }
    }
    env.db.notify_with(&not_durable, &plain_ch, "other channel").await.unwrap();
    for payload in sent {
        assert_eq!(cp(&notification(&mut plain).await), (ch.as_str(), payload));
    }
    let (mut transient, mut kept, mut other) = (Vec::new(), Vec::new(), Vec::new());
    while transient.len() + kept.len() + other.len() < sent.len() + 1 {
        match event_within(&mut durable, Duration::from_secs(10)).await {
            Some(Event::Transient(n)) if n.channel == ch => transient.push(n.payload),
            Some(Event::Notification(n)) if n.channel == ch => kept.push(n.payload),
            Some(Event::Notification(n)) if n.channel == plain_ch => other.push(n.payload),
            event => panic!("unexpected: {event:?}"),
        }
    }
    assert_eq!(transient, ["plain 1", "plain 2", "plain 3"], "plain ones, once each, in order");
    assert_eq!(kept, ["durable 1", "durable 2", "durable 3"], "durable ones, once each, in order");
    assert_eq!(other, ["other channel"]);
    silence(&mut durable, Duration::from_millis(300)).await;
    silence(&mut plain, Duration::from_millis(300)).await;
    assert_eq!(env.count(&ch).await, 3, "a row per durable notification");

    // The durable ones are acknowledged; a restart has nothing to resume, the plain ones
    // included.
    durable.ack(&ch).await.unwrap();
    durable.unlisten(&ch).await.unwrap();
    resumes_with_nothing_left(&env, &ch, &name).await;
    drop((durable, plain));
    env.cleanup().await;
}

macro_rules! on {
    ($scenario:ident: $($db:ident = $server:expr),+) => {
        mod $scenario {
            $(
                #[tokio::test]
                async fn $db() {
                    super::$scenario($server).await;
                }
            )+
        }
    };
}

on!(a_restart_resumes_after_what_was_acknowledged: mariadb = Some(super::MARIADB), postgres = Some(super::PG), sqlite = None);
on!(the_cleanup_keeps_what_a_durable_listener_behind_has_not_read: mariadb = Some(super::MARIADB), postgres = Some(super::PG), sqlite = None);
on!(a_durable_channel_survives_a_killed_session: mariadb = Some(super::MARIADB), postgres = Some(super::PG));
on!(a_trailing_space_makes_another_durable_position: mariadb = Some(super::MARIADB), postgres = Some(super::PG), sqlite = None);
on!(a_gap_is_reported_only_when_the_rows_were_not_held: mariadb = Some(super::MARIADB), postgres = Some(super::PG), sqlite = None);
on!(a_free_name_can_be_forgotten: mariadb = Some(super::MARIADB), postgres = Some(super::PG), sqlite = None);
on!(acknowledging_while_the_buffer_is_full_goes_on: mariadb = Some(super::MARIADB), postgres = Some(super::PG), sqlite = None);
on!(a_bad_durable_name_is_refused_as_a_name: mariadb = Some(super::MARIADB), postgres = Some(super::PG), sqlite = None);
