//! A relay in front of a database server that passes the server's answers on a few bytes
//! at a time, pools through it, a future polled a few times then dropped, and the check
//! that every connection of a pool came back: for tests of futures dropped part way.

use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::{Database, MySql, Pool, Postgres};

/// How long a test through the relay waits for a connection of its pool: a connection lost
/// to the pool is never given back, so the wait is all such a test takes to fail.
pub const ACQUIRE: Duration = Duration::from_secs(10);

/// A pool of `connections` to the PostgreSQL server at `url` (port 5432), through a relay.
pub async fn postgres(url: &str, connections: u32) -> Pool<Postgres> {
    let url = on_port(url, trickling(5432).await);
    let options = PoolOptions::<Postgres>::new().max_connections(connections).acquire_timeout(ACQUIRE);
    options.connect(&url).await.unwrap()
}

/// A pool of `connections` to the MariaDB server at `url` (port 3306), through a relay.
pub async fn mariadb(url: &str, connections: u32) -> Pool<MySql> {
    let url = on_port(url, trickling(3306).await);
    let options = PoolOptions::<MySql>::new().max_connections(connections).acquire_timeout(ACQUIRE);
    options.connect(&url).await.unwrap()
}

/// Takes every one of the pool's `connections`, each held while the next is taken: all
/// of them, or a connection was lost to the pool.
pub async fn every_connection_back<DB: Database>(pool: &Pool<DB>, connections: u32) {
    let conns = futures::future::join_all((0..connections).map(|_| pool.acquire())).await;
    let lost = conns.iter().filter(|conn| conn.is_err()).count();
    assert_eq!(lost, 0, "{lost} of the pool's {connections} connections never came back");
}

/// A port that reaches the server at `127.0.0.1:port`, its answers passed on a few bytes
/// at a time: a statement's answer then arrives over many reads, and a future dropped
/// part way is met in the middle of one far more often than on the bare server. The relay
/// ends with the test's runtime.
pub async fn trickling(port: u16) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = relay.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = relay.accept().await {
            let server = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            // Each few bytes sent as they are written.
            inbound.set_nodelay(true).unwrap();
            server.set_nodelay(true).unwrap();
            let (mut from_client, mut to_client) = inbound.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut from_client, &mut to_server).await });
            tokio::spawn(async move {
                let mut buf = [0u8; 7];
                loop {
                    match from_server.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if to_client.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                            tokio::task::yield_now().await;
                        }
                    }
                }
            });
        }
    });
    local
}

/// `url` (host 127.0.0.1) with its port replaced by `port`.
pub fn on_port(url: &str, port: u16) -> String {
    let (head, rest) = url.rsplit_once(':').unwrap();
    let path = &rest[rest.find('/').unwrap()..];
    format!("{head}:{port}{path}")
}

/// Polls `future` up to `polls` times, `apart` apart; drops it when it has not finished by
/// then. (The pause blocks the thread: a timer would not wait less than a millisecond.)
pub async fn poll_then_drop<F: std::future::Future>(
    future: F,
    polls: u64,
    apart: Duration,
) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    for _ in 0..polls {
        if let std::task::Poll::Ready(out) = futures::poll!(future.as_mut()) {
            return Some(out);
        }
        std::thread::sleep(apart);
    }
    None
}
