//! Shared by the RabbitMQ and MQTT sink tests: unique names, messages to send, and a TCP
//! proxy in front of a broker that a test stops (the broker looks gone: connections are
//! cut, new ones refused) and starts again, or freezes (the broker looks hung: connections
//! stay open, nothing passes) and thaws.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rowbus_relay::sink::Outgoing;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
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
    frozen: watch::Sender<bool>,
}

impl Proxy {
    /// A running proxy to `target` on a free port.
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let proxy = Proxy {
            port,
            target: target.parse().unwrap(),
            tasks: Arc::default(),
            frozen: watch::Sender::new(false),
        };
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

    /// Stops passing bytes either way, connections left open.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Passes bytes again (what was held back goes on).
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    fn serve(&self, listener: TcpListener) {
        let target = self.target;
        let tasks = Arc::clone(&self.tasks);
        let frozen = self.frozen.subscribe();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                let frozen = frozen.clone();
                let pipe = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else { return };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pass(client_read, server_write, frozen.clone()),
                        pass(server_read, client_write, frozen)
                    );
                });
                tasks.lock().unwrap().push(pipe);
            }
        });
        self.tasks.lock().unwrap().push(accept);
    }
}

/// Copies `from` to `to` while not frozen, until either side closes.
async fn pass(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if frozen.wait_for(|f| !f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

/// Publishes `n` messages to `queue`, numbered 0.. in the header `n`, the payload the
/// number's bytes and every byte value; with `keys`, message i has key `k{i % keys}`.
pub async fn publish_numbered<DB: rowbus::Db>(queue: &rowbus::Queue<DB>, n: usize, keys: Option<usize>) {
    let messages: Vec<rowbus::Message> = (0..n)
        .map(|i| {
            let message = rowbus::Message::new(payload(i)).header("n", i.to_string());
            match keys {
                Some(keys) => message.key(format!("k{}", i % keys)),
                None => message,
            }
        })
        .collect();
    for chunk in messages.chunks(1000) {
        let published = queue.publish_batch(chunk.iter().cloned()).await.expect("publish");
        assert_eq!(published.stored, chunk.len() as u64);
    }
}

/// The payload of message number `i`.
pub fn payload(i: usize) -> Vec<u8> {
    let mut payload = (i as u64).to_be_bytes().to_vec();
    payload.extend(0..=255u8);
    payload
}

/// One message as a broker's receiver saw it: the id it carried, its number (header `n`),
/// its key and its payload.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub id: String,
    pub n: usize,
    pub key: Option<String>,
    pub payload: Vec<u8>,
}

/// Checks `arrivals` against `n` published messages: each number once, each id once and
/// prefixed with `prefix:`, each payload byte for byte, and each key's numbers in order.
pub fn check_arrivals(arrivals: &[Arrival], n: usize, prefix: &str) {
    assert_eq!(arrivals.len(), n, "as many arrived as were published");
    let mut numbers = vec![0u32; n];
    let mut ids = std::collections::HashSet::new();
    let mut last_of_key: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for arrival in arrivals {
        assert!(arrival.n < n, "{arrival:?}");
        numbers[arrival.n] += 1;
        assert!(ids.insert(arrival.id.clone()), "id {} arrived twice", arrival.id);
        assert!(arrival.id.starts_with(&format!("{prefix}:")), "{}", arrival.id);
        assert_eq!(arrival.payload, payload(arrival.n), "payload of {}", arrival.n);
        if let Some(key) = &arrival.key
            && let Some(last) = last_of_key.insert(key, arrival.n)
        {
            assert!(last < arrival.n, "key {key}: {} arrived after {last}", arrival.n);
        }
    }
    let missing: Vec<_> = numbers.iter().enumerate().filter(|(_, c)| **c != 1).map(|(i, _)| i).collect();
    assert!(missing.is_empty(), "not exactly once: {:?}", &missing[..missing.len().min(20)]);
}

/// Checks `arrivals` against `n` published messages when some may have been sent twice:
/// each number at least once, every copy of a number with the same id and payload, no two
/// numbers with one id.
pub fn check_at_least_once(arrivals: &[Arrival], n: usize, prefix: &str) {
    let mut id_of: Vec<Option<&str>> = vec![None; n];
    let mut ids = std::collections::HashMap::new();
    for arrival in arrivals {
        assert!(arrival.n < n, "{arrival:?}");
        assert_eq!(arrival.payload, payload(arrival.n), "payload of {}", arrival.n);
        assert!(arrival.id.starts_with(&format!("{prefix}:")), "{}", arrival.id);
        match id_of[arrival.n] {
            Some(id) => assert_eq!(id, arrival.id, "message {} sent again with another id", arrival.n),
            None => id_of[arrival.n] = Some(&arrival.id),
        }
        let number = *ids.entry(arrival.id.as_str()).or_insert(arrival.n);
        assert_eq!(number, arrival.n, "id {} on two messages", arrival.id);
    }
    let missing: Vec<_> = id_of.iter().enumerate().filter(|(_, id)| id.is_none()).map(|(i, _)| i).collect();
    assert!(missing.is_empty(), "missing: {:?}", &missing[..missing.len().min(20)]);
}

/// A sink that hands batches to `inner` until `after` messages went, then, the batch that
/// reached that number sent, tells `stalled` and never answers: a relay killed after that
/// has sent messages it did not settle, whatever the timing of its claims.
pub struct StallsAfter<S> {
    inner: S,
    after: u64,
    sent: AtomicU64,
    stalled: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl<S: rowbus_relay::sink::Sink> StallsAfter<S> {
    pub fn new(inner: S, after: usize) -> (Self, tokio::sync::oneshot::Receiver<()>) {
        let (stalled, told) = tokio::sync::oneshot::channel();
        let stalled = Mutex::new(Some(stalled));
        (StallsAfter { inner, after: after as u64, sent: AtomicU64::new(0), stalled }, told)
    }
}

impl<S: rowbus_relay::sink::Sink> rowbus_relay::sink::Sink for StallsAfter<S> {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), rowbus_relay::sink::SinkError>> {
        let results = self.inner.send(batch).await;
        let sent = self.sent.fetch_add(batch.len() as u64, Ordering::SeqCst) + batch.len() as u64;
        if sent >= self.after {
            if let Some(stalled) = self.stalled.lock().unwrap().take() {
                let _ = stalled.send(());
            }
            std::future::pending::<()>().await;
        }
        results
    }

    fn system(&self) -> &'static str {
        self.inner.system()
    }
}
