//! Shared by the RabbitMQ and MQTT sink tests: unique names, messages to send, and a TCP
//! proxy in front of a broker that a test stops (the broker looks gone: connections are
//! cut, new ones refused) and starts again.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rowbus_relay::sink::Outgoing;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A name no other test (or test process) uses: the run's tag (`ROWBUS_TEST_RUN`), the
/// process id and a count.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tag: String = std::env::var("ROWBUS_TEST_RUN")
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect::<String>()
        .to_ascii_lowercase();
    format!("{prefix}_{tag}{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A message to send.
pub fn message(
    id: i64,
    group: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    payload: &[u8],
) -> Outgoing {
    Outgoing {
        id,
        group: group.to_owned(),
        key: key.map(str::to_owned),
        headers: headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect(),
        payload: payload.to_vec(),
        attempt: 1,
    }
}

/// `n` messages with ids from `first`, keys `k0`..`k{keys-1}` in turn, a header each and a
/// payload of every byte value after the id (so that no byte is lost or changed).
pub fn batch(first: i64, n: usize, keys: usize) -> Vec<Outgoing> {
    (0..n)
        .map(|i| {
            let id = first + i as i64;
            let key = format!("k{}", i % keys);
            let mut payload = id.to_be_bytes().to_vec();
            payload.extend(0..=255u8);
            message(id, "g", Some(&key), &[("seq", &i.to_string())], &payload)
        })
        .collect()
}

/// Forwards 127.0.0.1:`port` to a broker while running.
pub struct Proxy {
    pub port: u16,
    target: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// A running proxy to `target` on a free port.
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let proxy = Proxy { port, target: target.parse().unwrap(), tasks: Arc::default() };
        proxy.serve(listener);
        proxy
    }

    /// Cuts every connection and refuses new ones (once this returns, the port is closed).
    pub async fn stop(&self) {
        // The accept loop may hand on one more connection while it is being stopped.
        loop {
            let tasks: Vec<_> = self.tasks.lock().unwrap().drain(..).collect();
            if tasks.is_empty() {
                return;
            }
            for task in &tasks {
                task.abort();
            }
            for task in tasks {
                let _ = task.await;
            }
        }
    }

    /// Accepts again, on the same port.
    pub async fn resume(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.expect("bind the proxy again");
        self.serve(listener);
    }

    fn serve(&self, listener: TcpListener) {
        let target = self.target;
        let tasks = Arc::clone(&self.tasks);
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { continue };
                let pipe = tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                tasks.lock().unwrap().push(pipe);
            }
        });
        self.tasks.lock().unwrap().push(accept);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}
