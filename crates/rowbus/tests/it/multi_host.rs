//! Several hosts in one URL on the real PostgreSQL and MariaDB: a first host that refuses
//! connections (127.0.0.1:1) is skipped by pools, the listener (also on reconnect) and a
//! broker's listening connection; a PostgreSQL URL asking for `read-write` refuses a
//! read-only server; a URL whose hosts are all down says why for each; an IPv6 address in
//! brackets connects, alone and in a host list.

use crate::common;

use std::time::Duration;

use common::{Cleanup, MARIADB, PG, cp, env, event_within, next_delivery, notification, unique};
use rowbus::{Broker, BrokerOptions, Db, DbPool, Error, Event, Listener, Message};
use sqlx::{MySql, Postgres};

/// `server`'s URL with a refusing host listed before its own, and `extra` appended.
fn refused_first(server: &str, extra: &str) -> String {
    let (scheme, rest) = server.split_once('@').unwrap();
    format!("{scheme}@127.0.0.1:1,{rest}{extra}")
}

/// The pool, a listener through a killed and reconnected session, and a broker woken by
/// its listening connection, all on a URL whose first host refuses.
async fn first_host_refused<DB: Db>(server: &str, extra: &str) {
    let url = refused_first(server, extra);
    let env = env(Some(&url)).await;

    let ch = unique("multi");
    let mut listener = env.listener().await;
    listener.listen(&ch).await.unwrap();
    env.notify(&ch, "first").await;
    assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "first"));
    let id = listener.session_id().expect("a session id");
    match &env.db {
        DbPool::Postgres(pool) => {
            let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(id as i32)
                .fetch_one(pool)
                .await
                .unwrap();
            assert!(killed);
        }
        DbPool::MySql(pool) => drop(sqlx::query("KILL CONNECTION ?").bind(id).execute(pool).await.unwrap()),
        DbPool::Sqlite(_) => unreachable!(),
    }
    assert!(matches!(
        event_within(&mut listener, Duration::from_secs(10)).await,
        Some(Event::Disconnected(_))
    ));
    // The reconnect goes through the host list again, past the refusing host.
    assert!(matches!(
        event_within(&mut listener, Duration::from_secs(10)).await,
        Some(Event::Reconnected { .. })
    ));
    env.notify(&ch, "after reconnect").await;
    assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "after reconnect"));
    drop(listener);

    let options = BrokerOptions {
        listen_notify: true,
        notify_table: env.config.clone(),
        listen_url: Some(url.clone()),
        ..BrokerOptions::default()
    };
    let here = Broker::new(rowbus::connect::<DB>(&url, 4).await.unwrap(), options.clone()).await.unwrap();
    let there = Broker::new(rowbus::connect::<DB>(&url, 4).await.unwrap(), options).await.unwrap();
    let cleanup = Cleanup::new(DB::BACKEND);
    let queue = here.queue(&cleanup.queue(&unique("multi"))).unwrap();
    queue.deploy().await.unwrap();
    let mut sub = queue.subscribe().poll_interval(Duration::from_secs(60)).stream().await.unwrap();
    there.queue(&queue.table().to_string()).unwrap().publish(Message::text("from afar")).await.unwrap();
    // Within next_delivery's 20 s, not the 60 s poll: woken through the listening connection.
    let d = next_delivery(&mut sub).await;
    assert_eq!(d.text().unwrap(), "from afar");
    d.ack().await.unwrap();
    drop(sub);
    here.shutdown(Duration::from_secs(1)).await;
    there.shutdown(Duration::from_secs(1)).await;
    env.cleanup().await;
}

/// A port on the IPv6 loopback that reaches the server at `127.0.0.1:port`: that port when
/// the server listens on `[::1]` too, otherwise a relay's, which copies each connection's
/// bytes to and from the server's IPv4 port (the test connects over IPv6 either way). The
/// relay ends with the test's runtime.
async fn over_ipv6(port: u16) -> u16 {
    use tokio::net::{TcpListener, TcpStream};
    if TcpStream::connect(("::1", port)).await.is_ok() {
        return port;
    }
    let relay = TcpListener::bind("[::1]:0").await.expect("the IPv6 loopback");
    let local = relay.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = relay.accept().await {
            tokio::spawn(async move {
                let mut server = TcpStream::connect(("127.0.0.1", port)).await?;
                tokio::io::copy_bidirectional(&mut inbound, &mut server).await.map(drop)
            });
        }
    });
    local
}

/// `server`'s URL with its IPv4 host and port replaced by `hosts`.
fn with_hosts(server: &str, hosts: &str) -> String {
    let (user, rest) = server.split_once('@').unwrap();
    let path = &rest[rest.find('/').unwrap()..];
    format!("{user}@{hosts}{path}")
}

/// A pool and a listener on `[::1]` alone, then in a host list before and after an IPv4
/// host (the first one listed refusing, in the last).
async fn ipv6_literal(server: &str, port: u16) {
    let v6 = over_ipv6(port).await;
    for hosts in [
        format!("[::1]:{v6}"),
        format!("[::1]:{v6},127.0.0.1:{port}"),
        format!("127.0.0.1:1,[::1]:{v6}"),
        format!("[::1]:1,[::1]:{v6}"),
    ] {
        let url = with_hosts(server, &hosts);
        // The pool (the notify table's deploy, the notifications) and the listener.
        let env = env(Some(&url)).await;
        let ch = unique("v6");
        let mut listener =
            Listener::connect_with(&url, env.options()).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        listener.listen(&ch).await.unwrap();
        env.notify(&ch, "over IPv6").await;
        assert_eq!(cp(&notification(&mut listener).await), (ch.as_str(), "over IPv6"), "{url}");
        drop(listener);
        env.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ipv6_literal() {
    ipv6_literal(PG, 5432).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_ipv6_literal() {
    ipv6_literal(MARIADB, 3306).await;
}

/// A URL whose every host is down: the pool and the listener fail, naming each host.
async fn all_hosts_down(scheme: &str) {
    let url = format!("{scheme}://u:secret@127.0.0.1:1,127.0.0.1:2/test");
    let pool = DbPool::connect(&url).await.unwrap_err();
    let listener = Listener::connect(&url).await.unwrap_err();
    for e in [pool, listener] {
        assert!(matches!(e, Error::NoHost { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("127.0.0.1:1: ") && text.contains("; 127.0.0.1:2: "), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_first_host_refused() {
    first_host_refused::<Postgres>(PG, "?target_session_attrs=read-write").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_first_host_refused() {
    first_host_refused::<MySql>(MARIADB, "").await;
}

#[tokio::test]
async fn postgres_all_hosts_down() {
    all_hosts_down("postgres").await;
}

#[tokio::test]
async fn mariadb_all_hosts_down() {
    all_hosts_down("mysql").await;
}

/// With `read-write`, a server whose sessions are read-only is no candidate: each host
/// is refused as read-only. The URL gives one set of options for all its hosts, so the
/// same server is listed twice, both read-only; without `read-write` it is taken.
#[tokio::test]
async fn postgres_read_write_refuses_read_only_hosts() {
    let read_only = "postgres://postgres@127.0.0.1:5432,localhost:5432/test\
                     ?options=-c%20default_transaction_read_only%3Don";
    let e = DbPool::connect(&format!("{read_only}&target_session_attrs=read-write")).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::NoHost { .. }), "{e:?}");
    assert_eq!(text.matches("is read-only").count(), 2, "{text}");
    assert!(text.contains("127.0.0.1:5432: ") && text.contains("; localhost:5432: "), "{text}");
    let e = Listener::connect(&format!("{read_only}&target_session_attrs=read-write")).await.unwrap_err();
    assert_eq!(e.to_string().matches("is read-only").count(), 2, "{e}");

    let db =
        DbPool::connect(&format!("{read_only}&target_session_attrs=any")).await.expect("any server will do");
    db.close().await;
}

/// The broker's options, printed for a log, keep the listening URL's password out.
#[test]
fn broker_options_debug_hides_the_listen_url_password() {
    let options =
        BrokerOptions { listen_url: Some("postgres://u:secret@h1,h2/db".into()), ..BrokerOptions::default() };
    let printed = format!("{options:?}");
    assert!(printed.contains("postgres://u:***@h1,h2/db") && !printed.contains("secret"), "{printed}");
}
